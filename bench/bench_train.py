#!/usr/bin/env python3
"""Training throughput of olmoc vs PyTorch on the same Olmo 3 configs, one run.

For each config and sequence length, trains a few steps of
  * olmoc (build/olmoc train, on a random .npy token file written here), and
  * PyTorch (the reference model tests/python/olmo3_ref.py in float32, AdamW,
    the same batch, z-loss and clipping; torch.set_num_threads = OMP_NUM_THREADS),
alternating the two (--repeats) so that load from other processes hits both,
and prints the median tokens/s of each, the ratio, MFU and peak RSS.

Peak FLOP/s (bench/peak_gemm, built by CMake next to olmoc):
  * measured: a register-only FMA loop on every thread (real clock, real SIMD),
    before the runs and again after each case: a case's MFU and shares of peak
    are against the higher of the two around it (a VM's clock can move by 8%
    between minutes: 236 and 255 GFLOP/s on one 2-vCPU Intel machine);
  * SGEMM: the GEMM of olmoc's backend (--olmoc-backend: cpu = oneDNN when
    built with it, cpu-openblas, cpu-onednn, cpu-bf16) on a large square problem, and
    on every GEMM shape one olmoc training step runs (the "GEMM % of peak"),
    each shape called over and over, then again with 64 MiB written before
    each call (peak_gemm --cold): the step finds its operands out of the L2s,
    so that second rate, not the first, is what its GEMMs can reach;
  * theoretical: cores x GHz (lscpu / /proc/cpuinfo) x FMA pipes x SIMD lanes x 2
    (FMA pipes and datapath width are not in lscpu; see theoretical_peak()).
MFU = training FLOPs per token (olmoc info: 6 x matmul params + causal attention)
      x tokens/s / measured peak.

Where it ran: the processor's instruction sets (AVX2, AVX-512, AVX512-BF16,
AMX-BF16) and the kernels olmoc used (its backend line: GEMM library and ISA,
attention's kernels) head the output.  --force-avx2 runs an AVX-512
processor as an AVX2 one as far as software can: OLMOC_CPU_ISA=avx2
(olmoc's attention kernels), ONEDNN_MAX_CPU_ISA=AVX2 (oneDNN's GEMMs),
OPENBLAS_CORETYPE=Haswell, and for PyTorch ATEN_CPU_CAPABILITY=avx2 and
MKL_ENABLE_INSTRUCTIONS=AVX2; the peak is then the 256-bit FMA loop's
(peak_gemm's fma_avx2).  Clock, caches and the other vectorised loops
(compiled for the build's -march) stay the AVX-512 machine's.
Per case: each op's share of olmoc's op time (OLMOC_PROFILE) and each
kernel's GFLOP/s as a share of the peak (GEMM; attention forward and
backward over their model FLOPs), and every process's peak RSS.

Not part of the test suite.  Example (a few minutes on 2 cores):
  python bench/bench_train.py --configs configs/olmo3-20m.yaml,configs/olmo3-100m.yaml --seq-lens 512,2048
"""
import argparse
import json
import os
import pathlib
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- helpers

