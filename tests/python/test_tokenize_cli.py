"""`olmoc tokenize` end to end: output equals `tokenizers` + EOS per document
(dolma conventions), for JSONL and text inputs, any thread count, documents
larger than the reader's 1 MiB items, and the bad-input errors."""
import json
import os
import random
import subprocess

import numpy as np
import pytest

from tok_util import train_tokenizer, varied_text

pytest.importorskip("tokenizers")


@pytest.fixture(scope="session")
def tok(tmp_path_factory):
    rng = random.Random(77)
    path = tmp_path_factory.mktemp("cli_tok") / "tokenizer.json"
    t = train_tokenizer(path, [varied_text(rng, 300) for _ in range(200)], vocab_size=2500)
    return path, t


def run(build_dir, *args, ok=True, stdin=None, asan=False):
    exe = build_dir / "olmoc"
    r = subprocess.run([str(exe), "tokenize", *map(str, args)], capture_output=True, text=True, input=stdin)
    if ok and r.returncode != 0:
        raise AssertionError(f"olmoc tokenize failed ({r.returncode}):\n{r.stderr}")
    return r


def expected(t, docs, eos=0, strip=True, split_special=True, bos=None):
    t.encode_special_tokens = split_special
    try:
        out = []
        texts = [d.strip() if strip else d for d in docs]
        for text, e in zip(texts, t.encode_batch(texts, add_special_tokens=False)):
            if text == "":
                continue
            ids = list(e.ids)
            if bos is not None and (not ids or ids[0] != bos):
                ids.insert(0, bos)
            if not ids or ids[-1] != eos:
                ids.append(eos)
            out.extend(ids)
        return np.array(out, dtype=np.int64)
    finally:
        t.encode_special_tokens = False


def write_jsonl(path, docs, extra=None):
    with open(path, "w", encoding="utf-8") as f:
        for i, d in enumerate(docs):
            row = {"id": i, "text": d, "meta": {"n": [1, 2.5e-3, None, True], "s": "x\"y"}}
            if extra:
                row.update(extra)
            f.write(json.dumps(row, ensure_ascii=bool(i % 2)) + "\n")


def varied_docs(seed, n, max_items=300):
    rng = random.Random(seed)
    docs = [varied_text(rng, rng.randint(0, max_items)) for _ in range(n)]
    docs += ["", "   \n\t ", "  padded both sides  ", "<|endoftext|>", "x<|endoftext|>"]
    return docs


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_jsonl_matches_tokenizers(build_dir, tok, tmp_path, threads):
    path, t = tok
    docs = varied_docs(1, 400)
    write_jsonl(tmp_path / "in.jsonl", docs)
    r = run(build_dir, "--tokenizer", path, "-o", tmp_path / "out.npy", "--threads", threads, tmp_path / "in.jsonl")
    got = np.load(tmp_path / "out.npy")
    assert got.dtype == np.uint16
    np.testing.assert_array_equal(got, expected(t, docs))
    assert f"skipped {sum(d.strip() == '' for d in docs)} empty documents" in r.stderr
    assert not (tmp_path / "out.npy.tmp").exists()


def test_jsonl_options(build_dir, tok, tmp_path):
    path, t = tok
    docs = varied_docs(2, 120)
    write_jsonl(tmp_path / "a.jsonl", docs[:60])
    write_jsonl(tmp_path / "b.json", docs[60:])
    ins = [tmp_path / "a.jsonl", tmp_path / "b.json"]
    run(build_dir, "--tokenizer", path, "-o", tmp_path / "raw.u32", "--raw", "--dtype", "uint32", *ins)
    raw = np.fromfile(tmp_path / "raw.u32", dtype=np.uint32)
    np.testing.assert_array_equal(raw, expected(t, docs))
    run(build_dir, "--tokenizer", path, "-o", tmp_path / "p.npy", "--parse-special", "--no-strip", "--eos", "1",
        "--bos", "<|endoftext|>", "--threads", "2", *ins)
    np.testing.assert_array_equal(np.load(tmp_path / "p.npy"),
                                  expected(t, docs, eos=1, strip=False, split_special=False, bos=0))
    # another text field, standard input
    with open(tmp_path / "c.jsonl", "w") as f:
        for d in docs:
            f.write(json.dumps({"body": d, "text": 5}) + "\n")
    run(build_dir, "--tokenizer", path, "-o", tmp_path / "c.npy", "--text-key", "body", "--format", "jsonl", "-",
        stdin=open(tmp_path / "c.jsonl").read())
    np.testing.assert_array_equal(np.load(tmp_path / "c.npy"), expected(t, docs))


