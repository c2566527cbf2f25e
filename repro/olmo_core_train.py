"""The OLMo-core side of the reproduction study: trains the same recipe as
`olmoc train` with OLMo-core's own components, on the batches OLMo-core's own
data loader deals, and evaluates it the same way.

  model      TransformerConfig.olmo3_7B (OLMo-core's Olmo 3 factory) scaled down
             to the config's shape; weights loaded from --init (Hugging Face
             names, converted by olmo_core.nn.hf.convert_state_from_hf)
  optimizer  olmo_core.optim.SkipStepAdamW (train.optimizer: skip_step_adamw) or
             torch AdamW (adamw); OLMo-core's groups (no weight decay on the input
             embedding); the Trainer's zero-LR initial step (get_optimizer_state_dict
             on the fresh optimizer) when train.optim_init_step is true
  schedule   olmo_core.optim.scheduler CosWithWarmup (cosine / cos_with_warmup) or
             LinearWithWarmup (linear / linear_with_warmup), set per group with
             the Trainer's 1-based global step
  data       olmo_core.data.NumpyFSLDataset over the config's data.mix files
             (raw uint16 memmaps joined with '+'), NumpyFSLDataLoader with
             train.seed and the global batch, epochs 1, 2, ...
  loss, clip what TransformerTrainModule does: get_labels, sum-reduced CE + z-loss
             divided by the batch's label count, its _clip_grad_norm
--check-batches compares every batch with the ones olmoc trained on (`olmoc
train --dump-batches`); a difference stops the run.  --init-from continues
from another run of this script (weights and optimizer state: Adam's moments
and step, as OLMo-core's load_optim_state=True, load_trainer_state=False),
with a fresh schedule, step counter and data order; the param groups take the
new config's learning rate.
--threads and --micro-batch change only the order of floating-point sums (the
study's second OLMo-core run, which measures the reference's own noise).
--norm-fp64 sums the clipping norm's squares in float64 instead of torch's
fp32 get_total_norm (the study's third run: the same clip, another rounding).
Writes OUT/metrics.jsonl (olmoc's schema), OUT/model.safetensors (Hugging
Face names) and OUT/state.pt (OLMo-core state dicts of model and optimizer).
"""
import argparse
import json
import math
import pathlib
import time
from types import SimpleNamespace

import numpy as np
import torch
import yaml
from safetensors.torch import load_file, save_file

import olmo_core.data as olmo_data
from olmo_core.data.utils import get_labels
from olmo_core.nn.attention import AttentionBackendName, SlidingWindowAttentionConfig
from olmo_core.nn.hf.config import get_hf_config
from olmo_core.nn.hf.convert import convert_state_from_hf, convert_state_to_hf
from olmo_core.nn.transformer import TransformerConfig
from olmo_core.optim import SkipStepAdamW
from olmo_core.optim.scheduler import CosWithWarmup, LinearWithWarmup
from olmo_core.train.train_module.transformer.train_module import TransformerTrainModule
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict


def short_name(path, ext):
    base = pathlib.Path(path).name
    return base[: -len(ext)] if base.endswith(ext) and len(base) > len(ext) else base


def split_list(s):
    return [p.strip() for p in (s or "").split(",") if p.strip()]


def read_config(path):
    cfg = yaml.safe_load(open(path))
    for section in ("model", "train"):  # PyYAML reads exponents without a dot ("1e-08") as strings
        for k, v in cfg[section].items():
            if isinstance(v, str):
                try:
                    cfg[section][k] = float(v)
                except ValueError:
                    pass
    return cfg


def truthy(v):
    return v is True or str(v).lower() == "true"