def load_avg():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_measured(cmd, env=None):
    """Runs cmd; returns (returncode, stdout, stderr, peak RSS in MiB) of that child alone."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return p.returncode, out.read().decode(), err.read().decode(), ru.ru_maxrss / 1024.0


def read_yaml_model(path):
    """The model: section of an olmoc config (flat key: value lines) as a dict."""
    model, section = {}, None
    for line in pathlib.Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].rstrip()
        if not line:
            continue
        if not line.startswith(" "):
            section = line.rstrip(":").strip()
            continue
        if section == "model":
            k, v = (s.strip() for s in line.split(":", 1))
            if v.lower() in ("true", "false"):
                model[k] = v.lower() == "true"
            else:
                try:
                    model[k] = int(v)
                except ValueError:
                    model[k] = float(v)
    return model


def lscpu():
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return {k.strip(): v.strip() for k, v in (l.split(":", 1) for l in out.splitlines() if ":" in l)}


def theoretical_peak(threads, avx2_only=False):
    """cores x GHz x FMA pipes x fp32 lanes per pipe x 2 (an FMA is 2 FLOPs).

    lscpu gives cores and flags; the clock is lscpu's "CPU max MHz" when
    present, else the nominal clock in /proc/cpuinfo (VMs often hide boost).
    Pipes and datapath width come from the microarchitecture, not lscpu:
    AMD Zen 2/3/4 (families 0x17, 0x19): 2 FMA pipes of 256 bits (Zen 4 runs
    AVX-512 as two 256-bit halves); Zen 5 (0x1A): 2 x 512; Intel with AVX-512:
    2 x 512 (Xeon Gold/Platinum class); other AVX2+FMA: 2 x 256."""
    info = lscpu()
    flags = info.get("Flags", "").split()
    vendor, family = info.get("Vendor ID", ""), int(info.get("CPU family", "0") or 0)
    cores = int(info.get("Core(s) per socket", "1")) * int(info.get("Socket(s)", "1"))
    mhz, mhz_src = None, None
    if info.get("CPU max MHz"):
        mhz, mhz_src = float(info["CPU max MHz"]), "lscpu max MHz"
    else:
        for line in open("/proc/cpuinfo"):
            if line.startswith("cpu MHz"):
                mhz, mhz_src = float(line.split(":")[1]), "/proc/cpuinfo nominal MHz (no max MHz exposed)"
                break
    if vendor == "AuthenticAMD":
        pipes, bits = 2, (512 if family >= 0x1A and "avx512f" in flags else 256)
    elif "avx512f" in flags:
        pipes, bits = 2, 512
    elif "fma" in flags:
        pipes, bits = 2, 256
    else:
        pipes, bits = 1, 128
    if avx2_only and bits > 256:  # --force-avx2: 256-bit registers
        bits = 256
    used = min(cores, threads)
    gflops = used * (mhz or 0) / 1000 * pipes * (bits // 32) * 2
    return {"gflops": gflops, "cores": used, "mhz": mhz, "mhz_source": mhz_src, "fma_pipes": pipes,
            "datapath_bits": bits, "model": info.get("Model name", "?")}


def gemm_shapes(m, n_tokens):
    """(M, N, K, transA, transB) of every GEMM olmoc's model.c runs per micro-batch (fwd + bwd)."""
    D, F, V = m["d_model"], m["mlp_hidden"], m["vocab_size"]
    hd = D // m["n_heads"]
    Q, K = m["n_heads"] * hd, m["n_kv_heads"] * hd
    N = n_tokens
    per_layer = [
        (N, Q, D, 0, 1), (N, K, D, 0, 1), (N, K, D, 0, 1), (N, D, Q, 0, 1),  # q k v o fwd
        (N, F, D, 0, 1), (N, F, D, 0, 1), (N, D, F, 0, 1),  # gate up down fwd
        (N, F, D, 0, 0), (D, F, N, 1, 0), (N, D, F, 0, 0), (N, D, F, 0, 0), (F, D, N, 1, 0), (F, D, N, 1, 0),
        (N, Q, D, 0, 0), (D, Q, N, 1, 0),  # o bwd
        (N, D, Q, 0, 0), (N, D, K, 0, 0), (N, D, K, 0, 0), (Q, D, N, 1, 0), (K, D, N, 1, 0), (K, D, N, 1, 0),
    ]
    head = [(N, V, D, 0, 1), (N, D, V, 0, 0), (V, D, N, 1, 0)]
    counts = {}
    for s in per_layer:
        counts[s] = counts.get(s, 0) + m["n_layers"]
    for s in head:
        counts[s] = counts.get(s, 0) + 1
    return counts


# ----------------------------------------------------------------------------- PyTorch worker

