"""olmoc vs PyTorch on the same weights and tokens.

For each scenario the C side (tests/c/fidelity_runner.c) and the reference
(olmo3_ref.py, in float64 and float32) compute: logits, step-1 losses, every
parameter gradient, and parameters after several AdamW steps.  Where the
scenario fits Hugging Face's Olmo3ForCausalLM (no document masking, no
z-loss), transformers is checked too: logits, loss and gradients.

Error measure: max |c - ref| / max |ref| over a tensor (normwise relative).
"""
import json
import subprocess

import pytest
import torch
from safetensors.torch import load_file, save_file

import olmo3_ref as ref

# Stated tolerances (normwise max relative error of fp32 C vs float64 reference).
TOL_FORWARD = 1e-5  # logits, losses
TOL_GRAD = 1e-4  # gradients (long fp32 reductions over tokens)
# Parameters after the AdamW steps: Adam divides by sqrt(v), so coordinates with
# tiny gradients amplify rounding; PyTorch's own fp32 run lands at ~6e-5 here.
TOL_PARAMS = 1e-4

SCENARIOS = {
    # name: (model overrides, train overrides)
    "mha_window": ({}, {}),
    "gqa_docmask_zloss": ({"n_kv_heads": 2}, {"intra_doc_masking": True, "z_loss": 1e-2}),
    "accum_clip_cosine": ({"n_kv_heads": 1}, {"grad_accum": 2, "clip_grad_norm": 0.05, "warmup_steps": 2}),
    "linear_anneal": ({}, {"schedule": "linear", "warmup_steps": 0, "alpha_f": 0.0, "micro_batch": 1}),
}

BASE_MODEL = dict(vocab_size=97, d_model=32, n_layers=4, n_heads=4, n_kv_heads=4, mlp_hidden=48,
                  rope_theta=500000.0, sliding_window=5, full_attention_every=4, full_attention_last=True,
                  rms_norm_eps=1e-6, init_std=0.02, eos_token_id=3, pad_token_id=1)
BASE_TRAIN = dict(seq_len=16, micro_batch=2, grad_accum=1, steps=5, seed=1, intra_doc_masking=False,
                  z_loss=1e-5, clip_grad_norm=1.0, lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8,
                  weight_decay=0.1, embedding_weight_decay=0.0, schedule="cosine", warmup_steps=2,
                  alpha_f=0.1, schedule_steps=0, log_every=1)


def yaml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v) if isinstance(v, float) else str(v)


def write_config(path, model, train):
    lines = ["model:"] + [f"  {k}: {yaml_value(v)}" for k, v in model.items()]
    lines += ["train:"] + [f"  {k}: {yaml_value(v)}" for k, v in train.items()]
    path.write_text("\n".join(lines) + "\n")


def random_params(model, seed):
    g = torch.Generator().manual_seed(seed)
    D, V, F = model["d_model"], model["vocab_size"], model["mlp_hidden"]
    hd = D // model["n_heads"]
    Q, K = model["n_heads"] * hd, model["n_kv_heads"] * hd
    shapes = {"model.embed_tokens.weight": (V, D)}
    for l in range(model["n_layers"]):
        pre = f"model.layers.{l}."
        shapes.update({
            pre + "self_attn.q_proj.weight": (Q, D), pre + "self_attn.k_proj.weight": (K, D),
            pre + "self_attn.v_proj.weight": (K, D), pre + "self_attn.o_proj.weight": (D, Q),
            pre + "self_attn.q_norm.weight": (Q,), pre + "self_attn.k_norm.weight": (K,),
            pre + "mlp.gate_proj.weight": (F, D), pre + "mlp.up_proj.weight": (F, D),
            pre + "mlp.down_proj.weight": (D, F),
            pre + "post_attention_layernorm.weight": (D,), pre + "post_feedforward_layernorm.weight": (D,),
        })
    shapes["model.norm.weight"] = (D,)
    shapes["lm_head.weight"] = (V, D)
    params = {}
    for name, shape in shapes.items():
        if len(shape) == 1:  # norm weights near 1, not exactly, so their gradients matter
            params[name] = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:  # larger than the 0.02 init so every layer contributes visibly
            params[name] = 0.2 * torch.randn(shape, generator=g)
    return params