def text_docs(text, unit):
    if unit == "file":
        return [text]
    if unit == "line":
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]
    docs, cur = [], []
    for ln in text.split("\n"):
        if ln.strip(" \t\r") == "":
            if cur:
                docs.append("\n".join(cur))
            cur = []
        else:
            cur.append(ln)
    if cur:
        docs.append("\n".join(cur))
    return [d[:-1] if d.endswith("\r") else d for d in docs]


def big_text(seed, n_bytes, newlines=True):
    rng = random.Random(seed)
    parts, size = [], 0
    while size < n_bytes:
        p = varied_text(rng, 200, specials=True)
        if not newlines:
            p = p.replace("\n", " ").replace("\r", " ")
        parts.append(p)
        size += len(p.encode())
        if newlines and rng.random() < 0.3:
            parts.append(rng.choice(["\n\n", "\n \n", "\r\n\r\n", "\n\n\n"]))
    return "".join(parts)


@pytest.mark.slow
@pytest.mark.parametrize("unit", ["file", "paragraph", "line"])
def test_text_formats_and_long_documents(build_dir, tok, tmp_path, unit):
    path, t = tok
    small = big_text(3, 200_000)
    # one document longer than the 1 MiB reader item: streamed in pieces
    long_doc = big_text(4, 1_300_000, newlines=False)
    files = [tmp_path / "small.txt", tmp_path / "long.txt"]
    files[0].write_text(small, encoding="utf-8")
    files[1].write_text(long_doc + "\n\nafter", encoding="utf-8")
    run(build_dir, "--tokenizer", path, "-o", tmp_path / "o.npy", "--docs", unit, "--threads", "2", *files)
    docs = text_docs(small, unit) + text_docs(long_doc + "\n\nafter", unit)
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), expected(t, docs, strip=False))


def test_gzip_input(build_dir, tok, tmp_path):
    import gzip

    path, t = tok
    docs = varied_docs(12, 200)
    write_jsonl(tmp_path / "in.jsonl", docs)
    data = (tmp_path / "in.jsonl").read_bytes()
    (tmp_path / "in.jsonl.gz").write_bytes(gzip.compress(data))
    run(build_dir, "--tokenizer", path, "-o", tmp_path / "o.npy", "--threads", "2", tmp_path / "in.jsonl.gz")
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), expected(t, docs))
    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(data)[:-5000])
    r = run(build_dir, "--tokenizer", path, "-o", tmp_path / "o2.npy", tmp_path / "cut.jsonl.gz", ok=False)
    assert r.returncode == 1 and "cut.jsonl.gz" in r.stderr, r.stderr


def test_invalid_utf8_is_replaced_and_counted(build_dir, tok, tmp_path):
    path, t = tok
    blob = b"caf\xc3 \xff\xfe ok \xe2\x82\n\n\xed\xa0\x80 fin \xf0\x9f\x98"
    (tmp_path / "bad.txt").write_bytes(blob)
    r = run(build_dir, "--tokenizer", path, "-o", tmp_path / "o.npy", "--docs", "paragraph", tmp_path / "bad.txt")
    text = blob.decode("utf-8", "replace")
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), expected(t, text_docs(text, "paragraph"), strip=False))
    assert f"{text.count(chr(0xFFFD))} invalid UTF-8 sequences replaced" in r.stderr


