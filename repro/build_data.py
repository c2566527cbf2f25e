"""Builds the data of the reproduction study from the demo corpus
(data/demo/corpus.jsonl, made by scripts/make_demo_data.py: the Python
documentation that Debian ships in python3-doc).

Two sources, standing in for Olmo 3's two stages:
  reference  the API reference, C API, what's-new and language reference
             pages: broad, dense "pre-training" text (Stage 1's bulk);
  guides     tutorial, how-to and FAQ pages: curated instructional text,
             the "higher-quality" data that Stage 2 up-weights (as Olmo 3's
             Dolmino mix does with QA/instruction/math data).
Held out (sorted by path): every 10th reference document, every 4th guide
(the guides are few, and their held-out set must not be tiny).

Writes to --out (default data/repro):
  {reference,guides}.npy          training token files (olmoc tokenize)
  {reference,guides}.u16          the same tokens as raw uint16 memmaps (what
                                  OLMo-core's NumpyFSLDataset reads; the study trains on these)
  val-{reference,guides}.npy      held-out token files
  mc-{reference,guides}.jsonl     multiple-choice tasks from held-out documents:
      a sentence's beginning as context, its true ending against the endings
      of three other held-out sentences (4 choices, chance = 25%)
"""
import argparse
import json
import pathlib
import random
import re
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from make_mc_task import convert  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

GUIDES = ("tutorial/", "howto/", "faq/")


def sentences(text):
    """Prose sentences of 10-40 words: inline markup reduced to its text,
    directive, code, list and heading paragraphs dropped."""
    prose = []
    for para in re.split(r"\n\s*\n", text):
        lines = [l.strip() for l in para.splitlines()]
        if not lines or any(l.startswith((".. ", ":", "*", "-", "=", ">>>", "|", "#")) or l.endswith("::")
                            for l in lines):
            continue
        para = re.sub(r":[\w:]+:`~?([^`<]*?)(?:\s*<[^`]*>)?`", r"\1", " ".join(lines))  # :func:`x` -> x
        para = para.replace("``", "").replace("*", "")
        if any(ch in para for ch in "`|<>{}[]\\"):
            continue
        lines = [para]
        for s in re.split(r"(?<=[.!?])\s+", " ".join(lines)):
            words = s.split()
            if 10 <= len(words) <= 40 and s[0].isupper() and s.endswith("."):
                prose.append(words)
    return prose


def mc_examples(docs, n, rng):
    pool = [s for d in docs for s in sentences(d["text"])]
    rng.shuffle(pool)
    pool = pool[: n * 4]
    out = []
    for i in range(0, len(pool) - 3, 4):
        group = pool[i: i + 4]
        cut = [max(4, int(len(w) * 0.6)) for w in group]
        context = " ".join(group[0][: cut[0]])
        endings = [" " + " ".join(w[c:]) for w, c in zip(group, cut)]
        order = list(range(4))
        rng.shuffle(order)
        out.append({"context": context, "choices": [endings[k] for k in order], "label": order.index(0)})
    return out[:n]


def tokenize(olmoc, tokenizer, docs, path):
    jsonl = path.with_suffix(".jsonl")
    jsonl.write_text("".join(json.dumps({"text": d["text"]}) + "\n" for d in docs))
    subprocess.run([str(olmoc), "tokenize", "--tokenizer", str(tokenizer), "-o", str(path), str(jsonl)],
                   check=True, capture_output=True)
    jsonl.unlink()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=str(ROOT / "data/demo/corpus.jsonl"))
    ap.add_argument("--tokenizer", default=str(ROOT / "assets/tokenizer/demo-8192.json"))
    ap.add_argument("--olmoc", default=str(ROOT / "build/olmoc"))
    ap.add_argument("--out", default=str(ROOT / "data/repro"))
    ap.add_argument("--mc-examples", type=int, default=200, help="examples per task")
    ap.add_argument("--max-docs", type=int, default=0, help="use only the first N documents of each source (tests)")
    args = ap.parse_args()
    docs = sorted((json.loads(l) for l in open(args.corpus)), key=lambda d: d["id"])
    sources = {"reference": [d for d in docs if not d["id"].startswith(GUIDES)],
               "guides": [d for d in docs if d["id"].startswith(GUIDES)]}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.from_file(args.tokenizer)
    for name, group in sources.items():
        if args.max_docs:
            group = group[: args.max_docs]
        every = 10 if name == "reference" else 4
        train = [d for i, d in enumerate(group) if i % every != every - 1]
        held = [d for i, d in enumerate(group) if i % every == every - 1]
        tokenize(args.olmoc, args.tokenizer, train, out / f"{name}.npy")
        tokenize(args.olmoc, args.tokenizer, held, out / f"val-{name}.npy")
        np.load(out / f"{name}.npy").astype(np.uint16).tofile(out / f"{name}.u16")
        examples = mc_examples(held, args.mc_examples, random.Random(f"mc-{name}"))
        lines = [json.dumps(e) for e in examples]
        task = convert(tok, lines, f"mc-{name}")
        (out / f"mc-{name}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in task))
        print(f"build_data: {name}: {len(train)} train / {len(held)} held-out documents, "
              f"{len(task)} multiple-choice examples", file=sys.stderr)


if __name__ == "__main__":
    main()
