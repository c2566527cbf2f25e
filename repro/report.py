"""Compares the olmoc and OLMo-core runs of the reproduction study and writes
report.md with plots.

Every olmoc-vs-OLMo-core difference is shown next to the differences between
OLMo-core and two more OLMo-core runs that differ from it only in rounding
(the reference's own noise; see repro/run_study.py): (b) the order of
floating-point sums (threads, micro-batch split), (c) the clipping norm summed
in float64 instead of fp32.  The ratio is to the larger of the two, so the
reader sees whether olmoc is within the reference's noise; olmoc's distance
from (c), which sums the norm as olmoc does, is reported too.

Pass/fail thresholds on olmoc vs OLMo-core, fixed before any run (both runs
see the same weights and batches, so only floating-point differences separate
them; batch-to-batch noise of the training loss is several percent at this
scale):
  - training loss, every step: |C - OLMo-core| / OLMo-core <= 1%
  - held-out loss, every set at every evaluation: relative difference <= 0.5%
  - downstream accuracy at the end of each stage: |C - OLMo-core| <= 2 points
"""
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TRAIN_TOL, VAL_TOL, ACC_TOL = 0.01, 0.005, 0.02
REF = "olmo_core"  # run directories {name}-stage{1,2}
# the noise runs: (directory, label, what differs from the reference run)
NOISES = (("olmo_core-b", "OLMo-core (b)", "1 thread instead of 2, micro-batches of half the rows"),
          ("olmo_core-c", "OLMo-core (c)", "the clipping norm summed in float64 instead of torch's fp32 "
           "get_total_norm"))


def load(path):
    rows = [json.loads(l) for l in open(path)]
    train = {r["step"]: r for r in rows if r["type"] == "train"}
    val = {(r["step"], r["set"]): r["loss"] for r in rows if r["type"] == "eval"}
    mc = {r["task"]: r for r in rows if r["type"] == "downstream"}
    return train, val, mc


def ratio(d, noise):
    if noise == 0:
        return "= 0 (noise 0)" if d == 0 else "noise is 0"
    return f"{d / noise:.2g}x"


def rel(a, b):
    return abs(a - b) / abs(b)


def fmt_row(label, values, diffs, unit, verdict=""):
    """A table row: the runs' values, olmoc's and each noise run's difference from OLMo-core, olmoc's ratio to
    the larger noise, the threshold's verdict."""
    vals = " | ".join(f"{v:.5f}" if unit == "rel" else f"{v:.3f}" for v in values) if values else \
        " | ".join("" for _ in range(2 + len(NOISES)))
    show = (lambda d: f"{d:.2e} rel") if unit == "rel" else (lambda d: f"{d * 100:.1f} points")
    return (f"| {label} | {vals} | " + " | ".join(show(d) for d in diffs) +
            f" | {ratio(diffs[0], max(diffs[1:]))} | {verdict} |")