def test_malformed_jsonl_line_names_file_line_and_offset(build_dir, tok, tmp_path):
    path, t = tok
    good = [json.dumps({"text": f"doc {i}"}) for i in range(5)]
    lines = good[:3] + ['{"text": "broken", }'] + good[3:] + ['{"title": "no text"}', '{"text": 12}']
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    offset = sum(len(x) + 1 for x in lines[:3]) + len('{"text": "broken", ')
    r = run(build_dir, "--tokenizer", path, "-o", tmp_path / "o.npy", tmp_path / "in.jsonl", ok=False)
    assert r.returncode == 1
    assert f"in.jsonl:4: malformed JSON at byte offset {offset}" in r.stderr, r.stderr
    assert not (tmp_path / "o.npy").exists() and not (tmp_path / "o.npy.tmp").exists()
    r = run(build_dir, "--tokenizer", path, "-o", tmp_path / "o.npy", "--skip-bad-lines", tmp_path / "in.jsonl")
    assert "3 bad lines" in r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), expected(t, [f"doc {i}" for i in range(5)]))
    # a missing text field is an error too, naming the line
    (tmp_path / "nofield.jsonl").write_text(good[0] + "\n" + '{"title": "no text"}\n')
    r = run(build_dir, "--tokenizer", path, "-o", tmp_path / "o2.npy", tmp_path / "nofield.jsonl", ok=False)
    assert r.returncode == 1 and "nofield.jsonl:2" in r.stderr and "no such field" in r.stderr


@pytest.mark.parametrize("args,message", [
    (["--tokenizer", "{tok}", "-o", "{tmp}/o.npy", "{tmp}/missing.jsonl"], "cannot open input '{tmp}/missing.jsonl'"),
    (["--tokenizer", "{tmp}/none.json", "-o", "{tmp}/o.npy", "{tmp}/x.txt"], "none.json"),
    (["--tokenizer", "{tok}", "-o", "{tmp}/o.npy", "--eos", "<|nope|>", "{tmp}/x.txt"], "<|nope|>"),
    (["--tokenizer", "{tok}", "-o", "{tmp}/o.npy", "--eos", "99999", "{tmp}/x.txt"], "outside the vocabulary"),
    (["--tokenizer", "{tok}", "-o", "{tmp}/nodir/o.npy", "{tmp}/x.txt"], "cannot create"),
    (["--tokenizer", "{tok}", "{tmp}/x.txt"], "-o OUTPUT is required"),
    (["--tokenizer", "{tok}", "-o", "{tmp}/o.npy", "--bogus", "{tmp}/x.txt"], "unknown option '--bogus'"),
])
def test_usage_and_input_errors(build_dir, tok, tmp_path, args, message):
    path, _ = tok
    (tmp_path / "x.txt").write_text("hello")
    fill = {"tok": str(path), "tmp": str(tmp_path)}
    r = run(build_dir, *[a.format(**fill) for a in args], ok=False)
    assert r.returncode != 0
    assert message.format(**fill) in r.stderr, r.stderr


def test_help(build_dir):
    r = run(build_dir, "--help")
    assert "usage: olmoc tokenize" in r.stdout and "--skip-bad-lines" in r.stdout
    top = subprocess.run([str(build_dir / "olmoc"), "--help"], capture_output=True, text=True)
    assert "tokenize" in top.stdout