def sdpa_forward(params, tokens, cfg, doc_masking=False):
    """olmo3_ref.forward with the attention core replaced by
    F.scaled_dot_product_attention (same boolean mask): PyTorch's fused CPU
    attention, which does not keep the T x T probabilities for backward."""
    import math
    import torch.nn.functional as F
    import olmo3_ref as ref

    B, T = tokens.shape
    D, H, HK = cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"]
    hd, eps = D // H, cfg["rms_norm_eps"]
    cos, sin = ref.rope_cos_sin(T, hd, cfg["rope_theta"], params["model.embed_tokens.weight"].dtype)
    x = params["model.embed_tokens.weight"][tokens]
    for l in range(cfg["n_layers"]):
        p = lambda n: params[f"model.layers.{l}.{n}.weight"]
        q = ref.rms_norm(x @ p("self_attn.q_proj").T, p("self_attn.q_norm"), eps).view(B, T, H, hd).transpose(1, 2)
        k = ref.rms_norm(x @ p("self_attn.k_proj").T, p("self_attn.k_norm"), eps).view(B, T, HK, hd).transpose(1, 2)
        v = (x @ p("self_attn.v_proj").T).view(B, T, HK, hd).transpose(1, 2)
        q = q * cos + ref.rotate_half(q) * sin
        k = k * cos + ref.rotate_half(k) * sin
        window = 0 if ref.layer_is_full(cfg, l) else cfg["sliding_window"]
        mask = ref.attention_mask(tokens, window, cfg["eos_token_id"], doc_masking)
        att = F.scaled_dot_product_attention(q, k.repeat_interleave(H // HK, dim=1), v.repeat_interleave(H // HK, dim=1),
                                             attn_mask=mask, scale=1.0 / math.sqrt(hd))
        att = att.transpose(1, 2).reshape(B, T, H * hd)
        h = x + ref.rms_norm(att @ p("self_attn.o_proj").T, p("post_attention_layernorm"), eps)
        mlp = (F.silu(h @ p("mlp.gate_proj").T) * (h @ p("mlp.up_proj").T)) @ p("mlp.down_proj").T
        x = h + ref.rms_norm(mlp, p("post_feedforward_layernorm"), eps)
    return ref.rms_norm(x, params["model.norm.weight"], eps) @ params["lm_head.weight"].T


def torch_worker(args):
    """Runs in its own process (clean peak RSS): trains args.steps steps, prints JSON."""
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT / "tests" / "python"))
    import olmo3_ref as ref

    torch.set_num_threads(args.threads)
    cfg = json.loads(args.worker_cfg)
    m = cfg["model"]
    T, B = cfg["seq_len"], cfg["micro_batch"]
    g = torch.Generator().manual_seed(0)
    D, V, Fh = m["d_model"], m["vocab_size"], m["mlp_hidden"]
    hd = D // m["n_heads"]
    Q, K = m["n_heads"] * hd, m["n_kv_heads"] * hd
    shapes = {"model.embed_tokens.weight": (V, D)}
    for l in range(m["n_layers"]):
        p = f"model.layers.{l}."
        shapes.update({p + "self_attn.q_proj.weight": (Q, D), p + "self_attn.k_proj.weight": (K, D),
                       p + "self_attn.v_proj.weight": (K, D), p + "self_attn.o_proj.weight": (D, Q),
                       p + "self_attn.q_norm.weight": (Q,), p + "self_attn.k_norm.weight": (K,),
                       p + "mlp.gate_proj.weight": (Fh, D), p + "mlp.up_proj.weight": (Fh, D),
                       p + "mlp.down_proj.weight": (D, Fh), p + "post_attention_layernorm.weight": (D,),
                       p + "post_feedforward_layernorm.weight": (D,)})
    shapes["model.norm.weight"] = (D,)
    shapes["lm_head.weight"] = (V, D)
    params = {}
    for name, shape in shapes.items():
        t = torch.ones(shape) if len(shape) == 1 else torch.randn(shape, generator=g) * m["init_std"]
        params[name] = t.requires_grad_(True)
    embed = [params["model.embed_tokens.weight"]]
    rest = [t for n, t in params.items() if n != "model.embed_tokens.weight"]
    groups = [{"params": embed, "weight_decay": 0.0}, {"params": rest, "weight_decay": 0.1}]
    try:
        opt = torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
        opt_kind = "fused"
    except (RuntimeError, TypeError):
        opt = torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
        opt_kind = "default"
    z_loss = 1e-5

    forward = ref.forward if args.torch_attn == "ref" else sdpa_forward

    def loss_fn(p, mb):
        logits = forward(p, mb, m, False)
        ce, zz = ref.loss_sums(logits, ref.labels_for(mb))
        return ce, zz

    fn = torch.compile(loss_fn) if args.torch_mode == "compile" else loss_fn
    tokens = torch.randint(2, V, (args.steps + args.warmup, cfg["grad_accum"], B, T), generator=g)
    times = []
    ready_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    for s in range(args.steps + args.warmup):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        n_labels = cfg["grad_accum"] * B * (T - 1)
        for mb in tokens[s]:
            ce, zz = fn(params, mb)
            ((ce + z_loss * zz) / n_labels).backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"step_times": times, "optimizer": opt_kind, "ready_rss_mib": ready_rss,
                      "torch": torch.__version__, "threads": torch.get_num_threads()}))


# ----------------------------------------------------------------------------- the benchmark

