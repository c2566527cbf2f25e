"""olmoc generate vs transformers' generate on the same weights: greedy
decoding gives the same tokens (past the sliding window, so the KV cache's
ring buffer is exercised); sampling is seeded and well-formed.  The cached
decoder is also checked against the uncached forward pass at every step in
tests/c/test_train_system.c."""
import json
import os

import pytest
import torch

from test_cli import builds, olmoc
from test_convert import HF_MODEL, make_hf_model

transformers = pytest.importorskip("transformers")
CONTEXT = 1024  # max_position_embeddings of the test models: train.seq_len when olmoc reads them


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory, build_dir):
    tmp = tmp_path_factory.mktemp("gen")
    hf = make_hf_model(HF_MODEL, seed=8)
    hf.config.max_position_embeddings = CONTEXT  # generate stays within the context (no effect on RoPE's values)
    hf.save_pretrained(tmp / "hf")
    r = olmoc(build_dir, "convert", "--from-hf", tmp / "hf", tmp / "olmoc")
    assert r.returncode == 0, r.stderr
    return hf.double().eval(), tmp


def generate(build, src, ids, *args):
    r = olmoc(build, "generate", src, "--ids", ",".join(map(str, ids)), "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["generated"]


@pytest.mark.parametrize("prompt_len", [1, 6, 70])
def test_greedy_matches_transformers(hf_pair, build_dir, prompt_len):
    hf, tmp = hf_pair
    g = torch.Generator().manual_seed(prompt_len)
    prompt = torch.randint(4, HF_MODEL["vocab_size"], (prompt_len,), generator=g).tolist()
    n_new = 24
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n_new,
                          eos_token_id=HF_MODEL["eos_token_id"], pad_token_id=HF_MODEL["pad_token_id"])
    expected = out[0, prompt_len:].tolist()
    for build in builds(build_dir):
        for src in (tmp / "olmoc", tmp / "hf"):  # the converted model, and the Hugging Face directory directly
            got = generate(build, src, prompt, "--max-new-tokens", str(n_new))
            assert got == expected, (str(src), got, expected)
    print(f"\ngreedy, prompt {prompt_len}: {len(expected)} tokens identical to transformers")


def test_sampling(hf_pair, build_dir):
    _, tmp = hf_pair
    src, prompt = tmp / "olmoc", [5, 6, 7]
    a = generate(build_dir, src, prompt, "--temperature", "1.0", "--top-p", "0.9", "--seed", "1",
                 "--max-new-tokens", "40", "--ignore-eos")
    b = generate(build_dir, src, prompt, "--temperature", "1.0", "--top-p", "0.9", "--seed", "1",
                 "--max-new-tokens", "40", "--ignore-eos")
    c = generate(build_dir, src, prompt, "--temperature", "1.0", "--top-p", "0.9", "--seed", "2",
                 "--max-new-tokens", "40", "--ignore-eos")
    assert a == b and a != c and len(a) == 40
    assert all(0 <= t < HF_MODEL["vocab_size"] for t in a)
    greedy = generate(build_dir, src, prompt, "--max-new-tokens", "10", "--ignore-eos")
    assert generate(build_dir, src, prompt, "--temperature", "1e-6", "--max-new-tokens", "10", "--ignore-eos") == greedy
    assert generate(build_dir, src, prompt, "--temperature", "5", "--top-p", "1e-9", "--max-new-tokens", "10",
                    "--ignore-eos") == greedy


def test_generate_errors(hf_pair, build_dir):
    _, tmp = hf_pair
    for build in builds(build_dir):
        for args, message in [(["--ids", "1,x"], "comma-separated token ids"),
                              (["--ids", "1,500"], "outside the vocabulary"),
                              (["--ids", "1", "--top-p", "0"], "--top-p expects"),
                              (["--ids", "1", "--temperature", "-1"], "--temperature expects")]:
            r = olmoc(build, "generate", tmp / "olmoc", *args)
            assert r.returncode != 0 and message in r.stderr, (args, r.stderr)
        r = olmoc(build, "generate", tmp / "nothing", "--ids", "1")
        assert r.returncode == 1 and "does not exist" in r.stderr


# ---- text in and out ----

TEXT_MODEL = dict(HF_MODEL, vocab_size=320, eos_token_id=0, pad_token_id=1)  # the tokenizer's <|endoftext|>, <|pad|>
PROMPTS = ["The naïve café owner said", "日本語のテキスト 😀 and more", "def f(x):\n    return"]