@pytest.mark.slow
def test_under_sanitizers(tok, tmp_path):
    """The threaded pipeline and the streaming path under ASan + UBSan."""
    asan = os.environ.get("OLMOC_BUILD_ASAN")
    if not asan:
        pytest.skip("OLMOC_BUILD_ASAN not set")
    from pathlib import Path

    path, t = tok
    docs = varied_docs(9, 60, max_items=100)
    write_jsonl(tmp_path / "in.jsonl", docs)
    (tmp_path / "in.jsonl").open("a").write('{"text": oops}\n')
    long_doc = big_text(5, 1_200_000, newlines=False)
    (tmp_path / "long.txt").write_text(long_doc)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1")
    exe = str(Path(asan) / "olmoc")
    r = subprocess.run([exe, "tokenize", "--tokenizer", str(path), "-o", str(tmp_path / "a.npy"), "--threads", "3",
                        "--skip-bad-lines", str(tmp_path / "in.jsonl")], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), expected(t, docs))
    r = subprocess.run([exe, "tokenize", "--tokenizer", str(path), "-o", str(tmp_path / "b.npy"), "--threads", "2",
                        str(tmp_path / "long.txt")], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "b.npy"), expected(t, [long_doc], strip=False))
    r = subprocess.run([exe, "tokenize", "--tokenizer", str(path), "-o", str(tmp_path / "c.npy"), "--threads", "2",
                        str(tmp_path / "in.jsonl")], capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "malformed JSON" in r.stderr and "ERROR: AddressSanitizer" not in r.stderr


def test_output_that_is_an_input_is_refused(build_dir, tok, tmp_path):
    """`-o X X` replaced the input with the output; refused by inode, so a
    hard link, another spelling of the path, the .tmp file or standard input
    count too.  The input is left as it was."""
    path, _ = tok
    src = tmp_path / "in.txt"
    src.write_text("hello world\n")
    os.link(src, tmp_path / "link.txt")
    (tmp_path / "sub").mkdir()
    cases = [
        (["-o", src, src], {}),
        (["-o", tmp_path / "sub" / ".." / "in.txt", tmp_path / "other.txt", src], {}),
        (["-o", tmp_path / "link.txt", src], {}),
        (["-o", tmp_path / "in", tmp_path / "in.tmp"], {}),
        (["-o", src, "-"], {"stdin": src}),
    ]
    (tmp_path / "other.txt").write_text("more text\n")
    os.link(src, tmp_path / "in.tmp")
    exes = [build_dir / "olmoc"]
    if os.environ.get("OLMOC_BUILD_ASAN"):
        exes.append(os.path.join(os.environ["OLMOC_BUILD_ASAN"], "olmoc"))
    for exe in exes:
        for args, kw in cases:
            stdin = open(kw["stdin"]) if "stdin" in kw else None
            r = subprocess.run([str(exe), "tokenize", "--tokenizer", str(path), *map(str, args)],
                               capture_output=True, text=True, stdin=stdin)
            assert r.returncode == 1 and "is the input" in r.stderr, (exe, args, r.stderr)
            assert src.read_text() == "hello world\n"
    # a different file of the same name elsewhere is fine
    run(build_dir, "--tokenizer", path, "-o", tmp_path / "sub" / "in.txt", src)


def run_measured(build_dir, *args, timeout=120):
    """Runs olmoc tokenize in a child Python so that its peak RSS is its own."""
    import sys

    code = ("import resource, subprocess, sys\n"
            "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
            "sys.stderr.write(r.stderr)\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)\n"
            "sys.exit(r.returncode)\n")
    r = subprocess.run([sys.executable, "-c", code, str(build_dir / "olmoc"), "tokenize", *map(str, args)],
                       capture_output=True, text=True, timeout=timeout)
    return r.returncode, int(r.stdout.strip() or 0), r.stderr


def decoded(t, path):
    ids = np.load(path).astype(np.int64)
    ends = np.flatnonzero(ids == 0)  # EOS
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [t.decode(ids[s:e].tolist()) for s, e in zip(starts, ends)]


@pytest.mark.slow
def test_long_word_and_whitespace_run_stay_bounded(build_dir, tok, tmp_path):
    """An 8 MB single word took ~40 bytes of BPE scratch per byte (a 100 MB
    one: 2.8 GB, 30 s); an 11 MB run of spaces exceeded PCRE2's match limit
    ("match limit exceeded", naming no file), and a 3 MB one in a text
    document hung (a streamed piece read its stream after it was freed).
    Now memory stays bounded (pre-tokens over 1 MiB are merged in 1 MiB
    pieces) and all of them encode; the ids still decode to the text."""
    path, t = tok
    word = np.random.default_rng(5).integers(ord("a"), ord("z") + 1, 8_000_000, dtype=np.uint8).tobytes().decode()
    cases = [("word.txt", word), ("word.jsonl", word), ("spaces.txt", "a" + " " * 3_000_000 + "b"),
             ("spaces.jsonl", "a" + " " * 11_000_000 + "b")]
    # the binary's own footprint first (a CUDA build maps cuBLAS: ~230 MB before any text)
    (tmp_path / "tiny.txt").write_text("a b")
    rc, base_mb, err = run_measured(build_dir, "--tokenizer", path, "-o", tmp_path / "tiny.npy", "--quiet",
                                    tmp_path / "tiny.txt")
    assert rc == 0, err
    for name, text in cases:
        inp = tmp_path / name
        inp.write_text(json.dumps({"text": text}) + "\n" if name.endswith(".jsonl") else text)
        out = tmp_path / f"{name}.npy"
        rc, rss_mb, err = run_measured(build_dir, "--tokenizer", path, "-o", out, "--threads", "2", "--quiet", inp,
                                       timeout=60)
        assert rc == 0, f"{name}: {err}"
        # before the 1 MiB pieces the 8 MB word took 150-290 MB over the baseline; now 25-45
        assert rss_mb - base_mb < 100, f"{name}: peak RSS {rss_mb} MB, {rss_mb - base_mb} MB over the baseline"
        assert decoded(t, out) == [text]


@pytest.mark.slow
def test_streamed_document_under_sanitizers(tok, tmp_path):
    """The reader kept attaching pieces to a streamed document whose stream
    the writer had already freed (its only submitted piece was done):
    ASan reported a heap-use-after-free on a 1.5 MB run of spaces."""
    asan = os.environ.get("OLMOC_BUILD_ASAN")
    if not asan:
        pytest.skip("OLMOC_BUILD_ASAN not set")
    from pathlib import Path

    path, t = tok
    text = "a" + " " * 1_500_000 + "b"
    (tmp_path / "spaces.txt").write_text(text)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1")
    r = subprocess.run([str(Path(asan) / "olmoc"), "tokenize", "--tokenizer", str(path), "-o", str(tmp_path / "o.npy"),
                        "--threads", "2", str(tmp_path / "spaces.txt")], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0 and "AddressSanitizer" not in r.stderr, r.stderr[-3000:]
    assert decoded(t, tmp_path / "o.npy") == [text]


@pytest.mark.slow
@pytest.mark.parametrize("char", ["é", "€", "😀"])
def test_text_document_read_across_a_character_boundary(build_dir, tok, tmp_path, char):
    """A text document is read in 1 MiB pieces; a piece that ended inside a
    multi-byte character made it 2-4 U+FFFD ("invalid UTF-8 replaced").  Every
    byte offset of every width across the boundary now gives the tokens of the
    whole text, as tokenizers encodes it."""
    path, t = tok
    width = len(char.encode())
    for shift in range(width):
        text = "a" * shift + char * ((1 << 20) // width + 10)
        inp = tmp_path / f"doc-{shift}.txt"
        inp.write_text(text)
        out = tmp_path / f"doc-{shift}.npy"
        r = subprocess.run([str(build_dir / "olmoc"), "tokenize", "--tokenizer", str(path), "--format", "text",
                            "-o", str(out), "--quiet", str(inp)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert "0 invalid UTF-8 sequences replaced" in r.stderr, f"shift {shift}: {r.stderr}"
        assert np.load(out).tolist()[:-1] == t.encode(text).ids, f"width {width}, shift {shift}"
