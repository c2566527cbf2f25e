"""Activation checkpointing (train.activation_checkpointing: feed_forward | block,
train.block_every: k) recomputes in the backward pass what the forward did not
keep, with the same ops and weights: losses, every gradient and the weights
after training must be bit-identical to a run without it, on the CPU backend
in fp32 and in cpu-bf16, while the saved activations shrink.

  * test_gradients_bit_identical: tests/c/fidelity_runner (logits, step-1
    gradients of every parameter, losses of each step, final weights) for each
    mode and block_every 1 and 2 against none, compared byte for byte; and the
    saved-activation bytes the model reserved against the formula below.
  * test_olmoc_train_bit_identical: `olmoc train` a few steps per mode; the
    metrics log (minus timings) and the final weights file byte for byte.
  * test_bf16_saved_activations: on cpu-bf16 the activations whose only use
    in the backward pass is as GEMM operands (x, h, s, the final norm's
    output) are saved as bf16; the backend rounds GEMM operands to bf16
    anyway, so every result is bit-identical to saving them in fp32, with
    fewer bytes.
"""
import json
import os
import subprocess

import pytest
import torch
from safetensors.torch import load_file

import test_fidelity as fid
from test_cli import olmoc, tiny  # noqa: F401  (tiny is a fixture)

MODES = [("feed_forward", 1), ("feed_forward", 2), ("block", 1), ("block", 2), ("block", 3)]
BACKENDS = ["cpu", "cpu-bf16"]
# "+all": train.saved_activations: bf16 (every large saved activation in bf16); the backward sees them
# rounded, recomputed ones too, so checkpointing stays bit-identical to none there as well
ALL16 = {"saved_activations": "bf16"}


def backend_and_train(spec):
    name, _, variant = spec.partition("+")
    return name, ({**TRAIN, **ALL16} if variant == "all" else TRAIN)

MODEL = {**fid.BASE_MODEL, "n_kv_heads": 2, "n_layers": 5}
TRAIN = {**fid.BASE_TRAIN, "intra_doc_masking": True, "z_loss": 1e-2, "grad_accum": 2, "steps": 3}


def act_bytes(model, train, mode, every, saved):
    """Bytes of saved activations olmo_model_reserve should allocate (the design, stated independently of
    the C code).  Per token, a layer that keeps everything holds x [D]; q_raw, q, att [Q]; k_raw, k, v [K];
    o, h, m [D]; lse [H]; rstd_q, rstd_k, rstd_o, rstd_m [1]; g, u, s [F].  A checkpointed layer (every
    `every`-th from layer 0) keeps everything but g, u, s (feed_forward) or only x (block); one shared
    recompute set (fp32) holds what they do not keep.  The final norm adds x_final, its output xn [D] and
    rstd [1].  fp32, except with saved == "bf16": x (not of a block-checkpointed layer: it reruns from it),
    h, s and xn are 2 bytes, and one fp32 [D] buffer (resid) carries the input of the layers that save x in
    bf16.  saved == "bf16all" (train.saved_activations: bf16): as "bf16", and q_raw, q, att, k_raw, k, v, o,
    m, g, u are 2 bytes too (lse and the rstd stay fp32); the shared set then always exists and is whole
    (every activation of a layer in fp32: the forward's working buffers)."""
    D, F, H = model["d_model"], model["mlp_hidden"], model["n_heads"]
    hd = D // H
    Q, K = H * hd, model["n_kv_heads"] * hd
    all16 = saved == "bf16all"
    half = 2 if saved in ("bf16", "bf16all") else 4
    big = 2 if all16 else 4
    attn_f32 = 4 * (3 * Q + 3 * K + 3 * D + H + 4)  # bytes, all fp32
    attn = big * (3 * Q + 3 * K + 2 * D) + half * D + 4 * (H + 4)  # h in the saved type
    mlp = 2 * big * F + half * F  # s in the saved type
    per_token, any_ck, any_x16 = 0, False, False
    for layer in range(model["n_layers"]):
        ck = mode != "none" and layer % every == 0
        any_ck |= ck
        if ck and mode == "block":
            per_token += 4 * D
            continue
        any_x16 |= half == 2
        per_token += half * D + attn + (mlp if not ck else 0)
    if any_ck or all16:
        per_token += 12 * F + (attn_f32 if mode == "block" or all16 else 0)
    per_token += (4 * D if any_x16 else 0) + 4 * D + half * D + 4
    return per_token * train["micro_batch"] * train["seq_len"]


