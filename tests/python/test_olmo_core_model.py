"""OLMo-core's own Olmo 3 model against olmoc, at test time.

The reference model is built by OLMo-core's factory, TransformerConfig.olmo3_7B,
scaled down (d_model 32, 4 layers of 4 heads, SwiGLU hidden 64, sliding window
8 on layers 1-3, the dolma2 vocabulary size 100352), initialised by OLMo-core, and
exported by OLMo-core's own Hugging Face exporter (olmo_core.nn.hf.save_hf_model,
which writes max_position_embeddings -1 and null token ids).  olmoc reads that
export with `olmoc convert --from-hf` (the values the exporter leaves open are
assumed and said so), then tests/c/fidelity_runner computes logits, losses,
every gradient, and the weights after three optimizer steps, compared with
OLMo-core's model forward/backward (labels, z-loss and loss normalisation as
TransformerTrainModule passes them) and OLMo-core's SkipStepAdamW with the
Trainer's zero-LR initial step (get_optimizer_state_dict on the fresh optimizer).

Error measure: max |olmoc - OLMo-core| / max |OLMo-core| over a tensor.
"""
import json
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file as load_np
from safetensors.torch import load_file, save_file

from olmo_core.data.utils import get_labels
from olmo_core.nn.attention import AttentionBackendName, SlidingWindowAttentionConfig
from olmo_core.nn.hf import save_hf_model
from olmo_core.nn.hf.config import get_hf_config
from olmo_core.nn.hf.convert import convert_state_to_hf
from olmo_core.nn.transformer import TransformerConfig
from olmo_core.optim import SkipStepAdamW, SkipStepAdamWConfig
from olmo_core.optim.scheduler import CosWithWarmup
from olmo_core.train.train_module.transformer.train_module import TransformerTrainModule
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

# Stated tolerances (fp32 on both sides), normwise relative.
TOL_FORWARD = 1e-5  # logits, CE loss, z-loss
TOL_GRAD = 1e-4  # gradients
TOL_PARAMS = 1e-4  # weights after three SkipStepAdamW steps (Adam divides by sqrt(v))

SEQ, MICRO, STEPS, LR, WARMUP, Z_LOSS = 16, 2, 3, 3e-3, 2, 1e-5


@pytest.fixture(scope="module")
def olmo_core_export(tmp_path_factory):
    torch.manual_seed(0)
    cfg = TransformerConfig.olmo3_7B(
        vocab_size=100352, attn_backend=AttentionBackendName.torch,
        sliding_window=SlidingWindowAttentionConfig(pattern=[8, 8, 8, -1], force_full_attention_on_first_layer=False,
                                                    force_full_attention_on_last_layer=True))
    cfg.d_model, cfg.n_layers = 32, 4
    cfg.block.sequence_mixer.n_heads = 4
    cfg.block.feed_forward.hidden_size = 64
    model = cfg.build(init_device="cpu")
    model.init_weights(device=torch.device("cpu"))
    out = tmp_path_factory.mktemp("olmo_core") / "hf"  # save_hf_model wants a new directory
    save_hf_model(str(out), model.state_dict(), model)
    return model, out


def convert(build_dir, src, dst):
    return subprocess.run([str(build_dir / "olmoc"), "convert", "--from-hf", str(src), str(dst)], capture_output=True,
                          text=True)


def rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def test_convert_reads_olmo_core_export(build_dir, olmo_core_export, tmp_path):
    model, hf_dir = olmo_core_export
    written = json.loads((hf_dir / "config.json").read_text())
    # what OLMo-core's exporter writes (olmo_core/nn/hf/config.py get_hf_config): the case under test
    assert written["max_position_embeddings"] == -1 and written["eos_token_id"] is None
    assert written["pad_token_id"] is None
    r = convert(build_dir, hf_dir, tmp_path / "conv")
    assert r.returncode == 0, r.stderr
    for said in ("eos_token_id is null: 100257 assumed", "pad_token_id is null: 100277 assumed",
                 "max_position_embeddings is -1", "train.seq_len 4096"):
        assert said in r.stderr, r.stderr
    yaml = (tmp_path / "conv" / "config.yaml").read_text()
    for line in ("eos_token_id: 100257", "pad_token_id: 100277", "seq_len: 4096", "sliding_window: 8",
                 "d_model: 32", "n_layers: 4", "mlp_hidden: 64", "vocab_size: 100352"):
        assert f"  {line}\n" in yaml, line
    # the weights arrive exactly (names are Hugging Face's in both files)
    ours, theirs = load_np(str(tmp_path / "conv" / "model.safetensors")), load_np(str(hf_dir / "model.safetensors"))
    assert set(ours) == set(theirs)
    for name in theirs:
        assert np.array_equal(ours[name], theirs[name].astype(np.float32)), name
    # a set token id still wins over the assumption
    r = subprocess.run([str(build_dir / "olmoc"), "convert", "--from-hf", str(hf_dir), str(tmp_path / "conv2"),
                        "--set", "model.eos_token_id=5"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "  eos_token_id: 5\n" in (tmp_path / "conv2" / "config.yaml").read_text()


def olmoc_config(conv_dir, path):
    model_lines = []
    for line in (conv_dir / "config.yaml").read_text().splitlines():
        if line == "train:":
            break
        model_lines.append(line)
    train = dict(seq_len=SEQ, micro_batch=MICRO, grad_accum=1, steps=STEPS, intra_doc_masking="false",
                 z_loss=Z_LOSS, clip_grad_norm=1.0, lr=LR, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,
                 embedding_weight_decay=0.0, schedule="cos_with_warmup", warmup_steps=WARMUP, alpha_f=0.1,
                 optimizer="skip_step_adamw", optim_init_step="true")
    path.write_text("\n".join(model_lines + ["train:"] + [f"  {k}: {v}" for k, v in train.items()]) + "\n")


@pytest.mark.slow
def test_olmo_core_model_matches_olmoc(build_dir, olmo_core_export, tmp_path):
    model, hf_dir = olmo_core_export
    assert convert(build_dir, hf_dir, tmp_path / "conv").returncode == 0
    olmoc_config(tmp_path / "conv", tmp_path / "cfg.yaml")
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 100278, (STEPS, MICRO, SEQ), generator=g)
    tokens[:, :, 5] = 100257  # an EOS inside (no document masking: it is an ordinary token)
    save_file({"tokens": tokens.reshape(STEPS, -1).to(torch.int32).contiguous()}, str(tmp_path / "batch.safetensors"))
    r = subprocess.run([str(build_dir / "tests" / "fidelity_runner"), str(tmp_path / "cfg.yaml"),
                        str(tmp_path / "conv" / "model.safetensors"), str(tmp_path / "batch.safetensors"),
                        str(STEPS), str(tmp_path / "out.safetensors")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ours = load_file(str(tmp_path / "out.safetensors"))

    # OLMo-core: what TransformerTrainModule.train_batch / optim_step do, on one rank and micro-batch
    hf_config = get_hf_config(model)
    embed = [p for n, p in model.named_parameters() if n == "embeddings.weight"]
    rest = [p for n, p in model.named_parameters() if n != "embeddings.weight"]
    opt = SkipStepAdamW([{"params": embed, "weight_decay": 0.0}, {"params": rest, "weight_decay": 0.1}], lr=LR,
                        betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=SkipStepAdamWConfig().foreach)
    get_optimizer_state_dict(model, opt)  # the Trainer's step-0 checkpoint: one zero-LR step
    sched = CosWithWarmup(warmup=WARMUP, alpha_f=0.1)
    history = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        labels = get_labels({"input_ids": tokens[step]})
        n_labels = (labels != -100).sum()
        out = model(tokens[step], labels=labels, loss_reduction="sum", z_loss_multiplier=Z_LOSS,
                    loss_div_factor=n_labels, return_logits=step == 0)
        out.loss.backward()
        if step == 0:
            logits = out.logits.detach()
            grads = convert_state_to_hf(hf_config, {n: p.grad.detach().clone() for n, p in model.named_parameters()})
        opt.latest_loss = out.ce_loss.detach()
        norm = TransformerTrainModule._clip_grad_norm(SimpleNamespace(model=model), 1.0)
        opt.latest_grad_norm = norm
        for group in opt.param_groups:
            sched.set_lr(group, SimpleNamespace(global_step=step + 1, max_steps=STEPS))
        opt.step()
        assert not opt.step_skipped.item()
        history.append([out.ce_loss.item(), out.z_loss.item(), norm.item()])
    final = convert_state_to_hf(hf_config, {n: p.detach() for n, p in model.named_parameters()})

    errors = {"logits": rel(ours["logits"], logits.reshape(ours["logits"].shape)),
              "losses (ce, z, grad norm) x 3 steps": rel(ours["losses"], np.array(history))}
    errors["gradients (worst)"] = max(rel(ours[f"grad.{n}"], g) for n, g in grads.items())
    errors["weights after 3 steps (worst)"] = max(rel(ours[f"final.{n}"], p) for n, p in final.items())
    print("olmoc vs OLMo-core:", {k: f"{v:.2e}" for k, v in errors.items()})
    assert len(grads) == len([k for k in ours if k.startswith("grad.")])
    assert errors["logits"] <= TOL_FORWARD and errors["losses (ce, z, grad norm) x 3 steps"] <= TOL_FORWARD
    assert errors["gradients (worst)"] <= TOL_GRAD
    assert errors["weights after 3 steps (worst)"] <= TOL_PARAMS