@pytest.fixture(scope="module")
def text_pair(tmp_path_factory, build_dir):
    """A random model over the vocabulary of a small byte-level BPE trained with
    `tokenizers` (258 bytes and specials + merges, so most tokens are single
    bytes and multi-byte characters are split across tokens)."""
    import random

    from tok_util import UNICODE_BITS, train_tokenizer, varied_text

    tmp = tmp_path_factory.mktemp("gentext")
    rng = random.Random(3)
    texts = [varied_text(rng, 200) for _ in range(20)] + UNICODE_BITS * 5
    tok = train_tokenizer(tmp / "tokenizer.json", texts, vocab_size=TEXT_MODEL["vocab_size"])
    assert tok.get_vocab_size() == TEXT_MODEL["vocab_size"] and tok.token_to_id("<|endoftext|>") == 0
    hf = make_hf_model(TEXT_MODEL, seed=5)
    hf.config.max_position_embeddings = CONTEXT
    hf.save_pretrained(tmp / "hf")
    (tmp / "hf" / "tokenizer.json").write_bytes((tmp / "tokenizer.json").read_bytes())
    r = olmoc(build_dir, "convert", "--from-hf", tmp / "hf", tmp / "olmoc")
    assert r.returncode == 0, r.stderr
    return hf.double().eval(), tok, tmp


def hf_generate(hf, prompt, n_new, eos):
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n_new, eos_token_id=eos,
                          pad_token_id=TEXT_MODEL["pad_token_id"])
    return out[0, len(prompt):].tolist()


def olmoc_text(build, *args):
    """olmoc's stdout as exact bytes decoded strictly (no newline translation), and its exit status."""
    import subprocess

    from test_cli import SANITIZER_REPORTS

    env = dict(os.environ)
    env["ASAN_OPTIONS"] = ":".join(filter(None, [env.get("ASAN_OPTIONS", ""), "detect_leaks=1"]))
    r = subprocess.run([str(build / "olmoc"), *map(str, args)], capture_output=True, env=env)
    stderr = r.stderr.decode("utf-8", "replace")
    assert not [x for x in SANITIZER_REPORTS if x in stderr], stderr
    assert r.returncode == 0, stderr
    out = r.stdout.decode("utf-8")
    assert out.endswith("\n")
    return out[:-1]


@pytest.mark.parametrize("which", range(len(PROMPTS)))
def test_text_greedy_matches_transformers(text_pair, build_dir, tmp_path, which):
    """--prompt TEXT: the streamed text equals tokenizers' decode of transformers' greedy tokens,
    with the tokenizer found in the HF directory, given by --tokenizer, or taken from the config."""
    hf, tok, tmp = text_pair
    prompt_text = PROMPTS[which]
    prompt = tok.encode(prompt_text, add_special_tokens=False).ids
    expected_ids = hf_generate(hf, prompt, 40, eos=None)
    expected = tok.decode(expected_ids)
    (tmp_path / "prompt.txt").write_text(prompt_text, encoding="utf-8")
    for build in builds(build_dir):
        runs = {
            "hf dir": olmoc_text(build, "generate", tmp / "hf", "--prompt", prompt_text, "--max-new-tokens", "40",
                            "--ignore-eos"),
            "--tokenizer": olmoc_text(build, "generate", tmp / "olmoc", "--prompt", prompt_text, "--max-new-tokens", "40",
                                 "--ignore-eos", "--tokenizer", tmp / "tokenizer.json"),
            "data.tokenizer": olmoc_text(build, "generate", tmp / "olmoc", "--prompt-file", tmp_path / "prompt.txt",
                                    "--max-new-tokens", "40", "--ignore-eos", "--set",
                                    f"data.tokenizer={tmp / 'tokenizer.json'}"),
        }
        for how, r in runs.items():
            assert r == expected, (how, r, expected)
        r = olmoc(build, "generate", tmp / "hf", "--prompt", prompt_text, "--max-new-tokens", "40", "--ignore-eos",
                  "--json")
        assert r.returncode == 0, r.stderr
        j = json.loads(r.stdout)
        assert j["prompt"] == prompt and j["generated"] == expected_ids and j["text"] == expected
        r = olmoc(build, "generate", tmp / "hf", "--prompt", prompt_text, "--max-new-tokens", "40", "--ignore-eos",
                  "--output", "ids")
        assert r.returncode == 0 and r.stdout.strip() == ",".join(map(str, expected_ids)), r.stderr
    print(f"\nprompt {which}: {len(expected_ids)} tokens, text {expected!r} identical to transformers + tokenizers")