def run_fidelity_runner(build_dir, tmp_path, train, params, tokens, backend, saved=None):
    out = tmp_path / "out.safetensors"
    cfg, wts, batch = tmp_path / "cfg.yaml", tmp_path / "w.safetensors", tmp_path / "b.safetensors"
    fid.write_config(cfg, MODEL, train)
    from safetensors.torch import save_file
    save_file({n: t.float().contiguous() for n, t in params.items()}, str(wts))
    save_file({"tokens": tokens.reshape(train["steps"], -1).to(torch.int32).contiguous()}, str(batch))
    subprocess.run([str(build_dir / "tests" / "fidelity_runner"), str(cfg), str(wts), str(batch),
                    str(train["steps"]), str(out), backend, *([saved] if saved else [])], check=True)
    return load_file(str(out))


def same_bytes(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.numpy().tobytes() == b.numpy().tobytes()


@pytest.mark.parametrize("spec", BACKENDS + ["cpu-bf16+all"])
def test_gradients_bit_identical(spec, build_dir, tmp_path):
    backend, base_train = backend_and_train(spec)
    params = fid.random_params(MODEL, seed=3)
    tokens = fid.random_tokens(MODEL, TRAIN, seed=5)
    base_dir = tmp_path / "none"
    base_dir.mkdir()
    base = run_fidelity_runner(build_dir, base_dir, base_train, params, tokens, backend)
    # the default: bf16 where the GEMMs are bf16
    saved = "bf16all" if base_train is not TRAIN else "bf16" if backend == "cpu-bf16" else "f32"
    assert base["act_bytes"].item() == act_bytes(MODEL, TRAIN, "none", 1, saved)
    grads = [n for n in base if n.startswith("grad.")]
    assert len(grads) == 3 + 11 * MODEL["n_layers"]
    sizes = {}
    for mode, every in MODES:
        d = tmp_path / f"{mode}{every}"
        d.mkdir()
        train = {**base_train, "activation_checkpointing": mode, "block_every": every}
        out = run_fidelity_runner(build_dir, d, train, params, tokens, backend)
        differing = [n for n in base if n != "act_bytes" and not same_bytes(out[n], base[n])]
        assert not differing, f"{spec} {mode} block_every={every}: not bit-identical: {differing[:8]}"
        sizes[f"{mode}/{every}"] = out["act_bytes"].item()
        assert sizes[f"{mode}/{every}"] == act_bytes(MODEL, train, mode, every, saved), (mode, every)
    none = base["act_bytes"].item()
    print(f"\n{spec}: saved-activation bytes, none {none:.0f}; " +
          ", ".join(f"{k} {v:.0f} ({v / none:.2f}x)" for k, v in sizes.items()))
    # memory actually drops, and more with more checkpointed blocks
    assert sizes["feed_forward/1"] < sizes["feed_forward/2"] < none
    assert sizes["block/1"] < sizes["block/2"] < none
    assert sizes["block/1"] < sizes["feed_forward/1"]


@pytest.mark.parametrize("mode,every", [("none", 1), ("feed_forward", 2), ("block", 2)])
def test_bf16_saved_activations(mode, every, build_dir, tmp_path):
    params = fid.random_params(MODEL, seed=4)
    tokens = fid.random_tokens(MODEL, TRAIN, seed=6)
    train = {**TRAIN, "activation_checkpointing": mode, "block_every": every}
    outs = {}
    for saved in ("f32", "bf16"):
        d = tmp_path / saved
        d.mkdir()
        outs[saved] = run_fidelity_runner(build_dir, d, train, params, tokens, "cpu-bf16", saved)
        assert outs[saved]["act_bytes"].item() == act_bytes(MODEL, train, mode, every, saved)
    differing = [n for n in outs["f32"] if n != "act_bytes" and not same_bytes(outs["f32"][n], outs["bf16"][n])]
    assert not differing, f"bf16 saved activations change {differing[:8]}"
    f32, bf16 = outs["f32"]["act_bytes"].item(), outs["bf16"]["act_bytes"].item()
    print(f"\ncpu-bf16 {mode}/{every}: saved activations f32 {f32:.0f} B, bf16 {bf16:.0f} B ({bf16 / f32:.2f}x)")
    assert bf16 < f32


def rel_diff(a, b):
    return (a.double() - b.double()).norm().item() / b.double().norm().item()


def test_all_saved_activations_in_bf16(build_dir, tmp_path):
    """train.saved_activations: bf16 on cpu-bf16: the forward is unchanged (logits bit-identical to exact);
    the backward sees the saved activations rounded to bf16, so the gradients move, by much less than
    cpu-bf16's own distance from fp32 (measured: at most 1.0e-2 relative per tensor against 1.0e-1), and
    the saved activations shrink."""
    params = fid.random_params(MODEL, seed=4)
    tokens = fid.random_tokens(MODEL, TRAIN, seed=6)
    outs = {}
    for name, backend, train in (("fp32", "cpu", TRAIN), ("exact", "cpu-bf16", TRAIN),
                                 ("all", "cpu-bf16", {**TRAIN, **ALL16})):
        d = tmp_path / name
        d.mkdir()
        outs[name] = run_fidelity_runner(build_dir, d, train, params, tokens, backend)
    assert same_bytes(outs["all"]["logits"], outs["exact"]["logits"])
    grads = [n for n in outs["fp32"] if n.startswith("grad.")]
    moved = {n: rel_diff(outs["all"][n], outs["exact"][n]) for n in grads}
    bf16_error = {n: rel_diff(outs["exact"][n], outs["fp32"][n]) for n in grads}
    print(f"\nsaved_activations bf16 vs exact: gradients at most {max(moved.values()):.2e} relative (cpu-bf16 vs fp32: "
          f"{max(bf16_error.values()):.2e}); losses {rel_diff(outs['all']['losses'], outs['exact']['losses']):.2e}")
    assert max(moved.values()) > 0  # in effect
    assert max(moved.values()) <= 0.05 and max(moved.values()) <= 0.5 * max(bf16_error.values())
    assert rel_diff(outs["all"]["losses"], outs["exact"]["losses"]) <= 5e-3
    assert outs["all"]["act_bytes"].item() < outs["exact"]["act_bytes"].item()


def test_bf16_saved_activations_refused_on_fp32_backend(build_dir, tmp_path):
    params = fid.random_params(MODEL, seed=4)
    tokens = fid.random_tokens(MODEL, TRAIN, seed=6)
    with pytest.raises(subprocess.CalledProcessError):
        run_fidelity_runner(build_dir, tmp_path, TRAIN, params, tokens, "cpu", "bf16")
    with pytest.raises(subprocess.CalledProcessError):
        run_fidelity_runner(build_dir, tmp_path, {**TRAIN, **ALL16}, params, tokens, "cpu")


RESULT_KEYS = ("type", "step", "loss", "z_loss", "grad_norm", "lr", "tokens")  # the rest are timings


def metrics(path):
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: row[k] for k in RESULT_KEYS if k in row} for row in rows]


