"""The PyTorch side of the reproduction study: trains the same Olmo 3 model
with the same recipe as `olmoc train`, on the same token batches in the same
order, and evaluates it the same way.

Inputs come from an olmoc run of the same stage:
  CONFIG   the resolved config.yaml olmoc wrote to its out_dir (every value)
  INIT     the starting weights (safetensors, Hugging Face names)
  BATCHES  the token batches olmoc trained on (`olmoc train --dump-batches`)
The model is tests/python/olmo3_ref.py (independent of the C code); the
optimizer is torch.optim.AdamW with OLMo-core's groups (no decay on the input
embedding), the schedule OLMo-core's, gradient clipping torch's own.
Writes OUT/metrics.jsonl (the schema of olmoc's) and OUT/model.safetensors.
"""
import argparse
import json
import math
import pathlib
import sys
import time

import numpy as np
import torch
import yaml
from safetensors.torch import load_file, save_file

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))
import olmo3_ref as ref  # noqa: E402


def short_name(path, ext):
    base = pathlib.Path(path).name
    return base[: -len(ext)] if base.endswith(ext) and len(base) > len(ext) else base


def split_list(s):
    return [p.strip() for p in (s or "").split(",") if p.strip()]


@torch.no_grad()
def val_loss(params, model_cfg, train_cfg, path):
    """Mean CE over the first eval_batches micro-batches of consecutive windows."""
    T, B = train_cfg["seq_len"], train_cfg["micro_batch"]
    tokens = np.load(path, mmap_mode="r")
    batches = min(len(tokens) // T // B, train_cfg["eval_batches"])
    ce = labels = 0
    for b in range(batches):
        x = torch.from_numpy(np.array(tokens[b * B * T:(b + 1) * B * T], dtype=np.int64)).view(B, T)
        logits = ref.forward(params, x, model_cfg, train_cfg["intra_doc_masking"])
        s, _ = ref.loss_sums(logits, ref.labels_for(x))
        ce += s.item()
        labels += B * (T - 1)
    return ce / labels


@torch.no_grad()
def mc_accuracy(params, model_cfg, train_cfg, path):
    """acc and acc_per_token of a multiple-choice task (olmoc's definitions:
    left-truncated context, sum of the choice tokens' log-probabilities)."""
    T = train_cfg["seq_len"]
    correct = correct_tok = n = 0
    for line in open(path):
        if not line.strip():
            continue
        ex = json.loads(line)
        rows = [ex["context"][-(T - len(c)):] + c for c in ex["choices"]]
        width = max(map(len, rows))
        # right padding never reaches earlier positions through causal attention
        x = torch.tensor([r + [model_cfg["pad_token_id"]] * (width - len(r)) for r in rows])
        logp = torch.log_softmax(ref.forward(params, x, model_cfg, False).double(), dim=-1)
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
    ap.add_argument("config")
    ap.add_argument("--init", required=True)
    ap.add_argument("--batches", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tasks", default="", help="multiple-choice task files (comma-separated) to score after "
                    "the last step (in addition to the config's data.eval_tasks at every evaluation)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: all cores)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = yaml.safe_load(open(args.config))
    for section in ("model", "train"):  # PyYAML reads exponents without a dot ("1e-08") as strings
        for k, v in cfg[section].items():
            if isinstance(v, str):
                try:
                    cfg[section][k] = float(v)
                except ValueError:
                    pass
    model_cfg, train_cfg, data_cfg = cfg["model"], cfg["train"], cfg["data"]
    T, steps = train_cfg["seq_len"], train_cfg["steps"]
    rows = train_cfg["micro_batch"] * train_cfg["grad_accum"]
    batches = np.fromfile(args.batches, dtype=np.int32)
    if batches.size != steps * rows * T:
        raise SystemExit(f"torch_train: {args.batches} holds {batches.size} tokens, expected "
                         f"{steps} steps x {rows} rows x {T}")
    batches = batches.reshape(steps, train_cfg["grad_accum"], train_cfg["micro_batch"], T)

    params = {n: t.float().clone().requires_grad_(True) for n, t in load_file(args.init).items()}
    embed = [params["model.embed_tokens.weight"]]
    rest = [t for n, t in params.items() if n != "model.embed_tokens.weight"]
    opt = torch.optim.AdamW(
        [{"params": embed, "weight_decay": train_cfg["embedding_weight_decay"]},
         {"params": rest, "weight_decay": train_cfg["weight_decay"]}],
        lr=train_cfg["lr"], betas=(train_cfg["beta1"], train_cfg["beta2"]), eps=train_cfg["eps"], foreach=False)
    val_paths, tasks = split_list(data_cfg.get("val_paths")), split_list(data_cfg.get("eval_tasks"))
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    metrics = open(out / "metrics.jsonl", "w")
    start = time.time()
    for step in range(1, steps + 1):
        opt.zero_grad(set_to_none=False)
        n_labels = rows * (T - 1)
        ce_tot = z_tot = 0.0
        for mb in batches[step - 1]:
            x = torch.from_numpy(mb.astype(np.int64))
            ce, zz = ref.loss_sums(ref.forward(params, x, model_cfg, train_cfg["intra_doc_masking"]), ref.labels_for(x))
            ((ce + train_cfg["z_loss"] * zz) / n_labels).backward()
            ce_tot += ce.item()
            z_tot += zz.item()
        if train_cfg["clip_grad_norm"] > 0:
            norm = torch.nn.utils.clip_grad_norm_(list(params.values()), train_cfg["clip_grad_norm"]).item()
        else:
            norm = math.sqrt(sum((p.grad.double() ** 2).sum().item() for p in params.values()))
        lr = ref.lr_at(train_cfg, step)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        elapsed = time.time() - start
        metrics.write(json.dumps({"type": "train", "step": step, "loss": ce_tot / n_labels,
                                  "z_loss": train_cfg["z_loss"] * z_tot / n_labels, "grad_norm": norm, "lr": lr,
                                  "tokens": step * rows * T, "tokens_per_s": step * rows * T / elapsed,
                                  "elapsed": elapsed}) + "\n")
        every = train_cfg.get("eval_every", 0)
        if every and (step % every == 0 or step == steps):
            p = {n: t.detach() for n, t in params.items()}
            for path in val_paths:
                loss = val_loss(p, model_cfg, train_cfg, path)
                metrics.write(json.dumps({"type": "eval", "step": step, "set": short_name(path, ".npy"),
                                          "loss": loss, "ppl": math.exp(loss)}) + "\n")
            for path in tasks:
                acc, acc_tok, n = mc_accuracy(p, model_cfg, train_cfg, path)
                metrics.write(json.dumps({"type": "downstream", "step": step, "task": short_name(path, ".jsonl"),
                                          "acc": acc, "acc_per_token": acc_tok, "n": n}) + "\n")
        if step == steps and args.tasks:
            p = {n: t.detach() for n, t in params.items()}
            for path in split_list(args.tasks):
                acc, acc_tok, n = mc_accuracy(p, model_cfg, train_cfg, path)
                metrics.write(json.dumps({"type": "downstream", "step": step, "task": short_name(path, ".jsonl"),
                                          "acc": acc, "acc_per_token": acc_tok, "n": n}) + "\n")
        metrics.flush()
        if step % 20 == 0 or step == steps:
            print(f"torch step {step}/{steps} | loss {ce_tot / n_labels:.4f} | {step * rows * T / elapsed:.0f} tok/s",
                  flush=True)
    save_file({n: t.detach().contiguous() for n, t in params.items()}, str(out / "model.safetensors"))


if __name__ == "__main__":
    main()