def run_olmoc(args, cfg_path, T, B, accum, window, token_file, out_dir, env):
    steps = args.steps + args.warmup
    cmd = [str(args.build / "olmoc"), "train", str(cfg_path), "--backend", args.olmoc_backend,
           "--set", f"train.seq_len={T}", "--set", f"train.micro_batch={B}",
           "--set", f"train.grad_accum={accum}", "--set", f"train.steps={steps}",
           "--set", "train.warmup_steps=1", "--set", "train.log_every=1",
           "--set", f"model.sliding_window={window}", "--set", "train.save_every=0", "--set", "train.eval_every=0",
           "--set", f"data.train_path={token_file}", "--set", f"data.out_dir={out_dir}"]
    # OLMOC_PROFILE: per-op wall time (a clock read per op call, negligible) and in-training GEMM GFLOP/s
    rc, out, err, rss = run_measured(cmd, dict(env, OLMOC_PROFILE="1"))
    if rc:
        raise SystemExit(f"olmoc failed ({rc}):\n{out}\n{err}")
    tok_s = [float(x) for x in re.findall(r"\| (\d+) tok/s \|", out)]
    gemm = float(re.search(r"profile: gemm ([0-9.]+) GFLOP/s", out).group(1))
    profile = {m.group(1).strip(): float(m.group(2)) for m in re.finditer(r"profile: (.+?) +\d+ +[0-9.]+ +([0-9.]+)%", out)}
    # attention's model FLOPs over its time, forward and backward together
    passes = [(float(m.group(1)), float(m.group(2)))
              for m in re.finditer(r"profile: attention [bf]wd ([0-9.]+) GFLOP/s over (\S+) model FLOP", out)]
    attn = sum(f for _, f in passes) / sum(f / r for r, f in passes) if passes and all(r > 0 for r, _ in passes) else 0
    per_pass = {m.group(1): float(m.group(2))
                for m in re.finditer(r"profile: attention ([bf]wd) ([0-9.]+) GFLOP/s over", out)}
    header = re.search(r"^backend .*$", out, re.M)
    if args.force_avx2 and "attention: AVX2+FMA kernels" not in (header.group(0) if header else ""):
        raise SystemExit(f"--force-avx2, but olmoc did not run AVX2 attention kernels: {header and header.group(0)}")
    return {"tok_s": statistics.median(tok_s[args.warmup:]), "steps_tok_s": tok_s, "rss_mib": rss,
            "gemm_gflops": gemm, "attention_gflops": attn, "attention_fwd_gflops": per_pass.get("fwd", 0.0),
            "attention_bwd_gflops": per_pass.get("bwd", 0.0), "time_share": profile,
            "backend_line": header.group(0) if header else ""}


def run_torch(args, model, T, B, accum, window, env):
    m = dict(model, sliding_window=window)
    wcfg = json.dumps({"model": m, "seq_len": T, "micro_batch": B, "grad_accum": accum})
    cmd = [sys.executable, __file__, "--worker", "--worker-cfg", wcfg, "--threads", str(args.threads),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--torch-mode", args.torch_mode,
           "--torch-attn", args.torch_attn]
    rc, out, err, rss = run_measured(cmd, env)
    if rc:
        raise SystemExit(f"PyTorch worker failed ({rc}):\n{out}\n{err[-3000:]}")
    res = json.loads(out.strip().splitlines()[-1])
    tokens = B * accum * T
    tok_s = [tokens / t for t in res["step_times"]]
    return {"tok_s": statistics.median(tok_s[args.warmup:]), "steps_tok_s": [round(x) for x in tok_s],
            "rss_mib": rss, "optimizer": res["optimizer"], "ready_rss_mib": res["ready_rss_mib"],
            "torch": res["torch"]}


def flops_per_token(args, cfg_path, T, window):
    out = subprocess.run([str(args.build / "olmoc"), "info", str(cfg_path), "--set", f"train.seq_len={T}",
                          "--set", f"model.sliding_window={window}"], capture_output=True, text=True,
                         check=True).stdout
    return float(re.search(r"FLOPs per token at seq_len \d+: ([0-9.e+]+)", out).group(1)), \
        int(re.search(r"# parameters: (\d+) total, (\d+)", out).group(2))


def run_peak_gemm(args, env, extra):
    cmd = [str(args.build / "peak_gemm"), "--backend", args.olmoc_backend] + extra
    rc, out, err, _ = run_measured(cmd, env)
    if rc:
        raise SystemExit(f"peak_gemm failed: {err}")
    return [json.loads(l) for l in out.splitlines() if l.startswith("{")]


