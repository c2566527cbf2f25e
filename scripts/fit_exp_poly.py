#!/usr/bin/env python3
"""Fits the polynomial of attn_exp8 (src/backend/cpu/cpu_simd.h), the AVX2 attention kernels' exp.

attn_exp8 computes exp(x) as 2^n e^r with n = round(x log2 e) and r = x - n ln 2, so
|r| <= ln 2 / 2, and e^r by the degree-5 polynomial

    p(r) = 1 + c1 r + c2 r^2 + c3 r^3 + c4 r^4 + c5 r^5

whose constant term is exactly 1 (so that exp(0) = 1, the softmax's largest entry).  This script
fits c1 .. c5 for the least maximum relative error |p(r) / e^r - 1| over that interval: Lawson's
iteratively reweighted least squares on Chebyshev nodes, which converges to the minimax fit.  It
prints the coefficients as float32 values, highest power first (the order Horner's rule uses them),
and the fit's relative error (before float32 rounding; tests/c/test_ops.c measures the function's
error in ulps).

    .venv/bin/python scripts/fit_exp_poly.py [--degree 5] [--nodes 4000] [--iterations 300]
"""
import argparse

import numpy as np


def fit(degree, nodes, iterations):
    half = np.log(2.0) / 2
    r = half * np.cos(np.pi * (np.arange(nodes) + 0.5) / nodes)
    e = np.exp(r)
    # p(r) / e^r - 1 = (sum_k c_k r^k - (e^r - 1)) / e^r: a linear fit of (e^r - 1) / e^r
    a = (np.vander(r, degree) * r[:, None]) / e[:, None]  # columns r^degree .. r^1, over e^r
    b = (e - 1.0) / e
    w = np.full(nodes, 1.0 / nodes)
    for _ in range(iterations):
        sw = np.sqrt(w)
        c, *_ = np.linalg.lstsq(a * sw[:, None], b * sw, rcond=None)
        err = np.abs(a @ c - b)
        w = w * (err / err.max() + 1e-3)
        w /= w.sum()
    return c, float(err.max())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--degree", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=4000)
    ap.add_argument("--iterations", type=int, default=300)
    args = ap.parse_args()
    if args.degree < 1 or args.nodes <= args.degree or args.iterations < 1:
        raise SystemExit("need --degree >= 1, --nodes > --degree and --iterations >= 1")
    c, err = fit(args.degree, args.nodes, args.iterations)
    for k, v in zip(range(args.degree, 0, -1), c):
        print(f"c{k} = {float(np.float32(v))!r}f")
    print("c0 = 1.0f")
    print(f"max relative error of the fit: {err:.3g}")


if __name__ == "__main__":
    main()
