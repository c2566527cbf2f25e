"""Independent PyTorch reference of the Olmo 3 model and training step.

Written from the public descriptions (OLMo-core's Olmo 3 configs and
transformers' Olmo3 model), not from olmoc's C code, so that a shared
misunderstanding is less likely.  It runs in float64 or float32: float64
gives the "true" values the C fp32 numbers are measured against.

Parameters are a dict keyed by Hugging Face Olmo3ForCausalLM names.
"""
import math

import torch
import torch.nn.functional as F


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope_cos_sin(seq_len, head_dim, theta, dtype):
    # transformers computes the table in float32; in float64 mode we go exact.
    ft = torch.float64 if dtype == torch.float64 else torch.float32
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(ft) / head_dim))
    angles = torch.arange(seq_len, dtype=ft)[:, None] * inv_freq[None, :]
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def layer_is_full(cfg, layer):
    if cfg["full_attention_last"] and layer == cfg["n_layers"] - 1:
        return True
    every = cfg["full_attention_every"]
    return every > 0 and (layer + 1) % every == 0


def attention_mask(tokens, window, eos_id, doc_masking):
    """Boolean [B, 1, T, T]: True where query t may attend to key j."""
    B, T = tokens.shape
    q = torch.arange(T)[:, None]
    k = torch.arange(T)[None, :]
    allowed = k <= q
    if window > 0:
        allowed = allowed & (q - k < window)
    allowed = allowed[None].expand(B, T, T)
    if doc_masking:
        # each EOS closes its document: doc id = number of EOS strictly before t
        is_eos = (tokens == eos_id).long()
        doc = torch.cumsum(is_eos, dim=1) - is_eos
        allowed = allowed & (doc[:, :, None] == doc[:, None, :])
    return allowed[:, None]


def forward(params, tokens, cfg, doc_masking=False):
    """Logits [B, T, V]."""
    B, T = tokens.shape
    D, H, HK = cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"]
    hd = D // H
    eps = cfg["rms_norm_eps"]
    dtype = params["model.embed_tokens.weight"].dtype
    cos, sin = rope_cos_sin(T, hd, cfg["rope_theta"], dtype)
    x = params["model.embed_tokens.weight"][tokens]
    for l in range(cfg["n_layers"]):
        p = lambda n: params[f"model.layers.{l}.{n}.weight"]
        q = rms_norm(x @ p("self_attn.q_proj").T, p("self_attn.q_norm"), eps)
        k = rms_norm(x @ p("self_attn.k_proj").T, p("self_attn.k_norm"), eps)
        v = x @ p("self_attn.v_proj").T
        q = q.view(B, T, H, hd).transpose(1, 2)
        k = k.view(B, T, HK, hd).transpose(1, 2)
        v = v.view(B, T, HK, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // HK, dim=1)
        v = v.repeat_interleave(H // HK, dim=1)
        window = 0 if layer_is_full(cfg, l) else cfg["sliding_window"]
        mask = attention_mask(tokens, window, cfg["eos_token_id"], doc_masking)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        scores = scores.masked_fill(~mask, float("-inf"))
        att = torch.softmax(scores, dim=-1) @ v
        att = att.transpose(1, 2).reshape(B, T, H * hd)
        h = x + rms_norm(att @ p("self_attn.o_proj").T, p("post_attention_layernorm"), eps)
        mlp = (F.silu(h @ p("mlp.gate_proj").T) * (h @ p("mlp.up_proj").T)) @ p("mlp.down_proj").T
        x = h + rms_norm(mlp, p("post_feedforward_layernorm"), eps)
    x = rms_norm(x, params["model.norm.weight"], eps)
    return x @ params["lm_head.weight"].T


def labels_for(tokens):
    """OLMo-core labels: inputs shifted left, last position ignored (-100)."""
    labels = torch.full_like(tokens, -100)
    labels[:, :-1] = tokens[:, 1:]
    return labels


def loss_sums(logits, labels):
    """(sum of CE, sum of logsumexp^2) over labels != -100."""
    flat = logits.reshape(-1, logits.shape[-1])
    lab = labels.reshape(-1)
    keep = lab != -100
    ce = F.cross_entropy(flat, lab, ignore_index=-100, reduction="sum")
    lse = torch.logsumexp(flat[keep], dim=-1)
    return ce, (lse * lse).sum()


def lr_at(tcfg, step):
    """OLMo-core CosWithWarmup / LinearWithWarmup / constant, step is 1-based."""
    peak = tcfg["lr"]
    eta_min = peak * tcfg["alpha_f"]
    t_max = tcfg.get("schedule_steps") or tcfg["steps"]
    warm = tcfg["warmup_steps"]
    if tcfg["schedule"] == "constant":
        return peak
    if step < warm:
        return peak * step / warm
    if step >= t_max:
        return eta_min
    frac = (step - warm) / (t_max - warm)
    if tcfg["schedule"] == "cosine":
        return eta_min + (peak - eta_min) * (1 + math.cos(math.pi * frac)) / 2
    return peak - frac * (peak - eta_min)


def train(params, batches, cfg, tcfg):
    """Runs len(batches) optimizer steps; batches[s] is [accum, micro, T].

    Returns (per-step [ce, z, grad_norm], step-1 gradients, final params)."""
    params = {n: t.detach().clone().requires_grad_(True) for n, t in params.items()}
    embed = [params["model.embed_tokens.weight"]]
    rest = [t for n, t in params.items() if n != "model.embed_tokens.weight"]
    opt = torch.optim.AdamW(
        [
            {"params": embed, "weight_decay": tcfg["embedding_weight_decay"]},
            {"params": rest, "weight_decay": tcfg["weight_decay"]},
        ],
        lr=tcfg["lr"], betas=(tcfg["beta1"], tcfg["beta2"]), eps=tcfg["eps"], foreach=False,
    )
    history, first_grads = [], None
    for s, batch in enumerate(batches):
        opt.zero_grad()
        n_labels = sum(int((labels_for(mb) != -100).sum()) for mb in batch)
        ce_tot = z_tot = 0.0
        for mb in batch:
            logits = forward(params, mb, cfg, tcfg["intra_doc_masking"])
            ce, zz = loss_sums(logits, labels_for(mb))
            ((ce + tcfg["z_loss"] * zz) / n_labels).backward()
            ce_tot += ce.item()
            z_tot += zz.item()
        if s == 0:
            first_grads = {n: t.grad.detach().clone() for n, t in params.items()}
        all_params = list(params.values())
        if tcfg["clip_grad_norm"] > 0:
            norm = torch.nn.utils.clip_grad_norm_(all_params, tcfg["clip_grad_norm"]).item()
        else:
            norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in all_params)).item()
        for g in opt.param_groups:
            g["lr"] = lr_at(tcfg, s + 1)
        opt.step()
        history.append([ce_tot / n_labels, tcfg["z_loss"] * z_tot / n_labels, norm])
    return history, first_grads, {n: t.detach() for n, t in params.items()}