def fma_loop(rows, avx2):
    """peak_gemm's FMA loop row (None if it printed none): its widest, or where avx2 the 256-bit one
    (fma_avx2 on an AVX-512 processor; elsewhere the same loop, fma)"""
    fma = next((r for r in rows if r["kind"] == "fma"), None)
    return next((r for r in rows if r["kind"] == "fma_avx2"), fma) if avx2 else fma


def loops_of(rows, args):
    """peak_gemm's register-only loops: the FMA loop MFU is taken against (the 256-bit one with
    --force-avx2), with the bf16 ones and the GEMM library's line beside it."""
    fma = fma_loop(rows, args.force_avx2)
    if fma is None:
        raise SystemExit(f"peak_gemm printed no FMA loop: {rows}")
    fma["blas"] = next(r for r in rows if r["kind"] == "blas")
    fma["bf16_dot"] = next((r for r in rows if r["kind"] == "bf16_dot"), None)
    fma["amx_bf16"] = next((r for r in rows if r["kind"] == "amx_bf16"), None)
    return fma


def peak_of(fma, args, theo):
    """The peak MFU is taken against, from loops_of's rows: the FMA loop's (cpu-bf16: the bf16 dot-product
    loop's, or the AMX tile loop's where oneDNN's bf16 matmul runs AMX).  Other processes can hold cores
    during the all-thread rounds; one thread finds an uncontended core more easily, and every core runs the
    same clock: so the larger of the all-thread figure and cores x the one-thread one."""
    loop = fma
    if args.olmoc_backend == "cpu-bf16":
        loop = fma["bf16_dot"]
        if loop is None:
            raise SystemExit("cpu-bf16: peak_gemm has no bf16_dot peak (built without AVX512-BF16)")
        if fma["amx_bf16"] is not None and "amx" in fma["blas"]["gemm"].lower():
            loop = fma["amx_bf16"]
    return loop_peak(loop, theo)


def loop_peak(loop, theo):
    """One loop's peak: the larger of its all-thread figure and cores x its one-thread one."""
    return max(loop["gflops"], loop["gflops_one_thread"] * min(loop["threads"], theo["cores"]))


def measure_loops(args, env, theo):
    """The peak again (the loops only, as long as the first time): these VMs' clock moves between minutes."""
    return peak_of(loops_of(run_peak_gemm(args, env, ["--size", "0", "--seconds", str(args.gemm_seconds)]), args),
                   args, theo)


