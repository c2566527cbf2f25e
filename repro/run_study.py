"""Reproduction study: Olmo 3's two-stage recipe (Stage 1 pre-training,
Stage 2 linear-decay anneal on a higher-quality mix), scaled down, trained
by olmoc (C) and by PyTorch side by side, then compared.

Both implementations start from the same initial weights (made by olmoc and
loaded by both), train on the same token batches in the same order (olmoc's
data loader, dumped with --dump-batches), and each starts Stage 2 from its own
Stage 1 result, so any difference is numerics.

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

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "repro"))
import report  # noqa: E402

TASKS = "data/repro/mc-reference.jsonl,data/repro/mc-guides.jsonl"


def run(cmd, log):
    t0 = time.time()
    with open(log, "w") as f:
        r = subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    if r.returncode:
        sys.exit(f"run_study: command failed (see {log}): {' '.join(map(str, cmd))}")
    return time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/repro")
    ap.add_argument("--olmoc", default=str(ROOT / "build/olmoc"))
    ap.add_argument("--quick", action="store_true", help="a smaller model, 40 + 15 steps (about a minute)")
    args = ap.parse_args()
    out = (ROOT / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    if not (ROOT / "data/repro/mc-guides.jsonl").exists():
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
    starts = {"c": init, "torch": init}
    for stage in (1, 2):
        c_dir, t_dir = out / f"c-stage{stage}", out / f"torch-stage{stage}"
        batches = out / f"stage{stage}.batches"
        for d in (c_dir, t_dir):
            subprocess.run(["rm", "-rf", str(d)], check=True)
        print(f"run_study: stage {stage}: olmoc", flush=True)
        timings[f"c-stage{stage}"] = run(
            [args.olmoc, "train", f"configs/repro-stage{stage}.yaml", "--init", starts["c"], "--dump-batches",
             batches, "--set", f"data.out_dir={c_dir}", *overrides[stage]], out / f"c-stage{stage}.log")
        scores = subprocess.run([args.olmoc, "eval", c_dir / "model.safetensors", "--config", c_dir / "config.yaml",
                                 "--task", tasks, "--json"], capture_output=True, text=True, cwd=ROOT, check=True)
        steps = max(json.loads(l)["step"] for l in open(c_dir / "metrics.jsonl") if '"train"' in l)
        with open(c_dir / "metrics.jsonl", "a") as f:  # end-of-stage downstream results, in the run's log
            for line in scores.stdout.splitlines():
                row = json.loads(line)
                if row.get("type") == "downstream":
                    f.write(json.dumps({**row, "step": steps}) + "\n")
        print(f"run_study: stage {stage}: PyTorch", flush=True)
        timings[f"torch-stage{stage}"] = run(
            [py, ROOT / "repro/torch_train.py", c_dir / "config.yaml", "--init", starts["torch"], "--batches", batches,
             "--out", t_dir, "--tasks", tasks], out / f"torch-stage{stage}.log")
        starts = {"c": c_dir / "model.safetensors", "torch": t_dir / "model.safetensors"}
        batches.unlink()
    ok = report.write_report(out, timings, quick=args.quick)
    print(f"run_study: report in {out / 'report.md'}: {'PASS' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