def build_model(m):
    every = int(m["full_attention_every"])
    pattern = [int(m["sliding_window"])] * (every - 1) + [-1] if every > 0 else [int(m["sliding_window"])]
    cfg = TransformerConfig.olmo3_7B(
        vocab_size=int(m["vocab_size"]), attn_backend=AttentionBackendName.torch,
        sliding_window=SlidingWindowAttentionConfig(
            pattern=pattern, force_full_attention_on_first_layer=False,
            force_full_attention_on_last_layer=truthy(m.get("full_attention_last", True))))
    cfg.d_model, cfg.n_layers = int(m["d_model"]), int(m["n_layers"])
    cfg.block.sequence_mixer.n_heads = int(m["n_heads"])
    if int(m["n_kv_heads"]) != int(m["n_heads"]):
        cfg.block.sequence_mixer.n_kv_heads = int(m["n_kv_heads"])
    cfg.block.feed_forward.hidden_size = int(m["mlp_hidden"])
    cfg.block.sequence_mixer.rope.theta = int(m["rope_theta"])
    for norm in (cfg.block.layer_norm, cfg.block.sequence_mixer.qk_norm, cfg.lm_head.layer_norm):
        norm.eps = float(m["rms_norm_eps"])
    cfg.init_std = float(m["init_std"])
    return cfg.build(init_device="cpu")


def scheduler(t):
    name = t["schedule"]
    if name in ("cosine", "cos_with_warmup"):
        return CosWithWarmup(warmup=int(t["warmup_steps"]), alpha_f=float(t["alpha_f"]))
    if name in ("linear", "linear_with_warmup"):
        return LinearWithWarmup(warmup=int(t["warmup_steps"]), alpha_f=float(t["alpha_f"]))
    raise SystemExit(f"olmo_core_train: train.schedule {name} is not one this study uses")


def batches(paths, m, t, seed, global_rows, work):
    """OLMo-core's data loader, epoch after epoch: yields (global_rows x seq_len) int64 batches."""
    ds = olmo_data.NumpyFSLDataset(*paths, sequence_length=int(t["seq_len"]), pad_token_id=int(m["pad_token_id"]),
                                   eos_token_id=int(m["eos_token_id"]), vocab_size=int(m["vocab_size"]),
                                   dtype=np.uint16)
    ds.work_dir = work
    dl = olmo_data.NumpyDataLoaderBase.wrap_numpy_dataset(
        ds, global_batch_size=global_rows * int(t["seq_len"]),
        collator=olmo_data.DataCollator(pad_token_id=int(m["pad_token_id"])), work_dir=work, seed=seed,
        dp_world_size=1, dp_rank=0, num_threads=1)
    epoch = 1
    while True:
        dl.reshuffle(epoch=epoch, in_memory=True)
        for b in dl:
            yield b["input_ids"]
        dl.reset()
        epoch += 1