def measure_peak(args, env, shape_sets):
    shapes = sorted({s for counts in shape_sets for s in counts})
    extra = ["--size", "2048", "--seconds", str(args.gemm_seconds), "--cold"]
    for s in shapes:
        extra += ["--shape", ",".join(map(str, s))]
    rows = run_peak_gemm(args, env, extra)
    fma = loops_of(rows, args)
    square = next(r for r in rows if r["kind"] == "sgemm_square")
    per_shape = {(r["m"], r["n"], r["k"], r["ta"], r["tb"]): r for r in rows if r["kind"] == "sgemm_shape"}
    # the same shapes with operands out of the caches (peak_gemm --cold), as the step's GEMMs find them
    cold = {(r["m"], r["n"], r["k"], r["ta"], r["tb"]): r for r in rows if r["kind"] == "sgemm_shape_cold"}
    return fma, square, per_shape, cold


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="configs/olmo3-20m.yaml,configs/olmo3-100m.yaml")
    ap.add_argument("--seq-lens", default="512,2048")
    ap.add_argument("--tokens-per-step", type=int, default=2048,
                    help="micro_batch = tokens_per_step / seq_len (at least 1), grad_accum 1")
    ap.add_argument("--steps", type=int, default=2, help="timed steps (median reported)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed first steps")
    ap.add_argument("--repeats", type=int, default=1, help="olmoc/PyTorch alternations per case")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", os.cpu_count())))
    ap.add_argument("--torch-mode", choices=["eager", "compile"], default="eager",
                    help="compile: torch.compile (inductor; works offline here but compiles for minutes)")
    ap.add_argument("--torch-attn", choices=["ref", "sdpa"], default="ref",
                    help="ref: olmo3_ref.forward as is (materialises T x T scores); sdpa: the same model with "
                         "F.scaled_dot_product_attention")
    ap.add_argument("--build", type=pathlib.Path, default=ROOT / "build")
    ap.add_argument("--olmoc-backend", default="cpu", choices=["cpu", "cpu-openblas", "cpu-onednn", "cpu-bf16"],
                    help="olmoc's CPU backend: GEMMs from oneDNN (cpu, when built with it) or OpenBLAS; "
                         "cpu-bf16: bf16 GEMM operands (MFU then against the measured bf16 peak: the AMX tile loop where oneDNN runs AMX, else the dot-product loop)")
    ap.add_argument("--force-avx2", action="store_true",
                    help="run an AVX-512 processor's kernels as AVX2 ones (OLMOC_CPU_ISA=avx2, "
                         "ONEDNN_MAX_CPU_ISA=AVX2, ...; see above); the peak is then the 256-bit FMA loop's")
    ap.add_argument("--gemm-seconds", type=float, default=0.5)
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--json", type=pathlib.Path, help="also write all results here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker-cfg", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return torch_worker(args)

    for exe in ("olmoc", "peak_gemm"):
        if not (args.build / exe).exists():
            raise SystemExit(f"{args.build / exe} missing: cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "
                             "&& cmake --build build")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    if args.force_avx2:
        env.update(OLMOC_CPU_ISA="avx2", ONEDNN_MAX_CPU_ISA="AVX2", DNNL_MAX_CPU_ISA="AVX2",
                   OPENBLAS_CORETYPE="Haswell", ATEN_CPU_CAPABILITY="avx2", MKL_ENABLE_INSTRUCTIONS="AVX2")
    configs = [ROOT / c if not os.path.isabs(c) else pathlib.Path(c) for c in args.configs.split(",")]
    seq_lens = [int(x) for x in args.seq_lens.split(",")]

    cases = []
    for cfg_path in configs:
        model = read_yaml_model(cfg_path)
        for T in seq_lens:
            B = max(1, args.tokens_per_step // T)
            # the configs' rule: sliding window = seq_len / 2 (Olmo 3: 4096 of 8192)
            window = T // 2
            fpt, n_params = flops_per_token(args, cfg_path, T, window)
            cases.append(dict(cfg=cfg_path, model=model, T=T, B=B, accum=1, window=window, fpt=fpt,
                              params=n_params, shapes=gemm_shapes(model, B * T)))

    print(f"# load average before: {load_avg()}  ({os.cpu_count()} CPUs; threads {args.threads})", flush=True)
    theo = theoretical_peak(args.threads, args.force_avx2)
    fma, square, per_shape, cold = measure_peak(args, env, [c["shapes"] for c in cases])
    peak_fma = loop_peak(fma, theo)
    peak = peak_of(fma, args, theo)
    print(f"# CPU: {theo['model']}")
    flags = set(lscpu().get("Flags", "").split())
    has = [name for name, need in (("AVX2", {"avx2"}), ("FMA", {"fma"}),
                                   ("AVX-512", {"avx512f", "avx512bw", "avx512dq", "avx512vl"}),
                                   ("AVX512-BF16", {"avx512_bf16"}), ("AMX-BF16", {"amx_bf16", "amx_tile"}))
           if need <= flags]
    forced = ("AVX2 FORCED on this processor (OLMOC_CPU_ISA=avx2, ONEDNN_MAX_CPU_ISA=AVX2, OPENBLAS_CORETYPE=Haswell;"
              " PyTorch: ATEN_CPU_CAPABILITY=avx2, MKL_ENABLE_INSTRUCTIONS=AVX2)" if args.force_avx2 else
              "not forced: each library's best for this processor")
    print(f"# instruction sets: the processor has {', '.join(has) or 'none of AVX2/FMA/AVX-512'}; {forced}")
    print(f"# peak, measured FMA loop ({fma['simd_lanes']} lanes, best round): {fma['gflops']:.1f} GFLOP/s on "
          f"{fma['threads']} threads, {fma['gflops_one_thread']:.1f} on one -> peak {peak_fma:.1f} GFLOP/s "
          f"(implies {peak_fma / (theo['cores'] * theo['fma_pipes'] * theo['datapath_bits'] / 32 * 2):.2f} GHz)")
    print(f"# peak, theoretical: {theo['cores']} cores x {theo['mhz'] / 1000:.2f} GHz ({theo['mhz_source']}) x "
          f"{theo['fma_pipes']} FMA pipes x {theo['datapath_bits'] // 32} lanes x 2 = {theo['gflops']:.1f} GFLOP/s")
    if args.olmoc_backend == "cpu-bf16":
        # bf16 GEMMs: MFU against the bf16 dot-product peak (twice the fp32 FMA peak where it runs at full width)
        dot, amx = fma["bf16_dot"], fma["amx_bf16"]
        if amx is not None and "amx" in fma["blas"]["gemm"].lower():
            # oneDNN's bf16 matmul runs on the AMX tile unit: the processor's bf16 peak is the tile unit's
            # (measured 7.6 TFLOP/s on 2 Intel vCPUs, 31x the vdpbf16ps loop), not vdpbf16ps's
            print(f"# bf16 dot-product loop (vdpbf16ps): {dot['gflops']:.1f} GFLOP/s on {dot['threads']} threads "
                  f"(cpu-bf16's attention products)")
            print(f"# peak for cpu-bf16, measured AMX tile loop (tdpbf16ps, what the GEMMs run): {amx['gflops']:.1f} "
                  f"GFLOP/s on {amx['threads']} threads, {amx['gflops_one_thread']:.1f} on one -> MFU and GEMM "
                  f"shares below against {peak:.1f} GFLOP/s")
        else:
            print(f"# peak for cpu-bf16, measured bf16 dot-product loop (vdpbf16ps): {dot['gflops']:.1f} GFLOP/s on "
                  f"{dot['threads']} threads, {dot['gflops_one_thread']:.1f} on one -> MFU and GEMM shares below "
                  f"against {peak:.1f} GFLOP/s")
    blas = fma["blas"]
    print(f"# olmoc backend {blas['backend']} (GEMM library, its ISA; attention's kernels): {blas['gemm']}" + (f" (OPENBLAS_CORETYPE={blas['openblas_coretype']} "
          "in the environment)" if blas["openblas_coretype"] else ""))
    print(f"# {blas['backend']} SGEMM 2048^3: median {square['gflops']:.1f}, best {square['gflops_best']:.1f} GFLOP/s "
          f"= {100 * square['gflops'] / peak:.0f}% / {100 * square['gflops_best'] / peak:.0f}% of measured peak")
    def weighted(c, table, key):
        """the step's GEMM rate if each shape ran at table's rate: its FLOPs over the sum of their times"""
        tot_f = sum(2.0 * m * n * k * cnt for (m, n, k, _, _), cnt in c["shapes"].items())
        tot_t = sum(2.0 * s[0] * s[1] * s[2] * cnt / (table[s][key] * 1e9) for s, cnt in c["shapes"].items())
        return tot_f / tot_t / 1e9

    for c in cases:
        for key in ("gflops", "gflops_best"):
            c["gemm_" + key] = weighted(c, per_shape, key)
        worst = min(c["shapes"], key=lambda s: per_shape[s]["gflops_best"])
        print(f"# {blas['backend']} SGEMM at the {c['cfg'].stem} T={c['T']} B={c['B']} step's shapes (FLOP-weighted): "
              f"median {c['gemm_gflops']:.1f}, best {c['gemm_gflops_best']:.1f} GFLOP/s = "
              f"{100 * c['gemm_gflops'] / peak:.0f}% / {100 * c['gemm_gflops_best'] / peak:.0f}% of measured peak "
              f"(slowest: {worst} at {per_shape[worst]['gflops_best']:.0f})", flush=True)
        g = weighted(c, cold, "gflops")
        print(f"#   the same, each call after 64 MiB written (operands out of the L2s, as in the step): "
              f"median {g:.1f} GFLOP/s = {100 * g / peak:.0f}% of measured peak", flush=True)

    with tempfile.TemporaryDirectory(prefix="olmoc-bench-") as tmp:
        import numpy as np
        token_file = pathlib.Path(tmp) / "tokens.npy"
        vocab = max(c["model"]["vocab_size"] for c in cases)
        need = max(c["B"] * c["T"] for c in cases) * (args.steps + args.warmup) * 2
        np.save(token_file, np.random.default_rng(0).integers(2, vocab, size=need).astype(np.uint16))
        before = peak
        for c in cases:
            c["olmoc"], c["torch"] = [], []
            for _ in range(args.repeats):
                c["load_before"] = load_avg()
                c["olmoc"].append(run_olmoc(args, c["cfg"], c["T"], c["B"], c["accum"], c["window"], token_file,
                                            pathlib.Path(tmp) / "out", env))
                if not args.skip_torch:
                    c["torch"].append(run_torch(args, c["model"], c["T"], c["B"], c["accum"], c["window"], env))
                c["load_after"] = load_avg()
            # each case against the higher of the peaks measured just before and just after it
            after = measure_loops(args, env, theo)
            c["peak_before"], c["peak_after"] = before, after
            cp = c["peak"] = max(before, after)
            before = after
            o = statistics.median(r["tok_s"] for r in c["olmoc"])
            ob = max(max(r["steps_tok_s"][args.warmup:]) for r in c["olmoc"])
            # the figures each line prints, kept in the case (--json; bench/avx2_check.py reads them)
            def mfu(tok_s):  # % of this case's peak
                return 100 * c["fpt"] * tok_s / (cp * 1e9)
            summ = c["summary"] = {"olmoc_tok_s": o, "mfu": mfu(o),
                                   "olmoc_rss_mib": max(r["rss_mib"] for r in c["olmoc"])}
            g = statistics.median(r["gemm_gflops"] for r in c["olmoc"])
            a = statistics.median(r["attention_gflops"] for r in c["olmoc"])
            af = statistics.median(r["attention_fwd_gflops"] for r in c["olmoc"])
            ab = statistics.median(r["attention_bwd_gflops"] for r in c["olmoc"])
            share = c["olmoc"][0]["time_share"]
            line = (f"{c['cfg'].stem:12s} T={c['T']:5d} B={c['B']:2d} | olmoc {o:7.1f} ({ob:7.1f}) tok/s "
                    f"MFU {summ['mfu']:4.1f}% RSS {summ['olmoc_rss_mib']:6.0f} MiB "
                    f"GEMM {100 * g / cp:3.0f}% of peak ({share.get('gemm', 0):.0f}% of op time; attention "
                    f"{share.get('attention fwd', 0) + share.get('attention bwd', 0):.0f}% at {100 * a / cp:.0f}% "
                    "of peak)")
            if c["torch"]:
                t = statistics.median(r["tok_s"] for r in c["torch"])
                tb = max(max(r["steps_tok_s"][args.warmup:]) for r in c["torch"])
                summ.update(torch_tok_s=t, torch_mfu=mfu(t), torch_rss_mib=max(r["rss_mib"] for r in c["torch"]),
                            ratio=o / t)
                line += (f" | PyTorch({args.torch_mode},{args.torch_attn}) {t:7.1f} ({tb:7.1f}) tok/s "
                         f"MFU {summ['torch_mfu']:4.1f}% RSS {summ['torch_rss_mib']:6.0f} MiB"
                         f" | ratio {summ['ratio']:5.2f}x ({ob / tb:5.2f}x)")
            line += f" | load {c['load_before']} -> {c['load_after']}"
            print(line, flush=True)
            # where the time went (first repeat's OLMOC_PROFILE) and each kernel's share of the peak
            ops = ", ".join(f"{k} {v:.0f}%" for k, v in sorted(share.items(), key=lambda kv: -kv[1]) if v >= 0.5)
            print(f"{'':12s}   kernels: GEMM {g:.1f} GFLOP/s = {100 * g / cp:.0f}% of peak, attention fwd "
                  f"{af:.1f} = {100 * af / cp:.0f}%, bwd {ab:.1f} = {100 * ab / cp:.0f}% | op time: {ops} | peak "
                  f"{cp:.1f} GFLOP/s (measured before / after this case: {c['peak_before']:.1f} / "
                  f"{c['peak_after']:.1f})", flush=True)

    print(f"# load average after: {load_avg()}")
    print("# tok/s: median over the timed steps (first --warmup steps dropped) and over --repeats, in brackets the "
          "best timed step (other processes only ever slow a step down); MFU (of the median) against each case's "
          "peak: the higher of the peaks measured just before and just after it (the same loops again: these VMs' "
          "clock moves between minutes), the first before it "
          f"{peak:.1f} GFLOP/s; GEMM: in-training GEMM GFLOP/s (OLMOC_PROFILE) / peak; attention: its model "
          "FLOPs (as MFU counts them) over its time / peak; RSS: peak resident set of each process")
    if args.json:
        for c in cases:
            c["cfg"] = str(c["cfg"])
            c["shapes"] = {",".join(map(str, s)): n for s, n in c["shapes"].items()}
        args.json.write_text(json.dumps({"peak_fma": fma, "sgemm_square": square, "theoretical": theo,
                                         "cases": cases}, indent=1, default=str))


if __name__ == "__main__":
    main()
