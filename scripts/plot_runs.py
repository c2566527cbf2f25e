"""Draws loss curves of one or more olmoc runs into a PNG.

Each RUN is a run directory (data.out_dir, holding metrics.jsonl) or a
metrics.jsonl file.  Training loss is drawn as a line per run, validation
losses (olmoc train with data.val_paths) as markers in the same colour.

    python scripts/plot_runs.py runs/a runs/b -o loss.png [--smooth 10] [--logy]
"""
import argparse
import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_metrics(run):
    path = pathlib.Path(run)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"plot_runs: no metrics file at {path}")
    train, evals = [], {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.endswith("\n"):
                break  # a line cut short by a killed run
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                raise SystemExit(f"plot_runs: {path}:{n}: not JSON")
            if rec.get("type") in ("train", "eval") and rec.get("loss") is None:
                continue  # a loss that is not finite (a diverged run): olmoc writes null
            if rec.get("type") == "train":
                train.append((rec["step"], rec["loss"]))
            elif rec.get("type") == "eval":
                evals.setdefault(rec["set"], []).append((rec["step"], rec["loss"]))
    return path, train, evals


def smooth(values, k):
    if k <= 1:
        return values
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= k:
            acc -= values[i - k]
        out.append(acc / min(i + 1, k))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run directories or metrics.jsonl files")
    ap.add_argument("-o", "--output", default="loss.png", help="PNG to write (default loss.png)")
    ap.add_argument("--smooth", type=int, default=1, help="moving average over this many steps")
    ap.add_argument("--logy", action="store_true", help="logarithmic loss axis")
    ap.add_argument("--title", default="olmoc training loss")
    args = ap.parse_args(argv)
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    for i, run in enumerate(args.runs):
        path, train, evals = read_metrics(run)
        color = f"C{i % 10}"
        label = path.parent.name if path.name == "metrics.jsonl" else path.stem
        if train:
            steps, losses = zip(*train)
            ax.plot(steps, smooth(list(losses), args.smooth), color=color, lw=1.2, label=f"{label} train")
        for j, (name, points) in enumerate(sorted(evals.items())):
            steps, losses = zip(*points)
            ax.plot(steps, losses, color=color, ls="--", marker="os^vD"[j % 5], ms=4, label=f"{label} {name}")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss")
    if args.logy:
        ax.set_yscale("log")
    ax.set_title(args.title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.output)
    print(f"plot_runs: {len(args.runs)} run(s) -> {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
