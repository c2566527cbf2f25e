"""Reproduction study: Olmo 3's two-stage recipe (Stage 1 pre-training,
Stage 2 linear-decay anneal on a higher-quality mix), scaled down, trained
by olmoc (C) and by OLMo-core (repro/olmo_core_train.py: OLMo-core's own Olmo 3
model, SkipStepAdamW, schedulers and data loader) side by side, then compared.

Both implementations start from the same initial weights (made by olmoc and
loaded by both) and each follows OLMo-core's data order with its own loader;
OLMo-core's side checks every batch against the ones olmoc trained on
(--dump-batches).  Each starts Stage 2 from its own Stage 1 weights and
optimizer state (olmoc: --init-from CKPT --with-optimizer-state), with a fresh
schedule and data order, as Olmo 3 did.  OLMo-core runs three times: the second
run differs only in the order of floating-point sums (threads, micro-batch
split), the third only in summing the clipping norm in float64 (as olmoc does)
instead of torch's fp32; their distances from the first are the reference's
own noise, which the report shows next to every olmoc-vs-OLMo-core difference.

    python repro/run_study.py                 # the full study (configs/repro-stage{1,2}.yaml)
    python repro/run_study.py --quick         # a few dozen steps (used by the tests)

Writes OUT/ (default runs/repro): the runs, report.md and the plots.  Exit
status 1 when a comparison fails its threshold (see repro/report.py).
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "repro"))
import report  # noqa: E402

TASKS = "data/repro/mc-reference.jsonl,data/repro/mc-guides.jsonl"
# the reference run, and two that differ from it only in rounding: (b) the order of floating-point sums
# (one thread instead of two, and each batch's gradient summed over micro-batches of half the rows), (c) the
# clipping norm summed in float64 instead of torch's fp32 get_total_norm (olmoc sums it in float64): the
# reference's own noise, next to which the olmoc-vs-OLMo-core differences are reported
OLMO_CORE_RUNS = {"olmo_core": {"threads": 2}, "olmo_core-b": {"threads": 1, "half_micro_batch": True},
                  "olmo_core-c": {"threads": 2, "norm_fp64": True}}


def run(cmd, log):
    t0 = time.time()
    with open(log, "w") as f:
        r = subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    if r.returncode:
        sys.exit(f"run_study: command failed (see {log}): {' '.join(map(str, cmd))}")
    return time.time() - t0


def config_value(path, key):
    return yaml.safe_load(open(path))["train"][key]


def stage_steps(stage, overrides):
    for o in overrides:
        if o.startswith("train.steps="):
            return int(o.split("=", 1)[1])
    return config_value(ROOT / f"configs/repro-stage{stage}.yaml", "steps")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/repro")
    ap.add_argument("--olmoc", default=str(ROOT / "build/olmoc"))
    ap.add_argument("--quick", action="store_true", help="a smaller model, 40 + 15 steps (about a minute)")
    args = ap.parse_args()
    out = (ROOT / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    if not all((ROOT / "data/repro" / f).exists() for f in ("mc-guides.jsonl", "reference.u16", "guides.u16")):
        run([py, ROOT / "repro/build_data.py", "--olmoc", args.olmoc], out / "build_data.log")
    overrides = {1: [], 2: []}
    tasks = TASKS
    if args.quick:
        # a narrower model on shorter sequences, 40 + 15 steps at a third of the learning rate (a short
        # warmup at full rate is unstable, and instability would amplify rounding differences),
        # the first 100 examples of each task
        small = ["--set", "model.d_model=64", "--set", "model.mlp_hidden=256", "--set", "train.seq_len=128",
                 "--set", "model.sliding_window=64", "--set", "train.micro_batch=4", "--set", "train.eval_batches=2"]
        overrides = {1: small + ["--set", "train.steps=40", "--set", "train.warmup_steps=10", "--set", "train.lr=1e-3",
                                 "--set", "train.eval_every=20"],
                     2: small + ["--set", "train.steps=15", "--set", "train.lr=6.9e-4", "--set", "train.eval_every=15"]}
        quick_tasks = []
        for task in TASKS.split(","):
            short = out / pathlib.Path(task).name
            short.write_text("".join(open(ROOT / task).readlines()[:100]))
            quick_tasks.append(str(short))
        tasks = ",".join(quick_tasks)
    init = out / "init.safetensors"
    run([args.olmoc, "train", "configs/repro-stage1.yaml", "--set", "train.steps=0", "--set",
         f"data.out_dir={out / 'c-init'}", "--save", init, *overrides[1]], out / "init.log")
    timings = {}
    c_start = ["--init", init]
    oc_start = {run_name: ["--init", init] for run_name in OLMO_CORE_RUNS}
    for stage in (1, 2):
        c_dir = out / f"c-stage{stage}"
        batches = out / f"stage{stage}.batches"
        for d in [c_dir] + [out / f"{r}-stage{stage}" for r in OLMO_CORE_RUNS]:
            subprocess.run(["rm", "-rf", str(d)], check=True)
        batches.unlink(missing_ok=True)
        print(f"run_study: stage {stage}: olmoc", flush=True)
        # a checkpoint at the last step: Stage 2 starts from it
        save = ["--set", f"train.save_every={stage_steps(stage, overrides[stage])}"]
        timings[f"c-stage{stage}"] = run(
            [args.olmoc, "train", f"configs/repro-stage{stage}.yaml", *c_start, "--dump-batches",
             batches, "--set", f"data.out_dir={c_dir}", *save, *overrides[stage]], out / f"c-stage{stage}.log")
        scores = subprocess.run([args.olmoc, "eval", c_dir / "model.safetensors", "--config", c_dir / "config.yaml",
                                 "--task", tasks, "--json"], capture_output=True, text=True, cwd=ROOT, check=True)
        steps = max(json.loads(l)["step"] for l in open(c_dir / "metrics.jsonl") if '"train"' in l)
        with open(c_dir / "metrics.jsonl", "a") as f:  # end-of-stage downstream results, in the run's log
            for line in scores.stdout.splitlines():
                row = json.loads(line)
                if row.get("type") == "downstream":
                    f.write(json.dumps({**row, "step": steps}) + "\n")
        for run_name, extra in OLMO_CORE_RUNS.items():
            print(f"run_study: stage {stage}: OLMo-core ({run_name})", flush=True)
            o_dir = out / f"{run_name}-stage{stage}"
            micro = [] if not extra.get("half_micro_batch") else \
                ["--micro-batch", str(max(1, config_value(c_dir / 'config.yaml', 'micro_batch') // 2))]
            timings[f"{run_name}-stage{stage}"] = run(
                [py, ROOT / "repro/olmo_core_train.py", c_dir / "config.yaml", *oc_start[run_name],
                 "--check-batches", batches, "--out", o_dir, "--tasks", tasks, "--threads", str(extra["threads"]),
                 *micro, *(["--norm-fp64"] if extra.get("norm_fp64") else [])], out / f"{run_name}-stage{stage}.log")
            oc_start[run_name] = ["--init-from", o_dir]
        ckpt = c_dir / f"step-{steps:06d}"
        if not ckpt.is_dir():
            sys.exit(f"run_study: olmoc wrote no checkpoint {ckpt}")
        c_start = ["--init-from", ckpt, "--with-optimizer-state"]
        batches.unlink()
    ok = report.write_report(out, timings, quick=args.quick)
    print(f"run_study: report in {out / 'report.md'}: {'PASS' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
