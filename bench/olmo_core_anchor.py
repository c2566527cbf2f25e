#!/usr/bin/env python3
"""OLMo-core's training throughput on its own Olmo 3 1B model: the anchor olmoc is measured against.

Builds OLMo-core's TransformerConfig.olmo3_1B (dolma2's padded vocabulary) and trains it for a few
steps on random tokens with OLMo-core's own train step (TransformerTrainModule.train_batch and
optim_step) and the recipe of its Olmo 3 cookbook (olmo_core.internal.cookbook): SkipStepAdamW
(lr 4e-4 fixed, betas 0.9/0.95, weight decay 0.1 except the embeddings, foreach), z-loss 1e-5,
gradient clipping at 1.0, FSDP on one rank with bf16 parameters and fp32 reductions, and
torch.compile of every block (--compile).  The process is a one-rank process group (NCCL on a GPU,
gloo on the CPU).

Attention: flash-attn 2 (OLMo-core's default for this model) when `flash_attn` imports, else
OLMo-core's torch SDPA backend, which passes the sliding-window layers an explicit boolean mask and
the full-attention layers is_causal; the line `anchor: attention ...` says which ran.

Prints one line per step and one `ANCHOR key=value ...` line per measured phase (eager, then
compiled), each flushed as it is produced, and appends the same lines to --out when given, so a run
that is stopped keeps what it measured.  Tokens/s are over the timed steps (after --warmup steps).
MFU is counted as olmoc counts it (olmo_model_flops_per_token in src/model/model.c: 6 x the
parameters outside the input embedding, LM head included, plus 12 x d_model x the average number of
visible keys per layer), against --peak-tflops (default 989.4, the H100/H200 SXM dense bf16 peak that
tests/c/bench_train.c uses); OLMo-core's own count (Transformer.num_flops_per_token) is printed too.

--tiny is the CPU dry run (2 layers, d_model 128, vocab 1024, seq_len 256): it runs the same code
path, so CI tests it.  Needs ai2-olmo-core 3.0.0 and torch; on a machine without `cached_path`
(OLMo-core imports it only to fetch remote files, which this script never does) a local-files-only
stand-in is installed first.
"""
import argparse
import contextlib
import datetime
import functools
import gc
import os
import socket
import sys
import time
import types
import weakref

from device_timing import emit

H100_H200_SXM_BF16_TFLOPS = 989.4


def install_cached_path_stand_in(out):
    try:
        import cached_path  # noqa: F401

        return
    except ImportError:
        pass

    def cached_path_fn(path, *args, **kwargs):
        p = os.fspath(path)
        if "://" in p and not p.startswith("file://"):
            raise RuntimeError(f"cached_path stand-in: {p} is remote, and this machine has no cached_path")
        return p[len("file://"):] if p.startswith("file://") else p

    class SchemeClient:
        recoverable_errors = ()

        def __init__(self, resource):
            self.resource = resource

    class S3Client(SchemeClient):
        scheme = "s3"

    pkg = types.ModuleType("cached_path")
    pkg.__path__ = []
    pkg.cached_path = cached_path_fn
    schemes = types.ModuleType("cached_path.schemes")
    schemes.SchemeClient, schemes.S3Client = SchemeClient, S3Client
    schemes.add_scheme_client = lambda client: None
    pkg.schemes = schemes
    sys.modules["cached_path"], sys.modules["cached_path.schemes"] = pkg, schemes
    out("anchor: cached_path is not installed: a local-files-only stand-in is used (no remote files are read)")


def olmoc_flops_per_token(model, cfg, seq_len):
    """olmo_model_flops_per_token (src/model/model.c) for OLMo-core's model."""
    n_params = sum(p.numel() for p in model.parameters())
    n_embed = model.embeddings.weight.numel()
    total = 6.0 * (n_params - n_embed)
    swa = cfg.block.sequence_mixer.sliding_window
    for layer in range(cfg.n_layers):
        w = seq_len
        if swa is not None and swa.should_use_swa(layer, cfg.n_layers):
            w = min(swa.get_window_size(layer, cfg.n_layers), seq_len)
        avg = (seq_len + 1) / 2.0 if w >= seq_len else (w * (w + 1) / 2.0 + (seq_len - w) * w) / seq_len
        total += 12.0 * cfg.d_model * avg
    return total, n_params, n_embed


