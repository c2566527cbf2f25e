#!/usr/bin/env python3
"""Tokens/s and memory of each activation-checkpointing mode (train.activation_checkpointing,
train.block_every) on one config, olmoc train on random tokens, the modes alternated (--repeats) so
that load from other processes hits all of them.

Prints per mode: the median tokens/s over the measured steps (after --warmup), its ratio to none,
the process's peak RSS, and the saved-activation bytes the model reserves per micro-batch (olmoc info's
memory plan, which tests/python/test_memplan.py checks against the measured allocations).

Not part of the test suite.  Example (a few minutes on 2 cores):
  OMP_NUM_THREADS=2 python bench/bench_checkpointing.py --config configs/olmo3-20m.yaml --seq-len 512
"""
import argparse
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from bench_train import read_yaml_model, run_measured  # noqa: E402

MODES = [("none", 1), ("feed_forward", 1), ("block", 2), ("block", 1)]


def plan_saved_mib(args, mode, every):
    """The saved activations of olmoc's memory plan (`olmoc info --ranks 1`, the allocation lists
    olmo_model_reserve uses) for this mode, in MiB."""
    cmd = [str(args.build / "olmoc"), "info", args.config, "--ranks", "1", "--backend", args.backend,
           "--set", f"train.seq_len={args.seq_len}", "--set", f"train.micro_batch={args.micro_batch}",
           "--set", f"train.activation_checkpointing={mode}", "--set", f"train.block_every={every}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    m = re.search(r"saved activations\s+([\d.]+) (KiB|MiB|GiB)", r.stdout)
    if r.returncode or not m:
        raise SystemExit(f"olmoc info failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return float(m.group(1)) * {"KiB": 2**-10, "MiB": 1, "GiB": 2**10}[m.group(2)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/olmo3-20m.yaml")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4, help="measured steps per run")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--build", type=pathlib.Path, default=ROOT.parent / "build")
    args = ap.parse_args()
    model = read_yaml_model(args.config)
    T, B = args.seq_len, args.micro_batch
    steps = args.steps + args.warmup
    results = {m: [] for m in MODES}
    rss = {m: 0.0 for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        tokens = tmp / "tokens.npy"
        rng = np.random.default_rng(0)
        np.save(tokens, rng.integers(2, model["vocab_size"], size=steps * B * T + 1, dtype=np.uint16))
        for rep in range(args.repeats):
            for mode, every in MODES:
                out = tmp / f"{mode}{every}-{rep}"
                cmd = [str(args.build / "olmoc"), "train", args.config, "--backend", args.backend,
                       "--set", f"train.seq_len={T}", "--set", f"train.micro_batch={B}", "--set", "train.grad_accum=1",
                       "--set", f"train.steps={steps}", "--set", "train.warmup_steps=1", "--set", "train.log_every=1",
                       "--set", "train.save_every=0", "--set", "train.eval_every=0", "--set", "train.peak_flops=1e12",
                       "--set", f"train.activation_checkpointing={mode}", "--set", f"train.block_every={every}",
                       "--set", f"data.train_path={tokens}", "--set", f"data.out_dir={out}"]
                rc, stdout, stderr, peak = run_measured(cmd, dict(os.environ))
                if rc:
                    raise SystemExit(f"olmoc failed ({rc}):\n{stdout}\n{stderr}")
                tok_s = [float(x) for x in re.findall(r"\| (\d+) tok/s \|", stdout)]
                results[(mode, every)] += tok_s[args.warmup:]
                rss[(mode, every)] = max(rss[(mode, every)], peak)
    base = statistics.median(results[("none", 1)])
    print(f"{args.config}, seq_len {T}, micro_batch {B}, backend {args.backend}, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', '(unset)')}, {args.repeats} x {args.steps} steps per mode, load "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'mode':<16} {'tok/s':>8} {'vs none':>8} {'peak RSS MiB':>13} {'saved acts MiB':>15}")
    for mode, every in MODES:
        med = statistics.median(results[(mode, every)])
        name = mode if mode == "none" else f"{mode}/{every}"
        print(f"{name:<16} {med:8.0f} {med / base:8.2f} {rss[(mode, every)]:13.0f} "
              f"{plan_saved_mib(args, mode, every):15.1f}")


if __name__ == "__main__":
    main()
