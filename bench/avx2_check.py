#!/usr/bin/env python3
"""The AVX2 performance targets on this machine, in one command, met or not.

1. The attention kernels on one thread (`build/tests/test_attention --bench`:
   T=2048, one head, head_dim 64 and 128, full and window 256), --rounds
   times, each round against the one-thread 256-bit FMA loop measured just
   before and just after it (the higher of the two: these VMs' clock moves
   between minutes).  Target: forward and backward >= 60% of that peak.
2. The training command, `bench/bench_train.py --configs
   configs/olmo3-20m.yaml --seq-lens 512,2048 --torch-attn sdpa --repeats 2`
   (its own output goes to the terminal as it runs).  Targets: MFU >= 75% at
   T=512 and >= 65% at T=2048, >= 1.7x / >= 3x PyTorch eager+SDPA; peak RSS
   reported.

Then a Markdown table of every target.  On a processor with
AVX-512 the AVX2 paths are forced (OLMOC_CPU_ISA=avx2, bench_train.py
--force-avx2) and the output says so: the targets are for AVX2-only
processors, where only a run there settles them.  "No slowdown on AVX-512"
needs two builds: compare them with bench_train.py --build DIR (not here).

    cmake --build build --target olmoc peak_gemm test_attention
    .venv/bin/python bench/avx2_check.py            # about 15 minutes on 2 cores
"""
import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

from bench_train import fma_loop, lscpu  # this directory's: the peak loop and the processor, as bench_train reads them

ROOT = pathlib.Path(__file__).resolve().parent.parent
BENCH_LINE = re.compile(r"bench D=\s*(\d+) H=(\d+) window\s+(\d+):\s+fwd\s+([\d.]+) \(\s*([\d.]+)\) GFLOP/s.*?"
                        r"bwd\s+([\d.]+) \(\s*([\d.]+)\) GFLOP/s")
ATTN_TARGET, MFU_TARGETS, RATIO_TARGETS = 60.0, {512: 75.0, 2048: 65.0}, {512: 1.7, 2048: 3.0}


def run(cmd, env, what):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"avx2_check: {what} failed (exit {p.returncode}): {' '.join(map(str, cmd))}\n{p.stderr[-2000:]}")
    return p.stdout


def one_thread_peak(build, env, seconds):
    """the 256-bit FMA loop on one thread (peak_gemm's fma_avx2 on an AVX-512 build, its fma elsewhere)"""
    out = run([build / "peak_gemm", "--size", "0", "--seconds", str(seconds)], env, "peak_gemm")
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    row = fma_loop(rows, avx2=True)
    if row is None or (row["kind"] == "fma" and row["simd_lanes"] != 8):
        sys.exit(f"avx2_check: no 256-bit FMA loop in peak_gemm's output:\n{out}")
    return row["gflops_one_thread"]


def attention_rounds(args, env):
    """{(D, window): [(fwd %, bwd %), ...]} over the rounds, and the peaks"""
    res, peaks = {}, []
    before = one_thread_peak(args.build, env, args.peak_seconds)
    for r in range(args.rounds):
        out = run([args.build / "tests" / "test_attention", "--bench", f"{before:.1f}"], env, "test_attention --bench")
        after = one_thread_peak(args.build, env, args.peak_seconds)
        peak = max(before, after)
        peaks.append(peak)
        lines = BENCH_LINE.findall(out)
        if not lines:
            sys.exit(f"avx2_check: no bench lines in test_attention's output:\n{out}")
        for d, _h, w, fwd, _fb, bwd, _bb in lines:
            res.setdefault((int(d), int(w)), []).append((100 * float(fwd) / peak, 100 * float(bwd) / peak))
        print(f"# round {r + 1}/{args.rounds}: peak {before:.1f} before, {after:.1f} after; "
              + ", ".join(f"D={d} w={w}: fwd {100 * float(f) / peak:.0f}% bwd {100 * float(b) / peak:.0f}%"
                          for d, _h, w, f, _fb, b, _bb in lines), flush=True)
        before = after
    return res, peaks


def span(xs):
    lo, hi = min(xs), max(xs)
    return f"{lo:.1f}%" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f}-{hi:.1f}%"