def pick_attention(requested, device_type):
    if requested != "auto":
        return requested, f"{requested} (asked for)"
    if device_type == "cuda":
        try:
            import flash_attn  # noqa: F401

            return "flash_2", f"flash_2 (flash-attn {getattr(flash_attn, '__version__', '?')})"
        except Exception as e:  # ImportError, or a build for another torch
            why = f"{type(e).__name__}: {e}".splitlines()[0][:120]
            return "torch", f"torch SDPA (flash-attn not importable: {why}); sliding-window layers get a boolean mask"
    return "torch", "torch SDPA (CPU); sliding-window layers get a boolean mask"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Recorder:
    """The part of olmo_core.train.Trainer that train_batch / optim_step call: metrics are dropped."""

    def record_metric(self, *args, **kwargs):
        pass

    def record_ce_loss(self, *args, **kwargs):
        pass


def model_config(args, attn):
    """OLMo-core's TransformerConfig.olmo3_1B with dolma2's padded vocabulary (--tiny: scaled down)."""
    from olmo_core.data import TokenizerConfig
    from olmo_core.nn.transformer import TransformerConfig

    vocab = args.vocab or TokenizerConfig.dolma2().padded_vocab_size()
    cfg = TransformerConfig.olmo3_1B(vocab_size=vocab, attn_backend=attn)
    if args.tiny:  # the dry run: OLMo-core's 1B with its width and depth scaled down
        cfg.d_model, cfg.n_layers = 128, 2
        cfg.block.sequence_mixer.n_heads = 4
        cfg.block.feed_forward.hidden_size = 256
        cfg.block.sequence_mixer.sliding_window.pattern = [args.seq_len // 2, -1]
    return cfg


def build(args, device, attn, compile_model):
    import torch
    from olmo_core.config import DType
    from olmo_core.distributed.parallel import DataParallelType
    from olmo_core.optim import OptimGroupOverride, SkipStepAdamWConfig
    from olmo_core.train.train_module import TransformerDataParallelConfig, TransformerTrainModuleConfig

    cfg = model_config(args, attn)
    model = cfg.build(init_device="meta")
    tm_cfg = TransformerTrainModuleConfig(
        rank_microbatch_size=args.micro_batch * args.seq_len,
        max_sequence_length=args.seq_len,
        optim=SkipStepAdamWConfig(
            lr=4e-4, weight_decay=0.1, betas=(0.9, 0.95),
            group_overrides=[OptimGroupOverride(params=["embeddings.weight"], opts=dict(weight_decay=0.0))],
            foreach=True,
        ),
        z_loss_multiplier=1e-5,
        max_grad_norm=1.0,
        compile_model=compile_model,
        dp_config=TransformerDataParallelConfig(
            name=DataParallelType.fsdp, param_dtype=DType.bfloat16, reduce_dtype=DType.float32
        ),
    )
    # TransformerTrainModule builds OLMo-core's one world mesh; a second phase in this process builds it again
    import olmo_core.distributed.parallel as parallel

    parallel._WORLD_MESH = None
    tm = tm_cfg.build(model, device=device)
    tm._trainer = Recorder()
    del torch
    return cfg, model, tm


def run_phase(args, out, device, attn, attn_label, mode):
    import torch

    cfg, model, tm = build(args, device, attn, compile_model=(mode == "compiled"))
    fpt, n_params, n_embed = olmoc_flops_per_token(model, cfg, args.seq_len)
    try:
        olmo_core_fpt = float(model.num_flops_per_token(args.seq_len))
    except Exception:
        olmo_core_fpt = float("nan")
    out(f"anchor: {mode}: olmo3_1B d_model {cfg.d_model} layers {cfg.n_layers} vocab {cfg.vocab_size} | "
        f"{n_params} params ({n_params - n_embed} outside the input embedding) | "
        f"FLOPs/token olmoc's count {fpt:.4g}, OLMo-core's {olmo_core_fpt:.4g}")
    gen = torch.Generator().manual_seed(0)
    tokens_per_step = args.micro_batch * args.seq_len
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    for step in range(args.warmup + args.steps):
        ids = torch.randint(0, cfg.vocab_size, (args.micro_batch, args.seq_len), generator=gen).to(device)
        sync()
        t0 = time.perf_counter()
        tm.zero_grads()
        tm.train_batch({"input_ids": ids})
        tm.optim_step()
        sync()
        dt = time.perf_counter() - t0
        loss = tm.optim.latest_loss if getattr(tm.optim, "latest_loss", None) is not None else float("nan")
        loss = float(loss) if not isinstance(loss, float) else loss
        timed = step >= args.warmup
        if timed:
            times.append(dt)
        out(f"anchor: {mode} step {step + 1}{'' if timed else ' (warm-up)'}: {dt:.3f}s "
            f"{tokens_per_step / dt:.0f} tok/s loss {loss:.4f}")
    tok_s = tokens_per_step * len(times) / sum(times)
    tflops = tok_s * fpt / 1e12
    mem = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else 0.0
    out(f"ANCHOR mode={mode} device={args.device_name.replace(' ', '_')} attention={attn} seq_len={args.seq_len} "
        f"micro_batch={args.micro_batch} steps={len(times)} tokens_per_s={tok_s:.1f} model_tflops={tflops:.3f} "
        f"mfu={tflops / args.peak_tflops:.4f} peak_tflops={args.peak_tflops} flops_per_token={fpt:.6g} "
        f"olmo_core_flops_per_token={olmo_core_fpt:.6g} max_allocated_gib={mem:.1f}")
    # the next phase builds the model again: this one's weights, gradients and optimizer state must go first
    model_ref = weakref.ref(model)
    del tm, model
    gc.collect()
    left = torch.cuda.memory_allocated() / 2**30 if device.type == "cuda" else 0.0
    out(f"anchor: {mode}: model released {model_ref() is None}, {left:.1f} GiB still allocated")
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return tok_s


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--seq-len", type=int, default=None, help="default 8192 (--tiny: 256)")
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per phase")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first (compilation happens there)")
    ap.add_argument("--compile", default="auto", choices=["auto", "off", "on", "both"],
                    help="auto: both on a GPU (eager first, so a stopped compilation leaves a result), off on CPU")
    ap.add_argument("--attention", default="auto", choices=["auto", "flash_2", "flash_3", "torch", "te"])
    ap.add_argument("--peak-tflops", type=float, default=H100_H200_SXM_BF16_TFLOPS)
    ap.add_argument("--tiny", action="store_true", help="the CPU dry run: 2 layers, d_model 128, vocab 1024")
    ap.add_argument("--out", help="append every line to this file too")
    ap.add_argument("--count-only", action="store_true",
                    help="build the model on the meta device and print its parameters and FLOPs per token only")
    args = ap.parse_args(argv)
    out = functools.partial(emit, args.out)
    if args.seq_len is None:
        args.seq_len = 256 if args.tiny else 8192
    args.vocab = 1024 if args.tiny else None

    install_cached_path_stand_in(out)
    import torch

    if args.count_only:
        cfg = model_config(args, "torch")
        model = cfg.build(init_device="meta")
        fpt, n_params, n_embed = olmoc_flops_per_token(model, cfg, args.seq_len)
        out(f"ANCHOR_COUNT d_model={cfg.d_model} n_layers={cfg.n_layers} vocab={cfg.vocab_size} seq_len={args.seq_len} "
            f"params={n_params} non_embedding={n_params - n_embed} flops_per_token={fpt:.10g} "
            f"olmo_core_flops_per_token={model.num_flops_per_token(args.seq_len)}")
        return 0

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        out("anchor: FAIL --device cuda but torch sees no CUDA device")
        return 1
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    args.device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    from olmo_core.version import VERSION as olmo_core_version
    from olmo_core.distributed.utils import init_distributed

    modes = {"auto": ["eager", "compiled"] if args.device == "cuda" else ["eager"], "off": ["eager"],
             "on": ["compiled"], "both": ["eager", "compiled"]}[args.compile]
    if "compiled" in modes and args.device != "cuda":
        out("anchor: OLMo-core compiles only on CUDA (parallelize_model): the compiled phase runs eager here")
    attn, attn_label = pick_attention(args.attention, args.device)
    out(f"anchor: OLMo-core {olmo_core_version}, torch {torch.__version__}, device {args.device_name}, "
        f"attention {attn_label}, FSDP (1 rank) bf16 params / fp32 reductions, phases {','.join(modes)}")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1")):
        os.environ.setdefault(k, v)
    init_distributed(backend="cpu:gloo,cuda:nccl" if args.device == "cuda" else "gloo",
                     timeout=datetime.timedelta(minutes=5))
    torch.manual_seed(0)
    rc = 0
    for mode in modes:
        try:
            run_phase(args, out, device, attn, attn_label, mode)
        except Exception as e:
            out(f"anchor: FAIL {mode}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400])
            import traceback

            traceback.print_exc()
            rc = 1
    with contextlib.suppress(Exception):
        torch.distributed.destroy_process_group()
    return rc


if __name__ == "__main__":
    sys.exit(main())