def test_text_stops_at_eos(text_pair, build_dir):
    """Generation stops right after the EOS id (not printed when it is a special token), as transformers' does."""
    hf, tok, tmp = text_pair
    prompt = tok.encode(PROMPTS[0], add_special_tokens=False).ids
    free = hf_generate(hf, prompt, 30, eos=None)
    for eos in (free[6], 0):  # a token the model emits at step 7 (or sooner), and the special <|endoftext|>
        expected_ids = hf_generate(hf, prompt, 30, eos=eos)
        r = olmoc(build_dir, "generate", tmp / "hf", "--prompt", PROMPTS[0], "--max-new-tokens", "30",
                  "--set", f"model.eos_token_id={eos}", "--json")
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)["generated"]
        assert got == expected_ids, (eos, got, expected_ids)
        if eos in free:
            assert got[-1] == eos and len(got) == free.index(eos) + 1
        assert olmoc_text(build_dir, "generate", tmp / "hf", "--prompt", PROMPTS[0], "--max-new-tokens", "30",
                          "--set", f"model.eos_token_id={eos}") == tok.decode(expected_ids)
    print(f"\nEOS {free[6]}: stopped after {free.index(free[6]) + 1} tokens as transformers did")


@pytest.mark.slow
def test_text_streaming(text_pair, build_dir):
    """Sampled bytes (most tokens are single bytes, so characters are split across
    tokens and invalid sequences occur): the streamed text equals tokenizers'
    decode of the same seed's ids; it arrives while generation is still running,
    and no write ends inside a character."""
    import subprocess

    _, tok, tmp = text_pair
    args = ["generate", tmp / "hf", "--prompt", PROMPTS[1], "--temperature", "1.0", "--seed", "7", "--ignore-eos"]
    r = olmoc(build_dir, *args, "--max-new-tokens", "400", "--output", "ids")
    assert r.returncode == 0, r.stderr
    ids = list(map(int, r.stdout.split(",")))
    expected = tok.decode(ids)
    multibyte = [c for c in expected if ord(c) > 0x7F and c != "\ufffd"]
    split = sum(1 for c in multibyte if tok.encode(c, add_special_tokens=False).ids != [tok.token_to_id(
        "".join(chr(b) for b in c.encode()))])  # characters that no single token spells
    assert len(multibyte) >= 3 and "\ufffd" in expected, expected  # the case this test is about happens
    assert olmoc_text(build_dir, *args, "--max-new-tokens", "400") == expected
    # streaming: read the pipe while olmoc runs
    p = subprocess.Popen([str(build_dir / "olmoc"), *map(str, args), "--max-new-tokens", "8000", "--set",
                          "train.seq_len=8192"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    chunks, running_at_first = [], None
    while True:
        b = p.stdout.read1(65536)
        if not b:
            break
        if running_at_first is None:
            running_at_first = p.poll() is None
        chunks.append(b)
    p.wait()
    assert p.returncode == 0, p.stderr.read()
    assert running_at_first, "no output before generation ended"
    for c in chunks:
        c.decode("utf-8")  # strict: a write never ends inside a character
    print(f"\nstreaming: {len(multibyte)} multi-byte characters ({split} split across tokens), "
          f"{expected.count(chr(0xfffd))} U+FFFD, identical to tokenizers; {len(chunks)} reads while running")


def test_text_errors(text_pair, build_dir, tmp_path):
    _, _, tmp = text_pair
    for build in builds(build_dir):
        for src, args, message in [
                (tmp / "olmoc", ["--prompt", "hi"], "needs a tokenizer"),
                (tmp / "olmoc", ["--ids", "5", "--output", "text"], "needs a tokenizer"),
                (tmp / "hf", ["--prompt", "hi", "--ids", "5"], "one of --prompt, --prompt-file and --ids"),
                (tmp / "hf", ["--prompt", "hi", "--output", "bytes"], "--output expects text or ids"),
                (tmp / "hf", ["--prompt", ""], "the prompt is empty"),
                (tmp / "hf", ["--prompt-file", tmp_path / "missing.txt"], "missing.txt"),
                (tmp / "hf", ["--prompt", "hi", "--tokenizer", tmp_path / "none.json"], "none.json"),
                (tmp / "hf", ["--prompt", "hi", "--max-new-tokens", ""], "--max-new-tokens expects")]:
            r = olmoc(build, "generate", src, *args)
            assert r.returncode != 0 and message in r.stderr, (args, r.stderr)
    r = olmoc(build_dir, "generate", "--help")
    assert r.returncode == 0 and "--prompt-file" in r.stdout and "--output" in r.stdout


def test_ids_prompt_output(text_pair, build_dir):
    """--ids prints ids unless --output text (even when the config names a tokenizer); --output text decodes."""
    hf, tok, tmp = text_pair
    prompt = tok.encode(PROMPTS[0], add_special_tokens=False).ids
    expected_ids = hf_generate(hf, prompt, 20, eos=None)
    args = ["generate", tmp / "olmoc", "--ids", ",".join(map(str, prompt)), "--max-new-tokens", "20", "--ignore-eos",
            "--set", f"data.tokenizer={tmp / 'tokenizer.json'}"]
    r = olmoc(build_dir, *args)
    assert r.returncode == 0 and r.stdout.strip() == ",".join(map(str, expected_ids)), r.stderr
    assert olmoc_text(build_dir, *args, "--output", "text") == tok.decode(expected_ids)