# tests/c/cuda_emu: the CUDA backend's source compiled for the host (slow: one backend, fewer modes and steps;
# cuda-bf16 covers the checkpointing and the bf16 saved activations on the CUDA code path)
EMULATED = ["cuda-bf16", "cuda-bf16+all"]


@pytest.mark.parametrize("spec", BACKENDS + ["cpu-bf16+all"] + [pytest.param(s, marks=pytest.mark.slow) for s in EMULATED])
def test_olmoc_train_bit_identical(spec, build_dir, tiny, tmp_path):  # noqa: F811
    cfg, data = tiny
    backend, variant = spec.partition("+")[::2]
    saved = ["--set", "train.saved_activations=bf16"] if variant == "all" else []
    binary = build_dir / "tests" / "olmoc_emu" if backend in EMULATED else build_dir / "olmoc"
    if not binary.exists():
        pytest.skip("olmoc_emu not built (needs a C++ compiler: OLMOC_CUDA_EMULATION_TEST)")
    modes = MODES[:4] if backend not in EMULATED else [("feed_forward", 1), ("block", 2)]
    steps = 4 if backend not in EMULATED else 2

    def train(name, *extra):
        out = tmp_path / name
        args = ["train", cfg, "--backend", backend, "--set", f"data.train_path={data}",
                "--set", f"data.out_dir={out}", "--set", "train.peak_flops=1e12", "--set", f"train.steps={steps}",
                "--set", "train.intra_doc_masking=true", "--set", "train.z_loss=1e-3", *saved, *extra]
        if backend in EMULATED:  # a kernel's threads on one CPU thread: idle OpenMP threads must not spin
            env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="passive")
            r = subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, env=env, timeout=600)
        else:
            r = olmoc(build_dir, *args)
        assert r.returncode == 0, r.stderr
        return metrics(out / "metrics.jsonl"), (out / "model.safetensors").read_bytes()

    base_metrics, base_weights = train("none")
    assert len(base_metrics) == steps and all("loss" in json.dumps(m) for m in base_metrics)
    for mode, every in modes:
        m, w = train(f"{mode}{every}", "--set", f"train.activation_checkpointing={mode}",
                     "--set", f"train.block_every={every}")
        assert m == base_metrics, (mode, every)
        assert w == base_weights, (mode, every)


def test_config_refuses_bad_values(build_dir, tiny, tmp_path):  # noqa: F811
    cfg, data = tiny
    for setting, message in (("train.activation_checkpointing=selective", "train.activation_checkpointing"),
                             ("train.block_every=0", "train.block_every must be >= 1")):
        r = olmoc(build_dir, "train", cfg, "--set", f"data.train_path={data}", "--set",
                  f"data.out_dir={tmp_path / 'x'}", "--set", setting)
        assert r.returncode == 1 and message in r.stderr, r.stderr
