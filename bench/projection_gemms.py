#!/usr/bin/env python3
"""cuBLAS (through PyTorch) on the projection GEMMs of a training step: would one q|k|v GEMM and one
gate|up GEMM over stacked weights pay against the separate GEMMs olmoc runs?

For each width (default configs/olmo3-1b.yaml's d_model 2048 / mlp_hidden 8192 and
configs/olmo3-7b.yaml's 4096 / 11008, no GQA in either) and N tokens per micro-batch (default 8192),
times in bf16 with fp32 accumulation, as cuda-bf16 multiplies:
  q|k|v    forward X[N, D] W[D, D]^T three times, against X [3D, D]^T once; the input gradient
           dY[N, D] W[D, D] summed three times against dY[N, 3D] W[3D, D]; the weight gradient
           dY^T X three times against once;
  gate|up  the same with two [F, D] weights.
PyTorch's GEMMs write bf16 outputs where olmoc's write fp32, so the rates are a little above what
olmoc's calls can reach; separate against fused compares like with like.
Prints one `GEMMS width=... group=... pass=... separate_ms=... fused_ms=... speedup=...
separate_tflops=... fused_tflops=...` line per case, flushed as produced and appended to --out,
then `GEMMS total width=... speedup=...` over the six cases.  The TFLOP/s are also the ceiling of
the step's projection GEMMs on this device, to compare with olmoc's profile (`profile: gemm`).
--tiny is the CPU dry run (fp32, N 256, D 64, F 256).
"""
import argparse
import sys

from device_timing import emit, timed


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--widths", default="2048:8192,4096:11008", help="d_model:mlp_hidden pairs, comma separated")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--tiny", action="store_true", help="the CPU dry run")
    ap.add_argument("--out", help="append every result line to this file too")
    args = ap.parse_args(argv)

    import torch

    if args.tiny:
        args.tokens, args.widths, args.reps = 256, "64:256", 2
    try:
        widths = [tuple(int(v) for v in w.split(":")) for w in args.widths.split(",")]
        if any(len(w) != 2 or min(w) < 1 for w in widths) or args.tokens < 1 or args.reps < 1:
            raise ValueError
    except ValueError:
        ap.error(f"--widths takes d_model:mlp_hidden pairs of positive integers (got {args.widths!r}); "
                 "--tokens and --reps positive")
    cuda = torch.cuda.is_available() and not args.tiny
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    emit(args.out, f"gemms: torch {torch.__version__} on {name}, {args.tokens} tokens, "
                   f"{str(dtype).replace('torch.', '')}, {args.reps} repetitions")

    N = args.tokens
    gen = torch.Generator(device=device).manual_seed(0)
    for D, F in widths:
        tot_sep = tot_fused = 0.0
        for group, parts, P in (("qkv", 3, D), ("gate_up", 2, F)):
            x = torch.randn(N, D, device=device, dtype=dtype, generator=gen)
            w = torch.randn(parts * P, D, device=device, dtype=dtype, generator=gen)
            dy = torch.randn(N, parts * P, device=device, dtype=dtype, generator=gen)
            ws = [w[i * P:(i + 1) * P] for i in range(parts)]  # views: each part's rows are contiguous
            dys = [dy[:, i * P:(i + 1) * P].contiguous() for i in range(parts)]
            dx = torch.empty(N, D, device=device, dtype=dtype)

            def input_grad_separate():  # accumulated in place, as olmoc's GEMMs do with beta 1
                torch.mm(dys[0], ws[0], out=dx)
                for d, wi in zip(dys[1:], ws[1:]):
                    dx.addmm_(d, wi)
            cases = {
                "forward": (lambda: [x @ wi.t() for wi in ws], lambda: x @ w.t()),
                "input_grad": (input_grad_separate, lambda: dy @ w),
                "weight_grad": (lambda: [d.t() @ x for d in dys], lambda: dy.t() @ x),
            }
            flops = 2.0 * N * D * P * parts
            for label, (sep, fused) in cases.items():
                ts, tf = timed(sep, args.reps, sync), timed(fused, args.reps, sync)
                tot_sep += ts
                tot_fused += tf
                emit(args.out, f"GEMMS width={D}:{F} group={group} pass={label} separate_ms={ts * 1e3:.3f} "
                               f"fused_ms={tf * 1e3:.3f} speedup={ts / tf:.3f} separate_tflops={flops / ts / 1e12:.4g} "
                               f"fused_tflops={flops / tf / 1e12:.4g}")
            del x, w, dy, ws, dys, dx
        emit(args.out, f"GEMMS total width={D}:{F} separate_ms={tot_sep * 1e3:.3f} fused_ms={tot_fused * 1e3:.3f} "
                       f"speedup={tot_sep / tot_fused:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
