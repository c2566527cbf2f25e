#!/usr/bin/env python3
"""PyTorch's fused attention (scaled_dot_product_attention) at Olmo 3 1B's attention shape: the
attention ceiling olmoc's cuda-bf16 attention is compared with.

For each SDPA backend (torch.nn.attention.sdpa_kernel: cuDNN, flash, memory-efficient) times the
forward and the forward + backward of causal attention over [batch, heads, seq_len, head_dim] bf16
tensors (default 1 x 16 x 8192 x 128: configs/olmo3-1b.yaml's full-attention layers at one sequence
per micro-batch), and prints TFLOP/s counted as olmoc's profile counts attention
(src/backend/profile.c): 4 x visible (query, key) pairs x heads x head_dim forward, twice that
backward, with batch x seq_len x (seq_len + 1) / 2 visible pairs under the causal mask; backward =
(forward + backward) - forward.  One `SDPA backend=NAME ...` line per backend, flushed as it is
produced and appended to --out when given; a backend that refuses the shape prints why.
--tiny is the CPU dry run (1 x 4 x 256 x 32 in fp32 on the math backend).
"""
import argparse
import sys

from device_timing import emit, timed


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--tiny", action="store_true", help="the CPU dry run")
    ap.add_argument("--out", help="append every result line to this file too")
    args = ap.parse_args(argv)

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if args.tiny:
        args.heads, args.seq_len, args.head_dim, args.reps = 4, 256, 32, 2
    cuda = torch.cuda.is_available() and not args.tiny
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    backends = ([("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                 ("efficient", SDPBackend.EFFICIENT_ATTENTION)] if cuda else [("math", SDPBackend.MATH)])
    B, H, T, D = args.batch, args.heads, args.seq_len, args.head_dim
    pairs = B * T * (T + 1) / 2.0
    fwd_flops, bwd_flops = 4.0 * pairs * H * D, 8.0 * pairs * H * D
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    emit(args.out, f"sdpa: torch {torch.__version__} on {name}, cuDNN {torch.backends.cudnn.version()}, "
                   f"shape {B}x{H}x{T}x{D} {str(dtype).replace('torch.', '')} causal, {args.reps} repetitions")
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, device=device, dtype=dtype, generator=gen, requires_grad=True) for _ in range(3))
    dout = torch.randn(B, H, T, D, device=device, dtype=dtype, generator=gen)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def fwd_bwd():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.autograd.grad(o, (q, k, v), dout)

    rc, best = 1, None
    for label, backend in backends:
        try:
            with sdpa_kernel([backend]):
                tf, tfb = timed(fwd, args.reps, sync), timed(fwd_bwd, args.reps, sync)
        except Exception as e:  # the backend refuses the shape, or is not built in
            emit(args.out, f"SDPA backend={label} unavailable: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
            continue
        tb = tfb - tf  # noise can make it <= 0 at tiny sizes: then no backward rate
        r = (fwd_flops / tf / 1e12, bwd_flops / tb / 1e12 if tb > 0 else float("nan"),
             (fwd_flops + bwd_flops) / tfb / 1e12)
        emit(args.out, f"SDPA backend={label} fwd_ms={tf * 1e3:.3f} fwd_bwd_ms={tfb * 1e3:.3f} fwd_tflops={r[0]:.4g} "
                       f"bwd_tflops={r[1]:.4g} fwd_bwd_tflops={r[2]:.4g}")
        if best is None or r[2] > best[1][2]:
            best = (label, r)
        rc = 0
    if best:
        emit(args.out, f"SDPA best={best[0]} fwd_tflops={best[1][0]:.4g} bwd_tflops={best[1][1]:.4g} "
                       f"fwd_bwd_tflops={best[1][2]:.4g}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