def write_report(out, timings, quick=False):
    out = pathlib.Path(out)
    noise_desc = "; ".join(f"*{label}*: {what}" for _, label, what in NOISES)
    lines = ["# Reproduction study: olmoc vs OLMo-core", "",
             "Olmo 3's two-stage recipe scaled down (`configs/repro-stage1.yaml`, `configs/repro-stage2.yaml`), "
             "trained by olmoc (C) and by OLMo-core's own components (`repro/olmo_core_train.py`: the Olmo 3 model "
             "from `TransformerConfig.olmo3_7B` scaled down, `SkipStepAdamW` with the Trainer's zero-LR initial step, "
             "`CosWithWarmup` / `LinearWithWarmup`, `NumpyFSLDataset` + its data loader) from the same initial "
             "weights; both follow OLMo-core's data order, and the OLMo-core side checks every batch against "
             "the batches olmoc trained on. Stage 2 starts on each side from that side's Stage 1 weights and "
             "optimizer state (AdamW moments and step), with a fresh schedule and data order. "
             "See `repro/run_study.py`." + (" **Quick variant** (few steps)." if quick else ""), "",
             f"**Noise reference.** OLMo-core runs {1 + len(NOISES)} times: *OLMo-core* (2 threads, the config's "
             f"micro-batch, torch's fp32 clipping norm: the reference) and runs that differ from it only in "
             f"rounding ({noise_desc}; the same weights, batches, clip and global batch). Every olmoc-vs-OLMo-core "
             "difference below stands next to each noise run's difference from OLMo-core; the ratio is olmoc's "
             "difference over the larger noise difference.", "",
             f"Thresholds on olmoc vs OLMo-core (fixed up front): training loss per step within {TRAIN_TOL:.0%} "
             f"relative; held-out loss within {VAL_TOL:.1%} relative at every evaluation; downstream accuracy "
             f"within {ACC_TOL * 100:.0f} points at the end of each stage. The noise runs are held to the same "
             "thresholds (their verdicts are under each table).", ""]
    ok = True
    summary = {}
    fig, axes = plt.subplots(1, 3, figsize=(18, 4.5))
    offset = 0
    labels = ["olmoc", "OLMo-core"] + [label for _, label, _ in NOISES]
    head = ("| quantity | " + " | ".join(labels) + " | olmoc vs OLMo-core | " +
            " | ".join(f"{label} vs OLMo-core (noise)" for _, label, _ in NOISES) + " | ratio | threshold |")
    for stage in (1, 2):
        c_train, c_val, c_mc = load(out / f"c-stage{stage}" / "metrics.jsonl")
        o_train, o_val, o_mc = load(out / f"{REF}-stage{stage}" / "metrics.jsonl")
        runs = [(c_train, c_val, c_mc)] + [load(out / f"{d}-stage{stage}" / "metrics.jsonl") for d, _, _ in NOISES]
        steps = sorted(c_train)
        assert all(sorted(r[0]) == steps for r in runs) and sorted(o_train) == steps, \
            f"stage {stage}: the runs logged different steps"
        d = [[rel(r[0][s]["loss"], o_train[s]["loss"]) for s in steps] for r in runs]  # [olmoc, noises...]
        worst, mean = [max(x) for x in d], [sum(x) / len(x) for x in d]
        train_ok = worst[0] <= TRAIN_TOL
        ok &= train_ok
        # olmoc against the noise run that sums the clipping norm as olmoc does (float64)
        c_run = runs[1 + [n for n, _, _ in NOISES].index("olmo_core-c")][0]
        d_cc = [rel(c_train[s]["loss"], c_run[s]["loss"]) for s in steps]
        summary[f"stage{stage}"] = {"train_loss_last": [r[0][steps[-1]]["loss"] for r in runs[:1]] +
                                    [o_train[steps[-1]]["loss"]] + [r[0][steps[-1]]["loss"] for r in runs[1:]],
                                    "train_rel_diff_mean": [mean[0], max(mean[1:])],
                                    "train_rel_diff_worst": [worst[0], max(worst[1:])],
                                    "noise_runs": {n: {"train_rel_diff_mean": m, "train_rel_diff_worst": w}
                                                   for (n, _, _), m, w in zip(NOISES, mean[1:], worst[1:])},
                                    "olmoc_vs_c": {"train_rel_diff_mean": sum(d_cc) / len(d_cc),
                                                   "train_rel_diff_worst": max(d_cc)},
                                    "val": {}, "mc_acc": {}}
        skipped = {name: sum(1 for r in tr.values() if r.get("skipped")) for name, tr in
                   zip(labels, [c_train, o_train] + [r[0] for r in runs[1:]])}
        x = [s + offset for s in steps]
        axes[0].plot(x, [c_train[s]["loss"] for s in steps], label=f"olmoc stage {stage}", lw=1.2)
        axes[0].plot(x, [o_train[s]["loss"] for s in steps], "--", label=f"OLMo-core stage {stage}", lw=1.2)
        for i, (dd, label) in enumerate(zip(d, ["olmoc"] + [label for _, label, _ in NOISES])):
            axes[1].semilogy(x, [max(v, 1e-12) for v in dd], label=f"|{label} - OLMo-core|" if stage == 1 else None,
                             color=f"C{[0, 3, 2][i % 3]}", lw=1, alpha=1.0 if i == 0 else 0.7)
        t = lambda k: timings.get(f"{k}-stage{stage}", 0)  # noqa: E731
        lines += [f"## Stage {stage} ({len(steps)} steps)", "",
                  "Wall time: olmoc " + f"{t('c'):.0f} s, OLMo-core {t(REF):.0f} s, " +
                  ", ".join(f"{label} {t(n):.0f} s" for n, label, _ in NOISES) +
                  " (a shared 2-core machine; the OLMo-core runs include their evaluations). Skipped steps "
                  "(SkipStepAdamW): " + ", ".join(f"{k} {v}" for k, v in skipped.items()) + ".", "",
                  head, "|" + "---|" * (6 + 2 * len(NOISES)),
                  fmt_row("training loss, first step", [c_train[steps[0]]["loss"], o_train[steps[0]]["loss"]] +
                          [r[0][steps[0]]["loss"] for r in runs[1:]], [x[0] for x in d], "rel"),
                  fmt_row("training loss, last step", [c_train[steps[-1]]["loss"], o_train[steps[-1]]["loss"]] +
                          [r[0][steps[-1]]["loss"] for r in runs[1:]], [x[-1] for x in d], "rel"),
                  fmt_row("training loss, mean per-step difference", None, mean, "rel"),
                  fmt_row("training loss, worst per-step difference", None, worst, "rel",
                          f"{TRAIN_TOL:.0%}: **{'pass' if train_ok else 'FAIL'}** "
                          f"(olmoc's worst: step {steps[d[0].index(worst[0])]})")]
        noise_ok = [w <= TRAIN_TOL for w in worst[1:]]
        for (step, name) in sorted(c_val):
            vals = [c_val[(step, name)], o_val.get((step, name))] + [r[1].get((step, name)) for r in runs[1:]]
            if None in vals:
                lines.append(f"| held-out {name}, step {step} | {vals[0]:.5f} | missing |" +
                             " |" * (3 + 2 * len(NOISES)) + " **FAIL** |")
                ok = False
                continue
            diffs = [rel(v, vals[1]) for v in vals[:1] + vals[2:]]
            ok &= diffs[0] <= VAL_TOL
            noise_ok = [a and dd <= VAL_TOL for a, dd in zip(noise_ok, diffs[1:])]
            summary[f"stage{stage}"]["val"][f"{name}@{step}"] = vals
            lines.append(fmt_row(f"held-out {name}, step {step}", vals, diffs, "rel",
                                 f"{VAL_TOL:.1%}: {'pass' if diffs[0] <= VAL_TOL else '**FAIL**'}"))
        for task in sorted(c_mc):
            recs = [c_mc[task], o_mc.get(task)] + [r[2].get(task) for r in runs[1:]]
            if None in recs:
                lines.append(f"| {task} acc | {recs[0]['acc']:.3f} | missing |" + " |" * (3 + 2 * len(NOISES)) +
                             " **FAIL** |")
                ok = False
                continue
            summary[f"stage{stage}"]["mc_acc"][task] = [r["acc"] for r in recs]
            for key in ("acc", "acc_per_token"):
                vals = [r[key] for r in recs]
                diffs = [abs(v - vals[1]) for v in vals[:1] + vals[2:]]
                verdict = ""
                if key == "acc":
                    ok &= diffs[0] <= ACC_TOL
                    noise_ok = [a and dd <= ACC_TOL for a, dd in zip(noise_ok, diffs[1:])]
                    verdict = f"{ACC_TOL * 100:.0f} points: {'pass' if diffs[0] <= ACC_TOL else '**FAIL**'}"
                lines.append(fmt_row(f"{task} {key} ({recs[0]['n']} examples, chance 0.25), end of stage", vals,
                                     diffs, "points", verdict))
        lines += ["", "The same thresholds applied to the noise runs (each against OLMo-core): " +
                  ", ".join(f"{label} **{'pass' if good else 'FAIL'}**" for (_, label, _), good in
                            zip(NOISES, noise_ok)) + ".",
                  "", f"olmoc vs OLMo-core (c) (both sum the clipping norm in float64): mean per-step training-loss "
                  f"difference {sum(d_cc) / len(d_cc):.2e} rel, worst {max(d_cc):.2e} rel (olmoc vs OLMo-core: "
                  f"{mean[0]:.2e}, {worst[0]:.2e})."]
        sets = sorted({n for _, n in c_val})
        for i, name in enumerate(sets):
            pts = sorted(s for s, n in c_val if n == name)
            axes[2].plot([s + offset for s in pts], [c_val[(s, name)] for s in pts], "o-", ms=3, color=f"C{i}",
                         label=f"olmoc {name}" if stage == 1 else None)
            axes[2].plot([s + offset for s in pts], [o_val[(s, name)] for s in pts], "x--", ms=6, color=f"C{i + 2}",
                         label=f"OLMo-core {name}" if stage == 1 else None)
        lines.append("")
        offset += steps[-1]
        for a in axes:
            a.axvline(offset, color="gray", lw=0.8, ls=":")
    axes[0].set(title="Training loss (Stage 1 | Stage 2)", xlabel="step", ylabel="cross-entropy")
    axes[1].set(title="Training loss: relative difference from OLMo-core", xlabel="step", ylabel="relative difference")
    axes[2].set(title="Held-out loss", xlabel="step", ylabel="cross-entropy")
    for a in axes:
        a.legend(fontsize=7)
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)
    lines[8:8] = [f"**Overall: {'PASS' if ok else 'FAIL'}**", "", "![curves](curves.png)", ""]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    # the figures as numbers: values [olmoc, OLMo-core, noise runs...]; train_rel_diff_* [olmoc, the larger noise]
    (out / "summary.json").write_text(json.dumps({"pass": bool(ok), **summary}, indent=1) + "\n")
    return ok
