#!/usr/bin/env python3
"""Throughput of `olmoc tokenize` against Hugging Face `tokenizers` batch
encoding: same JSONL input, same tokenizer, same number of threads.

    .venv/bin/python bench/bench_tokenize.py [--input docs.jsonl] [--tokenizer tokenizer.json]
                                             [--threads N] [--repeats 3] [--olmoc build/olmoc]

Without --input it uses data/demo/corpus.jsonl (scripts/make_demo_data.py)
or, failing that, generated text.  Without --tokenizer it uses
data/demo/tokenizer.json, or trains one (vocab 8192) on the input.

olmoc's time is the whole command (read + parse JSON + tokenize + write the
.npy); tokenizers' time is encode_batch alone on texts already in memory.
Both produce the same ids (checked).  Prints tokens/s, MB/s, CPU seconds
(the wall clock on a shared machine is noisy; CPU time is steadier) and
the ratio olmoc / tokenizers.
"""
import argparse
import json
import os
import pathlib
import random
import resource
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input")
    p.add_argument("--tokenizer")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--olmoc", default=str(ROOT / "build" / "olmoc"))
    return p.parse_args()


args = parse_args()
# tokenizers sizes its rayon pool from this; it must be set before the import
os.environ["RAYON_NUM_THREADS"] = str(args.threads)
os.environ["TOKENIZERS_PARALLELISM"] = "true"
sys.path.insert(0, str(ROOT / "tests" / "python"))
import numpy as np  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from tok_util import train_tokenizer, varied_text  # noqa: E402


def main():
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench_tokenize_"))
    inp = pathlib.Path(args.input) if args.input else ROOT / "data" / "demo" / "corpus.jsonl"
    if not inp.exists():
        rng = random.Random(0)
        inp = tmp / "generated.jsonl"
        with open(inp, "w") as f:
            for _ in range(3000):
                f.write(json.dumps({"text": varied_text(rng, 600, specials=False)}) + "\n")
    texts = [json.loads(line)["text"].strip() for line in open(inp, encoding="utf-8") if line.strip()]
    texts = [t for t in texts if t]
    n_bytes = sum(len(t.encode()) for t in texts)
    tok_path = pathlib.Path(args.tokenizer) if args.tokenizer else ROOT / "data" / "demo" / "tokenizer.json"
    if not tok_path.exists():
        tok_path = tmp / "tokenizer.json"
        train_tokenizer(tok_path, texts, vocab_size=8192)
    tok = Tokenizer.from_file(str(tok_path))
    tok.encode_special_tokens = True  # what olmoc tokenize does by default
    eos = tok.token_to_id("<|endoftext|>")
    print(f"input {inp} ({len(texts)} documents, {n_bytes / 1e6:.1f} MB), tokenizer {tok_path} "
          f"(vocab {tok.get_vocab_size()}), {args.threads} threads")

    # olmoc
    out = tmp / "out.npy"
    cmd = [args.olmoc, "tokenize", "--quiet", "--tokenizer", str(tok_path), "-o", str(out), "--threads",
           str(args.threads), str(inp)]
    best_o, cpu_o = float("inf"), float("inf")
    for _ in range(args.repeats):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True)
        dt = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        best_o = min(best_o, dt)
        cpu_o = min(cpu_o, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime))
    got = np.load(out)

    # tokenizers
    best_t, cpu_t = float("inf"), float("inf")
    for _ in range(args.repeats):
        c0 = time.process_time()
        t0 = time.perf_counter()
        enc = tok.encode_batch(texts, add_special_tokens=False)
        dt = time.perf_counter() - t0
        best_t = min(best_t, dt)
        cpu_t = min(cpu_t, time.process_time() - c0)
    ref = []
    for e in enc:
        ids = e.ids
        ref.extend(ids if ids and ids[-1] == eos else ids + [eos])
    n_tok = len(ref)
    same = len(got) == n_tok and bool((got == np.asarray(ref, dtype=got.dtype)).all())

    print(f"olmoc tokenize:        {n_tok / best_o / 1e6:7.2f} M tokens/s  {n_bytes / best_o / 1e6:7.2f} MB/s  "
          f"wall {best_o:.2f}s  cpu {cpu_o:.2f}s (whole command)")
    print(f"tokenizers batch:      {n_tok / best_t / 1e6:7.2f} M tokens/s  {n_bytes / best_t / 1e6:7.2f} MB/s  "
          f"wall {best_t:.2f}s  cpu {cpu_t:.2f}s (encode_batch only)")
    print(f"ratio olmoc/tokenizers: {best_t / best_o:.2f}x by wall clock, {cpu_t / cpu_o:.2f}x by CPU time "
          f"(goal: >= 0.5x); identical ids: {same} ({n_tok} tokens)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