def verdict(xs, target):
    n = sum(x >= target for x in xs)
    return "met" if n == len(xs) else ("not met" if n == 0 else f"met in {n} of {len(xs)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=pathlib.Path, default=ROOT / "build")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of the one-thread attention bench (default 5)")
    ap.add_argument("--peak-seconds", type=float, default=1.0,
                    help="seconds of each of peak_gemm's loops, per peak measurement (default 1)")
    ap.add_argument("--skip-train", action="store_true", help="the attention kernels only (about a minute)")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if not args.peak_seconds > 0:
        ap.error("--peak-seconds must be positive")
    for exe in ([args.build / "peak_gemm", args.build / "tests" / "test_attention"]
                + ([] if args.skip_train else [args.build / "olmoc"])):
        if not exe.exists():
            sys.exit(f"avx2_check: {exe} is missing: cmake --build {args.build} --target olmoc peak_gemm test_attention")

    cpu = lscpu()
    flags = set(cpu.get("Flags", "").split())
    if not {"avx2", "fma"} <= flags:
        sys.exit("avx2_check: this processor has no AVX2+FMA: nothing to check")
    forced = "avx512f" in flags
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if forced:
        env["OLMOC_CPU_ISA"] = "avx2"
    where = (f"{cpu.get('Model name', 'unknown processor')}, {os.cpu_count()} CPUs; "
             + ("AVX-512 processor, AVX2 paths FORCED (OLMOC_CPU_ISA=avx2, bench_train.py --force-avx2): "
                "a stand-in for an AVX2-only processor" if forced else "AVX2-only processor"))
    print(f"# {where}", flush=True)

    attn, peaks = attention_rounds(args, env)

    cases = []
    if not args.skip_train:
        with tempfile.TemporaryDirectory(prefix="avx2-check-") as tmp:
            js = pathlib.Path(tmp) / "train.json"
            cmd = [sys.executable, str(ROOT / "bench" / "bench_train.py"), "--configs", "configs/olmo3-20m.yaml",
                   "--seq-lens", "512,2048", "--torch-attn", "sdpa", "--repeats", "2", "--build", str(args.build),
                   "--json", str(js)] + (["--force-avx2"] if forced else [])
            print("# " + " ".join(cmd), flush=True)
            train_env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OLMOC_CPU_ISA")}
            if subprocess.run(cmd, cwd=ROOT, env=train_env).returncode != 0:
                sys.exit("avx2_check: bench_train.py failed")
            cases = json.loads(js.read_text())["cases"]

    peak_span = f"{peaks[0]:.1f}" if min(peaks) == max(peaks) else f"{min(peaks):.1f}-{max(peaks):.1f}"
    print(f"\n{where}; attention: {args.rounds} round(s), one thread, one-thread 256-bit FMA peak {peak_span} "
          "GFLOP/s\n")
    print("| target | measured | verdict |")
    print("|---|---|---|")
    for (d, w), xs in sorted(attn.items()):
        name = f"head_dim {d}, {'window ' + str(w) if w else 'full'}"
        for i, pas in ((0, "forward"), (1, "backward")):
            vals = [x[i] for x in xs]
            print(f"| attention {pas} >= {ATTN_TARGET:.0f}% of peak, {name} | {span(vals)} | "
                  f"{verdict(vals, ATTN_TARGET)} |")
    for c in cases:  # bench_train.py's own figures for each case (its "summary")
        t, m = int(c["T"]), c["summary"]
        print(f"| MFU >= {MFU_TARGETS[t]:.0f}% at T={t} | {m['mfu']:.1f}% ({m['olmoc_tok_s']:.1f} tok/s, peak "
              f"{c['peak']:.1f} GFLOP/s, RSS {m['olmoc_rss_mib']:.0f} MiB) | {verdict([m['mfu']], MFU_TARGETS[t])} |")
        if "ratio" in m:
            print(f"| >= {RATIO_TARGETS[t]}x PyTorch eager+SDPA at T={t} | {m['ratio']:.2f}x ({m['torch_tok_s']:.1f} "
                  f"tok/s, RSS {m['torch_rss_mib']:.0f} MiB) | {verdict([m['ratio']], RATIO_TARGETS[t])} |")
    if forced:
        print("\nAVX2 forced on an AVX-512 processor: these say how the AVX2 paths run here, not on an AVX2-only one.")


if __name__ == "__main__":
    main()
