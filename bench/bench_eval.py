#!/usr/bin/env python3
"""Throughput of OLMo-eval task scoring: `olmoc eval --task` against OLMo's own
in-loop path (olmo_eval builds the task, transformers runs the batches,
olmo_eval.ICLMetric scores them) on the same model and the same threads.

    .venv/bin/python bench/bench_eval.py [--task arc_easy_test_rc_5shot] [--docs 100]
        [--model 1m|20m] [--seq-len 1024] [--batch 8] [--threads 2] [--olmoc build/olmoc]

The model is a random Olmo 3 of the size of configs/olmo3-1m-8k.yaml (or -20m)
with the demo tokenizer (assets/tokenizer/demo-8192.json), exported to Hugging
Face format by olmoc convert.  The task's first --docs documents are written to
a temporary oe_eval_tasks/ given to both sides.  Timed, each as a whole:
  - olmoc (KV cache): the `olmoc eval` command (load, tokenize, score): one
    prefill per distinct context, each choice fed after it;
  - olmoc (batched): the same with OLMOC_EVAL_SCORING=batched (every query a
    padded row of the micro-batch);
  - transformers: olmo_eval task construction (tokenization) + the batched
    forward passes in float32 + ICLMetric, as OLMo's DownstreamEvaluator does.
Prints requests per CPU second (user + system time of the olmoc process, of
this process for transformers; with all threads busy it is threads x wall) and
the primary metric of each (they must agree)."""
import argparse
import gzip
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))

MODELS = {
    "1m": dict(vocab_size=8192, d_model=128, n_layers=4, n_heads=4, n_kv_heads=4, mlp_hidden=512),
    "20m": dict(vocab_size=8192, d_model=384, n_layers=12, n_heads=6, n_kv_heads=6, mlp_hidden=1024),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="arc_easy_test_rc_5shot")
    ap.add_argument("--docs", type=int, default=100)
    ap.add_argument("--model", choices=sorted(MODELS), default="1m")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--olmoc", default=str(ROOT / "build" / "olmoc"))
    a = ap.parse_args()

    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    import torch
    import transformers
    from safetensors.torch import save_file

    from olmo_eval import HFTokenizer, ICLMetric
    from olmo_eval import tasks as oe_tasks
    from test_fidelity import BASE_MODEL, random_params, write_config
    from test_olmo_eval import PACKAGE_TASKS, subset_task

    torch.set_num_threads(a.threads)
    tokenizer = ROOT / "assets" / "tokenizer" / "demo-8192.json"
    model = {**BASE_MODEL, **MODELS[a.model], "sliding_window": a.seq_len // 2, "eos_token_id": 0, "pad_token_id": 1}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        write_config(tmp / "model.yaml", model, {"seq_len": a.seq_len, "micro_batch": a.batch})
        save_file(random_params(model, seed=1), str(tmp / "model.safetensors"))
        subprocess.run([a.olmoc, "convert", "--to-hf", tmp / "model.safetensors", tmp / "hf", "--config",
                        tmp / "model.yaml"], check=True, capture_output=True)
        _, kw = oe_tasks.LABEL_TO_TASK_MAP[a.task]
        requests = subset_task(kw["dataset_path"], kw["dataset_name"], tmp / "tasks", a.docs)
        n_req = sum(1 for r in requests if r["doc_id"] < 1000000)
        results = {}
        for name, env in [("olmoc (KV cache)", {}), ("olmoc (batched)", {"OLMOC_EVAL_SCORING": "batched"})]:
            c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            r = subprocess.run([a.olmoc, "eval", tmp / "hf", "--tokenizer", tokenizer, "--tasks-dir", tmp / "tasks",
                                "--task", a.task, "--set", f"train.seq_len={a.seq_len}", "--set",
                                f"train.micro_batch={a.batch}", "--json"], capture_output=True, text=True,
                               env={**os.environ, **env})
            wall = time.perf_counter() - t0
            c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            dt = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
            if r.returncode:
                sys.exit(r.stderr)
            rec = json.loads(r.stdout)
            results[name] = (dt, wall, rec[f"{rec['metric']}_v2"], rec.get("ce_loss_v2"))

        def load(path, name=None, split=None):
            d = tmp / "tasks" / path / name
            reqs = [json.loads(line) for line in gzip.open(d / "requests.jsonl.gz", "rt", encoding="utf-8")]
            return json.loads((d / "config.json").read_text()), reqs

        oe_tasks.load_oe_eval_requests = load
        hf = transformers.AutoModelForCausalLM.from_pretrained(tmp / "hf", dtype=torch.float32,
                                                               attn_implementation="sdpa").eval()
        t0, p0 = time.perf_counter(), time.process_time()
        tok = HFTokenizer(str(tokenizer), pad_token_id=1, eos_token_id=0, bos_token_id=None)
        cls, kw = oe_tasks.LABEL_TO_TASK_MAP[a.task]
        task = cls(tokenizer=tok, model_ctx_len=a.seq_len, **kw)
        metric = ICLMetric(metric_type=task.metric_type)
        for i in range(0, len(task), a.batch):
            batch = task.collate_fn([task[j] for j in range(i, min(i + a.batch, len(task)))])
            with torch.no_grad():
                metric.update(batch, hf(input_ids=batch["input_ids"]).logits)
        wall, dt = time.perf_counter() - t0, time.process_time() - p0
        vals = {k: float(v) for k, v in metric.compute().items()}
        results["transformers + olmo_eval"] = (dt, wall, vals[f"{task.metric_type}_v2"], vals.get("ce_loss_v2"))
    print(f"task {a.task}, {a.docs} documents, {n_req} requests; model {a.model}, seq_len {a.seq_len}, "
          f"batch {a.batch}, {a.threads} threads")
    base = results["transformers + olmo_eval"][0]
    print("  (CPU seconds, user + system: steadier than the wall clock on a shared machine; wall in brackets)")
    for name, (dt, wall, val, ce) in results.items():
        print(f"  {name:26s} {dt:8.2f} CPU s ({wall:7.2f} s)  {n_req / dt:8.1f} requests/CPU s  x{base / dt:5.2f}"
              f"  ({task.metric_type}_v2 {val:.4f}" + (f", ce_loss_v2 {ce:.6f})" if ce is not None else ")"))


if __name__ == "__main__":
    main()
