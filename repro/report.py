"""Compares the olmoc and OLMo-core runs of the reproduction study and writes
report.md with plots.

Every olmoc-vs-OLMo-core difference is shown next to the difference between
two OLMo-core runs that differ only in the order of floating-point sums (the
reference's own noise; see repro/run_study.py), so the reader sees whether
olmoc is within it.

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
REF, NOISE = "olmo_core", "olmo_core-b"  # run directories {name}-stage{1,2}


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


def write_report(out, timings, quick=False):
    out = pathlib.Path(out)
    lines = ["# Reproduction study: olmoc vs OLMo-core", "",
             "Olmo 3's two-stage recipe scaled down (`configs/repro-stage1.yaml`, `configs/repro-stage2.yaml`), "
             "trained by olmoc (C) and by OLMo-core's own components (`repro/olmo_core_train.py`: the Olmo 3 model "
             "from `TransformerConfig.olmo3_7B` scaled down, `SkipStepAdamW` with the Trainer's zero-LR initial step, "
             "`CosWithWarmup` / `LinearWithWarmup`, `NumpyFSLDataset` + its data loader) from the same initial "
             "weights; both follow OLMo-core's data order, and the OLMo-core side checks every batch against "
             "the batches olmoc trained on. Stage 2 starts on each side from that side's Stage 1 weights and "
             "optimizer state (AdamW moments and step), with a fresh schedule and data order. "
             "See `repro/run_study.py`." + (" **Quick variant** (few steps)." if quick else ""), "",
             "**Noise reference.** OLMo-core runs twice: *OLMo-core* (2 threads, the config's micro-batch) and "
             "*OLMo-core (b)* (1 thread, micro-batches of half the rows, gradients accumulated: the same "
             "global batch), which differ only in the order of floating-point sums. Every olmoc-vs-OLMo-core "
             "difference below stands next to the OLMo-core-vs-OLMo-core (b) difference; the ratio says "
             "how many times the reference's own noise olmoc's difference is.", "",
             f"Thresholds on olmoc vs OLMo-core (fixed up front): training loss per step within {TRAIN_TOL:.0%} "
             f"relative; held-out loss within {VAL_TOL:.1%} relative at every evaluation; downstream accuracy "
             f"within {ACC_TOL * 100:.0f} points at the end of each stage.", ""]
    ok = True
    summary = {}
    fig, axes = plt.subplots(1, 3, figsize=(18, 4.5))
    offset = 0
    for stage in (1, 2):
        c_train, c_val, c_mc = load(out / f"c-stage{stage}" / "metrics.jsonl")
        o_train, o_val, o_mc = load(out / f"{REF}-stage{stage}" / "metrics.jsonl")
        b_train, b_val, b_mc = load(out / f"{NOISE}-stage{stage}" / "metrics.jsonl")
        steps = sorted(c_train)
        assert steps == sorted(o_train) == sorted(b_train), f"stage {stage}: the runs logged different steps"
        d_c = [abs(c_train[s]["loss"] - o_train[s]["loss"]) / o_train[s]["loss"] for s in steps]
        d_b = [abs(b_train[s]["loss"] - o_train[s]["loss"]) / o_train[s]["loss"] for s in steps]
        worst, worst_b = max(d_c), max(d_b)
        mean, mean_b = sum(d_c) / len(d_c), sum(d_b) / len(d_b)
        train_ok = worst <= TRAIN_TOL
        ok &= train_ok
        summary[f"stage{stage}"] = {"train_loss_last": [c_train[steps[-1]]["loss"], o_train[steps[-1]]["loss"],
                                                        b_train[steps[-1]]["loss"]],
                                    "train_rel_diff_mean": [mean, mean_b], "train_rel_diff_worst": [worst, worst_b],
                                    "val": {}, "mc_acc": {}}
        skipped = {name: sum(1 for r in tr.values() if r.get("skipped")) for name, tr in
                   (("olmoc", c_train), ("OLMo-core", o_train), ("OLMo-core (b)", b_train))}
        x = [s + offset for s in steps]
        axes[0].plot(x, [c_train[s]["loss"] for s in steps], label=f"olmoc stage {stage}", lw=1.2)
        axes[0].plot(x, [o_train[s]["loss"] for s in steps], "--", label=f"OLMo-core stage {stage}", lw=1.2)
        axes[1].semilogy(x, [max(v, 1e-12) for v in d_c], label="|olmoc - OLMo-core|" if stage == 1 else None,
                         color="C0", lw=1)
        axes[1].semilogy(x, [max(v, 1e-12) for v in d_b], label="|OLMo-core (b) - OLMo-core|" if stage == 1 else None,
                         color="C3", lw=1, alpha=0.8)
        t = lambda k: timings.get(f"{k}-stage{stage}", 0)  # noqa: E731
        lines += [f"## Stage {stage} ({len(steps)} steps)", "",
                  f"Wall time: olmoc {t('c'):.0f} s, OLMo-core {t(REF):.0f} s, OLMo-core (b) {t(NOISE):.0f} s "
                  "(a shared 2-core machine; the OLMo-core runs include their evaluations). Skipped steps "
                  "(SkipStepAdamW): " + ", ".join(f"{k} {v}" for k, v in skipped.items()) + ".", "",
                  "| quantity | olmoc | OLMo-core | OLMo-core (b) | olmoc vs OLMo-core | OLMo-core (b) vs OLMo-core "
                  "(noise) | ratio | threshold |", "|---|---|---|---|---|---|---|---|",
                  f"| training loss, first step | {c_train[steps[0]]['loss']:.5f} | {o_train[steps[0]]['loss']:.5f} | "
                  f"{b_train[steps[0]]['loss']:.5f} | {d_c[0]:.2e} rel | {d_b[0]:.2e} rel | {ratio(d_c[0], d_b[0])} | |",
                  f"| training loss, last step | {c_train[steps[-1]]['loss']:.5f} | {o_train[steps[-1]]['loss']:.5f} |"
                  f" {b_train[steps[-1]]['loss']:.5f} | {d_c[-1]:.2e} rel | {d_b[-1]:.2e} rel | "
                  f"{ratio(d_c[-1], d_b[-1])} | |",
                  f"| training loss, mean per-step difference | | | | {mean:.2e} rel | {mean_b:.2e} rel | "
                  f"{ratio(mean, mean_b)} | |",
                  f"| training loss, worst per-step difference | | | | {worst:.2e} rel (step {steps[d_c.index(worst)]}) | "
                  f"{worst_b:.2e} rel (step {steps[d_b.index(worst_b)]}) | {ratio(worst, worst_b)} | "
                  f"{TRAIN_TOL:.0%}: **{'pass' if train_ok else 'FAIL'}** |"]
        for (step, name) in sorted(c_val):
            c, o, b = c_val[(step, name)], o_val.get((step, name)), b_val.get((step, name))
            if o is None or b is None:
                lines.append(f"| held-out {name}, step {step} | {c:.5f} | missing | | | | | **FAIL** |")
                ok = False
                continue
            d, db = abs(c - o) / o, abs(b - o) / o
            ok &= d <= VAL_TOL
            summary[f"stage{stage}"]["val"][f"{name}@{step}"] = [c, o, b]
            lines.append(f"| held-out {name}, step {step} | {c:.5f} | {o:.5f} | {b:.5f} | {d:.2e} rel | {db:.2e} rel "
                         f"| {ratio(d, db)} | {VAL_TOL:.1%}: {'pass' if d <= VAL_TOL else '**FAIL**'} |")
        for task in sorted(c_mc):
            c, o, b = c_mc[task], o_mc.get(task), b_mc.get(task)
            if o is None or b is None:
                lines.append(f"| {task} acc | {c['acc']:.3f} | missing | | | | | **FAIL** |")
                ok = False
                continue
            summary[f"stage{stage}"]["mc_acc"][task] = [c["acc"], o["acc"], b["acc"]]
            for key in ("acc", "acc_per_token"):
                d, db = abs(c[key] - o[key]), abs(b[key] - o[key])
                verdict = ""
                if key == "acc":
                    ok &= d <= ACC_TOL
                    verdict = f"{ACC_TOL * 100:.0f} points: {'pass' if d <= ACC_TOL else '**FAIL**'}"
                lines.append(f"| {task} {key} ({c['n']} examples, chance 0.25), end of stage | {c[key]:.3f} | "
                             f"{o[key]:.3f} | {b[key]:.3f} | {d * 100:.1f} points | {db * 100:.1f} points | "
                             f"{ratio(d, db)} | {verdict} |")
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
    # the figures as numbers ([olmoc, OLMo-core, OLMo-core (b)]; differences [olmoc, noise])
    (out / "summary.json").write_text(json.dumps({"pass": bool(ok), **summary}, indent=1) + "\n")
    return ok