def random_tokens(model, train, seed):
    g = torch.Generator().manual_seed(seed)
    shape = (train["steps"], train["grad_accum"], train["micro_batch"], train["seq_len"])
    tokens = torch.randint(0, model["vocab_size"], shape, generator=g)
    # sprinkle EOS so document masking has boundaries to respect
    eos = torch.rand(shape, generator=g) < 0.15
    return torch.where(eos, torch.full_like(tokens, model["eos_token_id"]), tokens)


def rel_err(c, r):
    c, r = c.double(), r.double()
    return ((c - r).abs().max() / r.abs().max().clamp_min(1e-30)).item()


def run_c(build_dir, tmp_path, model, train, params, tokens):
    cfg, wts, batch, out = (tmp_path / n for n in ("cfg.yaml", "w.safetensors", "b.safetensors", "o.safetensors"))
    write_config(cfg, model, train)
    save_file({n: t.float().contiguous() for n, t in params.items()}, str(wts))
    save_file({"tokens": tokens.reshape(train["steps"], -1).to(torch.int32).contiguous()}, str(batch))
    subprocess.run([str(build_dir / "tests" / "fidelity_runner"), str(cfg), str(wts), str(batch),
                    str(train["steps"]), str(out)], check=True)
    return load_file(str(out))


def reference(model, train, params, tokens, dtype):
    p = {n: t.to(dtype) for n, t in params.items()}
    logits = ref.forward(p, tokens[0, 0], model, train["intra_doc_masking"])
    history, grads, final = ref.train(p, list(tokens), model, train)
    return logits, torch.tensor(history, dtype=torch.float64), grads, final


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_against_pytorch_reference(name, build_dir, tmp_path):
    model = {**BASE_MODEL, **SCENARIOS[name][0]}
    train = {**BASE_TRAIN, **SCENARIOS[name][1]}
    params = random_params(model, seed=len(name))
    tokens = random_tokens(model, train, seed=7)
    out = run_c(build_dir, tmp_path, model, train, params, tokens)
    logits64, hist64, grads64, final64 = reference(model, train, params, tokens, torch.float64)
    logits32, hist32, grads32, final32 = reference(model, train, params, tokens, torch.float32)

    report = {"logits": rel_err(out["logits"], logits64),
              "logits_torch32": rel_err(logits32, logits64),
              "ce_step1": abs(out["losses"][0, 0].item() - hist64[0, 0].item()) / hist64[0, 0].item(),
              "z_step1": rel_err(out["losses"][0, 1:2], hist64[0, 1:2]),
              "grad_norm_step1": rel_err(out["losses"][0, 2:3], hist64[0, 2:3]),
              "losses_all_steps": rel_err(out["losses"][:, 0], hist64[:, 0])}
    report["grads"] = max(rel_err(out["grad." + n], g) for n, g in grads64.items())
    report["grads_torch32"] = max(rel_err(grads32[n], g) for n, g in grads64.items())
    report["params"] = max(rel_err(out["final." + n], p) for n, p in final64.items())
    report["params_torch32"] = max(rel_err(final32[n], p) for n, p in final64.items())
    print(f"\n{name}: " + json.dumps({k: f"{v:.2e}" for k, v in report.items()}))

    assert report["logits"] < TOL_FORWARD
    assert report["ce_step1"] < TOL_FORWARD
    assert report["z_step1"] < TOL_FORWARD
    assert report["grad_norm_step1"] < TOL_GRAD
    assert report["losses_all_steps"] < TOL_FORWARD * 10
    assert report["grads"] < TOL_GRAD
    assert report["params"] < TOL_PARAMS
