"""Compares the olmoc and PyTorch runs of the reproduction study and writes
report.md with plots.

Pass/fail thresholds, fixed before any run (both runs see the same weights
and batches, so only floating-point differences separate them; batch-to-batch
noise of the training loss is several percent at this scale):
  - training loss, every step: |C - PyTorch| / PyTorch <= 1%
  - held-out loss, every set at every evaluation: relative difference <= 0.5%
  - downstream accuracy at the end of each stage: |C - PyTorch| <= 2 points
"""
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TRAIN_TOL, VAL_TOL, ACC_TOL = 0.01, 0.005, 0.02


def load(path):
    rows = [json.loads(l) for l in open(path)]
    train = {r["step"]: r for r in rows if r["type"] == "train"}
    val = {(r["step"], r["set"]): r["loss"] for r in rows if r["type"] == "eval"}
    mc = {r["task"]: r for r in rows if r["type"] == "downstream"}
    return train, val, mc


def write_report(out, timings, quick=False):
    out = pathlib.Path(out)
    lines = ["# Reproduction study: olmoc vs PyTorch", "",
             "Olmo 3's two-stage recipe scaled down (`configs/repro-stage1.yaml`, `configs/repro-stage2.yaml`), "
             "trained by olmoc (C) and by PyTorch (`repro/torch_train.py`, model `tests/python/olmo3_ref.py`) from "
             "the same initial weights on the same batches; see `repro/run_study.py`." +
             (" **Quick variant** (few steps)." if quick else ""), "",
             f"Thresholds (fixed up front): training loss per step within {TRAIN_TOL:.0%} relative; held-out loss "
             f"within {VAL_TOL:.1%} relative at every evaluation; downstream accuracy within "
             f"{ACC_TOL * 100:.0f} points at the end of each stage.", ""]
    ok = True
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    offset = 0
    summary = []
    for stage in (1, 2):
        c_train, c_val, c_mc = load(out / f"c-stage{stage}" / "metrics.jsonl")
        t_train, t_val, t_mc = load(out / f"torch-stage{stage}" / "metrics.jsonl")
        steps = sorted(c_train)
        assert steps == sorted(t_train), f"stage {stage}: the runs logged different steps"
        diffs = [abs(c_train[s]["loss"] - t_train[s]["loss"]) / t_train[s]["loss"] for s in steps]
        worst = max(diffs)
        train_ok = worst <= TRAIN_TOL
        axes[0].plot([s + offset for s in steps], [c_train[s]["loss"] for s in steps], label=f"olmoc stage {stage}",
                     lw=1.2)
        axes[0].plot([s + offset for s in steps], [t_train[s]["loss"] for s in steps], "--",
                     label=f"PyTorch stage {stage}", lw=1.2)
        lines += [f"## Stage {stage} ({len(steps)} steps)", "",
                  f"Wall time: olmoc {timings.get(f'c-stage{stage}', 0):.0f} s, PyTorch "
                  f"{timings.get(f'torch-stage{stage}', 0):.0f} s (2 cores; PyTorch also runs evaluations).", "",
                  f"Training loss: first {c_train[steps[0]]['loss']:.4f}, last olmoc {c_train[steps[-1]]['loss']:.4f} /"
                  f" PyTorch {t_train[steps[-1]]['loss']:.4f}; worst per-step relative difference {worst:.2e} "
                  f"(step {steps[diffs.index(worst)]}) — **{'pass' if train_ok else 'FAIL'}**", "",
                  "| step | held-out set | olmoc | PyTorch | relative difference | |", "|---|---|---|---|---|---|"]
        ok &= train_ok
        for (step, name) in sorted(c_val):
            c, t = c_val[(step, name)], t_val.get((step, name))
            if t is None:
                lines.append(f"| {step} | {name} | {c:.5f} | missing | | **FAIL** |")
                ok = False
                continue
            d = abs(c - t) / t
            ok &= d <= VAL_TOL
            lines.append(f"| {step} | {name} | {c:.5f} | {t:.5f} | {d:.2e} | {'pass' if d <= VAL_TOL else '**FAIL**'} |")
        sets = sorted({n for _, n in c_val})
        for name in sets:
            pts = sorted(s for s, n in c_val if n == name)
            axes[1].plot([s + offset for s in pts], [c_val[(s, name)] for s in pts], "o-", ms=3,
                         label=f"olmoc {name}" if stage == 1 else None)
            axes[1].plot([s + offset for s in pts], [t_val[(s, name)] for s in pts], "x--", ms=5,
                         label=f"PyTorch {name}" if stage == 1 else None)
        lines += ["", "| downstream task (end of stage) | olmoc acc | PyTorch acc | difference | olmoc acc_per_token |"
                  " PyTorch acc_per_token | |", "|---|---|---|---|---|---|---|"]
        for task in sorted(c_mc):
            c, t = c_mc[task], t_mc.get(task)
            if t is None:
                lines.append(f"| {task} | {c['acc']:.3f} | missing | | | | **FAIL** |")
                ok = False
                continue
            d = abs(c["acc"] - t["acc"])
            ok &= d <= ACC_TOL
            lines.append(f"| {task} ({c['n']} examples, chance 0.25) | {c['acc']:.3f} | {t['acc']:.3f} | {d * 100:.1f} "
                         f"points | {c['acc_per_token']:.3f} | {t['acc_per_token']:.3f} | "
                         f"{'pass' if d <= ACC_TOL else '**FAIL**'} |")
            summary.append((stage, task, c["acc"], t["acc"]))
        lines.append("")
        offset += steps[-1]
        axes[0].axvline(offset, color="gray", lw=0.8, ls=":")
        axes[1].axvline(offset, color="gray", lw=0.8, ls=":")
    axes[0].set(title="Training loss (Stage 1 | Stage 2)", xlabel="step", ylabel="cross-entropy")
    axes[1].set(title="Held-out loss", xlabel="step", ylabel="cross-entropy")
    for a in axes:
        a.legend(fontsize=7)
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)
    lines[6:6] = [f"**Overall: {'PASS' if ok else 'FAIL'}**", "", "![curves](curves.png)", ""]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return ok
