"""Builds an olmoc multiple-choice task file (pre-tokenized JSONL, read by
`olmoc eval --task` and `data.eval_tasks`) from a text task file, with a
Hugging Face tokenizer.json (Python `tokenizers`).

Input: JSONL, one example per line:
    {"context": "The capital of France is", "choices": [" Paris", " Rome"], "label": 0}
Output: JSONL, one example per line:
    {"context": [ids], "choices": [[ids], [ids]], "label": 0}

Context and each choice are tokenized separately (as OLMo's in-loop
evaluators do), without special tokens, so a choice's leading space belongs to
the choice.  Usage:

    python scripts/make_mc_task.py --tokenizer tokenizer.json --input task.txt.jsonl --output task.jsonl
"""
import argparse
import json
import sys

from tokenizers import Tokenizer


def convert(tok, lines, source):
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            ex = json.loads(line)
        except json.JSONDecodeError as e:
            raise SystemExit(f"{source}:{n}: not JSON: {e}")
        ctx, choices, label = ex.get("context"), ex.get("choices"), ex.get("label")
        if not isinstance(ctx, str) or not isinstance(choices, list) or len(choices) < 2 or \
                not all(isinstance(c, str) for c in choices):
            raise SystemExit(f"{source}:{n}: needs a text 'context' and a list of at least two text 'choices'")
        if not isinstance(label, int) or not 0 <= label < len(choices):
            raise SystemExit(f"{source}:{n}: 'label' must be an index into 'choices'")
        ids = tok.encode(ctx, add_special_tokens=False).ids
        cids = [tok.encode(c, add_special_tokens=False).ids for c in choices]
        if not ids or not all(cids):
            raise SystemExit(f"{source}:{n}: context and choices must each give at least one token")
        out.append({"context": ids, "choices": cids, "label": label})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True, help="tokenizer.json")
    ap.add_argument("--input", required=True, help="text task (JSONL)")
    ap.add_argument("--output", required=True, help="token-id task (JSONL) for olmoc")
    args = ap.parse_args()
    tok = Tokenizer.from_file(args.tokenizer)
    with open(args.input) as f:
        examples = convert(tok, f.readlines(), args.input)
    with open(args.output, "w") as f:
        for ex in examples:
            f.write(json.dumps(ex) + "\n")
    print(f"make_mc_task: {len(examples)} examples -> {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
