"""YaRN RoPE scaling (model.rope_scaling: yarn) against transformers' Olmo3.

transformers applies rope_scaling to the full-attention layers only (the
sliding-window layers keep unscaled RoPE), with the inverse frequencies of
modeling_rope_utils._compute_yarn_parameters and cos/sin multiplied by the
attention factor.  Checked here: the forward pass and gradients of olmoc's
training step (the fidelity driver), the import of a transformers YaRN
checkpoint (rope_parameters as transformers 5 saves it, and the rope_scaling
of the released Olmo 3 configs, mscale included), the export of a model olmoc
trained with YaRN, greedy generation (the KV cache's positions), and the
refusal, by name, of the scalings olmoc does not implement.
Error = max |C - HF| / max |HF| over the logits (float64 reference)."""
import json
import shutil

import pytest
import torch

from test_cli import ROOT, builds, olmoc, tiny  # noqa: F401
from test_convert import c_logits, tokens_for
from test_fidelity import (BASE_MODEL, BASE_TRAIN, TOL_FORWARD, TOL_GRAD, random_params, random_tokens, rel_err,
                           run_c)
from test_hf_transformers import hf_model, step_errors

transformers = pytest.importorskip("transformers")

# name: olmoc's model keys, the transformers rope entry of the full-attention layers
SETTINGS = {
    # OLMo-core's defaults (beta 32 / 1, attention factor 0.1 ln(factor) + 1), a short original context
    "factor4": ({"rope_factor": 4.0, "rope_original_max_position_embeddings": 8},
                {"factor": 4.0, "original_max_position_embeddings": 8}),
    # every setting given, head_dim 16 (a wider ramp), GQA
    "explicit": ({"d_model": 64, "n_kv_heads": 2, "rope_factor": 2.5, "rope_original_max_position_embeddings": 6,
                  "rope_beta_fast": 8.0, "rope_beta_slow": 2.0, "rope_attention_factor": 1.3},
                 {"factor": 2.5, "original_max_position_embeddings": 6, "beta_fast": 8, "beta_slow": 2,
                  "attention_factor": 1.3}),
}


def hf_yarn_model(model, params, yarn):
    hf = hf_model(model, params, {"rope_type": "yarn", "rope_theta": model["rope_theta"], **yarn},
                  max_position_embeddings=64)
    assert hf.model.rotary_emb.rope_type == {"full_attention": "yarn", "sliding_attention": "default"}
    return hf


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_training_step_against_transformers(name, build_dir, tmp_path):
    ours, yarn = SETTINGS[name]
    model = {**BASE_MODEL, "rope_theta": 10000.0, "rope_scaling": "yarn", **ours}
    train = {**BASE_TRAIN, "steps": 1, "z_loss": 0.0, "intra_doc_masking": False}
    params = random_params(model, seed=31)
    tokens = random_tokens(model, train, seed=4)
    out = run_c(build_dir, tmp_path, model, train, params, tokens)

    hf = hf_yarn_model(model, params, yarn)
    scaling = hf.model.rotary_emb.full_attention_attention_scaling
    assert scaling == pytest.approx(ours.get("rope_attention_factor", 0.1 * torch.log(torch.tensor(4.0)).item() + 1))
    assert scaling > 1.05  # the mscale multiplies cos and sin: a visible change
    result, logits_err, loss_err, grad_err = step_errors(out, hf, tokens[0, 0])

    # the same weights without YaRN are far from transformers' YaRN model: the comparison can fail
    (tmp_path / "plain").mkdir()
    plain = run_c(build_dir, tmp_path / "plain", {**model, "rope_scaling": "none"}, train, params, tokens)
    plain_err = rel_err(plain["logits"], result.logits.detach())
    print(f"\nyarn {name} (attention factor {scaling:.6f}): logits {logits_err:.2e} loss {loss_err:.2e} "
          f"grads {grad_err:.2e}; unscaled RoPE: logits {plain_err:.2e}")
    assert logits_err < TOL_FORWARD
    assert loss_err < TOL_FORWARD
    assert grad_err < TOL_GRAD
    assert plain_err > 100 * TOL_FORWARD


HF_MODEL = dict(vocab_size=97, d_model=64, n_layers=5, n_heads=4, n_kv_heads=2, mlp_hidden=48, rope_theta=500000.0,
                sliding_window=5, full_attention_every=4, full_attention_last=False, rms_norm_eps=1e-6,
                init_std=0.02, eos_token_id=3, pad_token_id=1)