@torch.no_grad()
def val_loss(model, t, path):
    """olmoc's held-out loss: mean CE over the first eval_batches micro-batches of consecutive windows."""
    T, B = int(t["seq_len"]), int(t["micro_batch"])
    tokens = np.load(path, mmap_mode="r")
    n = min(len(tokens) // T // B, int(t["eval_batches"]))
    ce = labels = 0
    for b in range(n):
        x = torch.from_numpy(np.array(tokens[b * B * T:(b + 1) * B * T], dtype=np.int64)).view(B, T)
        out = model(x, labels=get_labels({"input_ids": x}), loss_reduction="sum")
        ce += out.ce_loss.item()
        labels += B * (T - 1)
    return ce / labels


@torch.no_grad()
def mc_accuracy(model, m, t, path):
    """acc and acc_per_token of a multiple-choice task (olmoc eval's definitions: left-truncated
    context, sum of the choice tokens' log-probabilities)."""
    T = int(t["seq_len"])
    correct = correct_tok = n = 0
    for line in open(path):
        if not line.strip():
            continue
        ex = json.loads(line)
        rows = [ex["context"][-(T - len(c)):] + c for c in ex["choices"]]
        width = max(map(len, rows))
        # right padding never reaches earlier positions through causal attention
        x = torch.tensor([r + [int(m["pad_token_id"])] * (width - len(r)) for r in rows])
        logp = torch.log_softmax(model(x).double(), dim=-1)
        scores = []
        for i, choice in enumerate(ex["choices"]):
            start = len(rows[i]) - len(choice)
            lp = sum(logp[i, start + j - 1, tok].item() for j, tok in enumerate(choice))
            scores.append((lp, lp / len(choice)))
        best = max(range(len(scores)), key=lambda c: (scores[c][0], -c))
        best_tok = max(range(len(scores)), key=lambda c: (scores[c][1], -c))
        correct += best == ex["label"]
        correct_tok += best_tok == ex["label"]
        n += 1
    return correct / n, correct_tok / n, n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", help="the resolved config.yaml of the olmoc run of this stage")
    start_from = ap.add_mutually_exclusive_group(required=True)
    start_from.add_argument("--init", help="starting weights (safetensors, Hugging Face names)")
    start_from.add_argument("--init-from", help="OUT of an earlier run: its weights and optimizer state")
    ap.add_argument("--out", required=True)
    ap.add_argument("--check-batches", help="olmoc's --dump-batches file: every batch must be the same")
    ap.add_argument("--tasks", default="", help="multiple-choice task files (comma-separated) to score after "
                    "the last step")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    ap.add_argument("--micro-batch", type=int, default=0, help="rows per forward/backward (default: the config's; "
                    "the global batch stays the same, only the gradient's summation order changes)")
    ap.add_argument("--norm-fp64", action="store_true", help="the clipping norm summed in float64 (torch's "
                    "get_total_norm sums in fp32); the clip itself is OLMo-core's clip_grads_with_norm_")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = read_config(args.config)
    m, t, d = cfg["model"], cfg["train"], cfg["data"]
    if truthy(t.get("intra_doc_masking", False)):
        raise SystemExit("olmo_core_train: train.intra_doc_masking is not supported here")
    if d.get("order") != "olmo_core" or ":" in d["mix"]:
        raise SystemExit("olmo_core_train: needs data.order olmo_core and an unweighted data.mix (a+b+...)")
    T, steps = int(t["seq_len"]), int(t["steps"])
    rows = int(t["micro_batch"]) * int(t["grad_accum"])
    micro = args.micro_batch or int(t["micro_batch"])
    if rows % micro:
        raise SystemExit(f"olmo_core_train: --micro-batch {micro} does not divide the batch of {rows} rows")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    model = build_model(m)
    hf_config = get_hf_config(model)
    embed = [p for n, p in model.named_parameters() if n == "embeddings.weight"]
    rest = [p for n, p in model.named_parameters() if n != "embeddings.weight"]
    groups = [{"params": embed, "weight_decay": float(t["embedding_weight_decay"])},
              {"params": rest, "weight_decay": float(t["weight_decay"])}]
    kw = dict(lr=float(t["lr"]), betas=(float(t["beta1"]), float(t["beta2"])), eps=float(t["eps"]),
              weight_decay=float(t["weight_decay"]))
    skip_step = t.get("optimizer", "adamw") == "skip_step_adamw"
    if skip_step:
        opt = SkipStepAdamW(groups, rolling_interval_length=int(t["rolling_interval_length"]),
                            sigma_factor=int(t["sigma_factor"]),
                            step_increment_bugfix=truthy(t.get("step_increment_bugfix", True)), foreach=False, **kw)
    else:
        opt = torch.optim.AdamW(groups, foreach=False, **kw)
    if args.init:
        state = convert_state_from_hf(hf_config, load_file(args.init))
        model.load_state_dict(state)
        if truthy(t.get("optim_init_step", False)):
            get_optimizer_state_dict(model, opt)  # the Trainer's step-0 checkpoint: one zero-LR step
    else:
        prev = torch.load(pathlib.Path(args.init_from) / "state.pt", weights_only=True)
        model.load_state_dict(prev["model"])
        opt.load_state_dict(prev["optim"])  # moments and each parameter's step
        for g in opt.param_groups:  # this stage's schedule, from its own peak
            g["lr"] = g["initial_lr"] = float(t["lr"])
    sched = scheduler(t)
    check = None
    if args.check_batches:
        check = np.fromfile(args.check_batches, dtype=np.int32)
        if check.size != steps * rows * T:
            raise SystemExit(f"olmo_core_train: {args.check_batches} holds {check.size} tokens, expected "
                             f"{steps} steps x {rows} rows x {T}")
        check = check.reshape(steps, rows, T)
    data = batches([p for p in d["mix"].split("+")], m, t, int(t["seed"]), rows, out / "work")
    val_paths, z = split_list(d.get("val_paths")), float(t["z_loss"])
    metrics = open(out / "metrics.jsonl", "w")
    started = time.time()
    for step in range(1, steps + 1):
        batch = next(data)
        if check is not None and not np.array_equal(batch.numpy(), check[step - 1]):
            raise SystemExit(f"olmo_core_train: batch {step} differs from olmoc's")
        model.train()
        opt.zero_grad(set_to_none=True)
        labels = get_labels({"input_ids": batch})
        n_labels = (labels != -100).sum()
        ce = zz = 0.0
        for i in range(0, rows, micro):
            o = model(batch[i:i + micro], labels=labels[i:i + micro], loss_reduction="sum",
                      z_loss_multiplier=z, loss_div_factor=n_labels)
            o.loss.backward()
            ce += o.ce_loss.detach()
            zz += o.z_loss.detach()
        if args.norm_fp64:
            params = list(model.parameters())
            norm = torch.stack([p.grad.double().square().sum() for p in params]).sum().sqrt().float()
            if float(t["clip_grad_norm"]) > 0:
                torch.nn.utils.clip_grads_with_norm_(params, float(t["clip_grad_norm"]), norm)
        elif float(t["clip_grad_norm"]) > 0:
            norm = TransformerTrainModule._clip_grad_norm(SimpleNamespace(model=model), float(t["clip_grad_norm"]))
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
        if skip_step:
            opt.latest_loss = ce
            opt.latest_grad_norm = norm
        for g in opt.param_groups:
            lr = sched.set_lr(g, SimpleNamespace(global_step=step, max_steps=steps))
        opt.step()
        elapsed = time.time() - started
        rec = {"type": "train", "step": step, "loss": float(ce), "z_loss": float(zz), "grad_norm": float(norm),
               "lr": float(lr), "tokens": step * rows * T, "tokens_per_s": step * rows * T / elapsed,
               "elapsed": elapsed}
        if skip_step and bool(opt.step_skipped.item()):
            rec["skipped"] = True
        metrics.write(json.dumps(rec) + "\n")
        every = int(t.get("eval_every", 0))
        if every and (step % every == 0 or step == steps):
            model.eval()
            for path in val_paths:
                loss = val_loss(model, t, path)
                metrics.write(json.dumps({"type": "eval", "step": step, "set": short_name(path, ".npy"),
                                          "loss": loss, "ppl": math.exp(loss)}) + "\n")
        if step == steps and args.tasks:
            model.eval()
            for path in split_list(args.tasks):
                acc, acc_tok, n = mc_accuracy(model, m, t, path)
                metrics.write(json.dumps({"type": "downstream", "step": step, "task": short_name(path, ".jsonl"),
                                          "acc": acc, "acc_per_token": acc_tok, "n": n}) + "\n")
        metrics.flush()
        if step % 20 == 0 or step == steps:
            print(f"OLMo-core step {step}/{steps} | loss {float(ce):.4f} | {step * rows * T / elapsed:.0f} tok/s",
                  flush=True)
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, out / "state.pt")
    hf = convert_state_to_hf(hf_config, {n: p.detach() for n, p in model.named_parameters()})
    save_file({n: v.contiguous() for n, v in hf.items()}, str(out / "model.safetensors"))


if __name__ == "__main__":
    main()