# the released long-context Olmo 3 checkpoints' rope_scaling (transformers 4.x spelling), at a small scale
OLMO3_ROPE_SCALING = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16, "beta_fast": 32,
                      "beta_slow": 1, "attention_factor": 1.2079441541679836}


@pytest.fixture(scope="module")
def hf_yarn_dir(tmp_path_factory):
    """A transformers YaRN model saved with save_pretrained (rope_parameters per layer type)."""
    d = tmp_path_factory.mktemp("yarn") / "hf"
    hf = hf_yarn_model(HF_MODEL, random_params(HF_MODEL, seed=41),
                       {k: v for k, v in OLMO3_ROPE_SCALING.items() if k != "rope_type"})
    hf.config.max_position_embeddings = 1024  # generation's context (no effect on RoPE's values)
    hf.float().save_pretrained(d)
    assert json.loads((d / "config.json").read_text())["rope_parameters"]["full_attention"]["rope_type"] == "yarn"
    return d


def legacy_variant(src, dst, rope_scaling):
    """src's config.json in the spelling of the released Olmo 3 configs: rope_theta + rope_scaling."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.pop("rope_parameters")
    cfg.update(rope_theta=HF_MODEL["rope_theta"], rope_scaling=rope_scaling)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("spelling", ["rope_parameters", "rope_scaling", "rope_scaling_mscale"])
def test_import_from_transformers(spelling, hf_yarn_dir, build_dir, tmp_path):
    src = hf_yarn_dir
    if spelling == "rope_scaling":
        src = legacy_variant(hf_yarn_dir, tmp_path / "legacy", OLMO3_ROPE_SCALING)
    elif spelling == "rope_scaling_mscale":  # attention factor from mscale / mscale_all_dim (DeepSeek's form)
        rs = {k: v for k, v in OLMO3_ROPE_SCALING.items() if k != "attention_factor"}
        src = legacy_variant(hf_yarn_dir, tmp_path / "mscale", {**rs, "mscale": 1.0, "mscale_all_dim": 0.5})
    out = tmp_path / "olmoc"
    r = olmoc(build_dir, "convert", "--from-hf", src, out)
    assert r.returncode == 0, r.stderr
    text = (out / "config.yaml").read_text()
    for line in ("rope_scaling: yarn", "rope_factor: 8", "rope_original_max_position_embeddings: 16",
                 "rope_beta_fast: 32", "rope_beta_slow: 1", "rope_theta: 500000"):
        assert line in text, line
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32,
                                                                  attn_implementation="eager").double()
    assert ref_model.model.rotary_emb.rope_type["full_attention"] == "yarn"
    tokens = tokens_for(HF_MODEL, n=40)
    with torch.no_grad():
        ref = ref_model(input_ids=tokens[None]).logits[0]
    err = rel_err(c_logits(build_dir, tmp_path, out / "config.yaml", out / "model.safetensors", tokens), ref)
    print(f"\nfrom-hf yarn ({spelling}, attention factor "
          f"{ref_model.model.rotary_emb.full_attention_attention_scaling:.6f}): logits rel err {err:.2e}")
    assert err < TOL_FORWARD


def test_train_and_export(build_dir, tiny, tmp_path):
    """A model trained by olmoc with YaRN, exported, loads in transformers with YaRN and gives olmoc's logits;
    imported back it is the same configuration."""
    cfg, data = tiny
    run = tmp_path / "run"
    yarn = ["model.rope_scaling=yarn", "model.rope_factor=4", "model.rope_original_max_position_embeddings=8"]
    r = olmoc(build_dir, "train", cfg, "--set", f"data.train_path={data}", "--set", f"data.out_dir={run}",
              "--set", "train.steps=4", "--set", "train.save_every=4", "--set", "model.rope_theta=10000",
              "--set", "train.peak_flops=1e12", *[a for kv in yarn for a in ("--set", kv)])
    assert r.returncode == 0, r.stderr
    hf_dir = tmp_path / "hf"
    r = olmoc(build_dir, "convert", "--to-hf", run, hf_dir)
    assert r.returncode == 0, r.stderr
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float64, attn_implementation="eager")
    full = hf.config.rope_parameters["full_attention"]
    assert full["rope_type"] == "yarn" and full["factor"] == 4 and full["original_max_position_embeddings"] == 8
    assert hf.config.rope_parameters["sliding_attention"]["rope_type"] == "default"
    assert hf.model.rotary_emb.full_attention_attention_scaling == pytest.approx(0.1 * torch.log(
        torch.tensor(4.0, dtype=torch.float64)).item() + 1, rel=1e-15)
    tokens = tokens_for(dict(vocab_size=64), n=32)
    with torch.no_grad():
        ref = hf(input_ids=tokens[None]).logits[0]
    err = rel_err(c_logits(build_dir, tmp_path, run / "step-000004" / "config.yaml",
                           run / "step-000004" / "model.safetensors", tokens), ref)
    print(f"\nto-hf yarn: logits rel err {err:.2e}")
    assert err < TOL_FORWARD
    r = olmoc(build_dir, "convert", "--from-hf", hf_dir, tmp_path / "back")
    assert r.returncode == 0, r.stderr
    keys = [line for line in (run / "step-000004" / "config.yaml").read_text().splitlines()
            if line.strip().startswith("rope_")]
    back = (tmp_path / "back" / "config.yaml").read_text()
    assert len(keys) == 7 and all(k in back for k in keys), (keys, back)


@pytest.mark.parametrize("prompt_len", [6, 70])
def test_greedy_generation_matches_transformers(prompt_len, hf_yarn_dir, build_dir, tmp_path):
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_yarn_dir, dtype=torch.float32,
                                                           attn_implementation="eager").double().eval()
    prompt = torch.randint(4, HF_MODEL["vocab_size"], (prompt_len,),
                           generator=torch.Generator().manual_seed(prompt_len)).tolist()
    n_new = 24
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n_new,
                          eos_token_id=HF_MODEL["eos_token_id"], pad_token_id=HF_MODEL["pad_token_id"])
    expected = out[0, prompt_len:].tolist()
    r = olmoc(build_dir, "generate", hf_yarn_dir, "--ids", ",".join(map(str, prompt)), "--json",
              "--max-new-tokens", str(n_new))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["generated"] == expected
    print(f"\nyarn greedy, prompt {prompt_len}: {len(expected)} tokens identical to transformers")


def test_refuses_what_it_does_not_implement(hf_yarn_dir, build_dir, tmp_path):
    base = json.loads((hf_yarn_dir / "config.json").read_text())
    yarn = base["rope_parameters"]["full_attention"]
    cases = {
        "linear": ({"rope_type": "linear", "factor": 2.0}, "rope_type 'linear'"),
        "dynamic": ({"rope_type": "dynamic", "factor": 2.0}, "rope_type 'dynamic'"),
        "llama3": ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 16}, "rope_type 'llama3'"),
        "longrope": ({"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
                      "original_max_position_embeddings": 16}, "rope_type 'longrope'"),
        "no_truncate": ({**yarn, "truncate": False}, "truncate"),
        "unknown_key": ({**yarn, "extrapolation_factor": 1.0}, "'extrapolation_factor'"),
        "no_factor": ({k: v for k, v in yarn.items() if k != "factor"}, "no factor"),
    }
    for name, (entry, message) in cases.items():
        for spelling in ("rope_parameters", "rope_scaling"):
            d = tmp_path / f"{name}_{spelling}"
            shutil.copytree(hf_yarn_dir, d)
            cfg = json.loads(json.dumps(base))
            if spelling == "rope_scaling":
                cfg.pop("rope_parameters")
                cfg.update(rope_theta=500000.0, rope_scaling=entry)
            else:
                cfg["rope_parameters"]["full_attention"] = entry
            (d / "config.json").write_text(json.dumps(cfg))
            for build in builds(build_dir):
                r = olmoc(build, "convert", "--from-hf", d, tmp_path / f"out_{name}_{spelling}")
                assert r.returncode == 1 and message in r.stderr, (name, spelling, r.stderr)
    # YaRN on the sliding-window layers: not what Olmo 3 does, refused
    d = tmp_path / "sliding"
    shutil.copytree(hf_yarn_dir, d)
    cfg = json.loads(json.dumps(base))
    cfg["rope_parameters"]["sliding_attention"] = dict(yarn)
    (d / "config.json").write_text(json.dumps(cfg))
    r = olmoc(build_dir, "convert", "--from-hf", d, tmp_path / "out_sliding")
    assert r.returncode == 1 and "full-attention layers only" in r.stderr, r.stderr
    # the config key names what it takes
    r = olmoc(build_dir, "info", ROOT / "configs" / "olmo3-1m-8k.yaml", "--set", "model.rope_scaling=linear")
    assert r.returncode == 1 and "'model.rope_scaling' must be one of none, yarn; got 'linear'" in r.stderr, r.stderr
    r = olmoc(build_dir, "info", ROOT / "configs" / "olmo3-1m-8k.yaml", "--set", "model.rope_scaling=yarn",
              "--set", "model.rope_theta=1")
    assert r.returncode == 1 and "yarn needs model.rope_theta > 1" in r.stderr, r.stderr
