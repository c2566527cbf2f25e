"""Hugging Face interop: olmoc convert --from-hf / --to-hf against transformers.

A tiny random Olmo3ForCausalLM made by transformers, saved with
save_pretrained (single file and sharded), is imported by olmoc and gives the
same logits as transformers (float64); a model trained by olmoc, exported, is
loaded by AutoModelForCausalLM.from_pretrained and gives olmoc's logits.
Error = max |C - HF| / max |HF| over the logits, tolerance 1e-5."""
import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from test_cli import ROOT, builds, olmoc, tiny  # noqa: F401
from test_fidelity import TOL_FORWARD, random_params, rel_err

transformers = pytest.importorskip("transformers")

HF_MODEL = dict(vocab_size=97, d_model=32, n_layers=5, n_heads=4, n_kv_heads=2, mlp_hidden=48, rope_theta=10000.0,
                sliding_window=5, full_attention_every=4, full_attention_last=False, rms_norm_eps=1e-6,
                init_std=0.02, eos_token_id=3, pad_token_id=1)


def hf_config(model, **extra):
    return transformers.Olmo3Config(
        vocab_size=model["vocab_size"], hidden_size=model["d_model"], intermediate_size=model["mlp_hidden"],
        num_hidden_layers=model["n_layers"], num_attention_heads=model["n_heads"],
        num_key_value_heads=model["n_kv_heads"], rms_norm_eps=model["rms_norm_eps"],
        sliding_window=model["sliding_window"],  # layer_types: transformers' default (S S S F S)
        rope_parameters={t: {"rope_type": "default", "rope_theta": model["rope_theta"]}
                         for t in ("full_attention", "sliding_attention")},
        max_position_embeddings=64, tie_word_embeddings=False, pad_token_id=model["pad_token_id"],
        eos_token_id=model["eos_token_id"], bos_token_id=None, **extra)


def make_hf_model(model, seed):
    hf = transformers.Olmo3ForCausalLM(hf_config(model, attn_implementation="eager"))
    hf.load_state_dict(random_params(model, seed), strict=True)
    return hf


def c_logits(build_dir, tmp_path, config_yaml, weights, tokens):
    """Logits of olmoc's forward pass (the fidelity driver) for one row of tokens."""
    text = config_yaml.read_text()
    text = re.sub(r"seq_len: \d+", f"seq_len: {tokens.numel()}", text)
    text = re.sub(r"micro_batch: \d+", "micro_batch: 1", text)
    text = re.sub(r"grad_accum: \d+", "grad_accum: 1", text)
    cfg = tmp_path / "driver.yaml"
    cfg.write_text(text)
    batch, out = tmp_path / "batch.safetensors", tmp_path / "out.safetensors"
    save_file({"tokens": tokens.reshape(1, -1).to(torch.int32).contiguous()}, str(batch))
    import subprocess
    subprocess.run([str(build_dir / "tests" / "fidelity_runner"), str(cfg), str(weights), str(batch), "1", str(out)],
                   check=True)
    return load_file(str(out))["logits"][0]


def tokens_for(model, n=20, seed=5):
    return torch.randint(0, model["vocab_size"], (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("layout", ["single", "sharded", "bf16"])
def test_import_from_transformers(layout, build_dir, tmp_path):
    hf = make_hf_model(HF_MODEL, seed=21)
    hf_dir = tmp_path / "hf"
    if layout == "sharded":
        hf.save_pretrained(hf_dir, max_shard_size="30KB")
        assert (hf_dir / "model.safetensors.index.json").exists()
    elif layout == "bf16":
        hf.to(torch.bfloat16).save_pretrained(hf_dir)
    else:
        hf.save_pretrained(hf_dir)
    out = tmp_path / "olmoc"
    r = olmoc(build_dir, "convert", "--from-hf", hf_dir, out)
    assert r.returncode == 0, r.stderr
    cfg_text = (out / "config.yaml").read_text()
    for line in ("rope_theta: 10000", "sliding_window: 5", "full_attention_every: 4", "full_attention_last: false",
                 "n_kv_heads: 2", "eos_token_id: 3", "seq_len: 64"):
        assert line in cfg_text, line
    # the reference: what transformers itself loads from that directory, run in float64
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32,
                                                                  attn_implementation="eager").double()
    tokens = tokens_for(HF_MODEL)
    with torch.no_grad():
        ref = ref_model(input_ids=tokens[None]).logits[0]
    err = rel_err(c_logits(build_dir, tmp_path, out / "config.yaml", out / "model.safetensors", tokens), ref)
    print(f"\nfrom-hf ({layout}): logits rel err {err:.2e}")
    assert err < TOL_FORWARD


def test_export_to_transformers(build_dir, tiny, tmp_path):
    cfg, data = tiny
    run = tmp_path / "run"
    r = olmoc(build_dir, "train", cfg, "--set", f"data.train_path={data}", "--set", f"data.out_dir={run}",
              "--set", "train.steps=6", "--set", "train.save_every=6", "--set", "model.rope_theta=20000",
              "--set", "train.peak_flops=1e12")
    assert r.returncode == 0, r.stderr
    hf_dir = tmp_path / "hf"
    r = olmoc(build_dir, "convert", "--to-hf", run, hf_dir)  # the run directory: its newest checkpoint
    assert r.returncode == 0 and "checkpoint" in r.stdout, r.stderr
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float64, attn_implementation="eager")
    assert type(hf).__name__ == "Olmo3ForCausalLM"
    c = hf.config
    assert c.layer_types == ["sliding_attention"] * 3 + ["full_attention"]
    assert c.sliding_window == 8 and c.num_key_value_heads == 2 and not c.tie_word_embeddings
    assert c.rope_parameters["full_attention"]["rope_theta"] == 20000
    assert c.rope_parameters["sliding_attention"]["rope_theta"] == 20000
    # every tensor exported bit for bit
    ours = load_file(str(run / "step-000006" / "model.safetensors"))
    theirs = load_file(str(hf_dir / "model.safetensors"))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    model = dict(vocab_size=64)
    tokens = tokens_for(model, n=32)
    with torch.no_grad():
        ref = hf(input_ids=tokens[None]).logits[0]
    err = rel_err(c_logits(build_dir, tmp_path, run / "step-000006" / "config.yaml",
                           run / "step-000006" / "model.safetensors", tokens), ref)
    print(f"\nto-hf: logits rel err {err:.2e}")
    assert err < TOL_FORWARD

    # bfloat16 export: round to nearest even, as torch does
    r = olmoc(build_dir, "convert", "--to-hf", run / "step-000006", tmp_path / "hf16", "--dtype", "bfloat16")
    assert r.returncode == 0, r.stderr
    b16 = load_file(str(tmp_path / "hf16" / "model.safetensors"))
    assert all(b16[k].dtype == torch.bfloat16 and torch.equal(b16[k], ours[k].to(torch.bfloat16)) for k in ours)
    assert json.loads((tmp_path / "hf16" / "config.json").read_text())["dtype"] == "bfloat16"

    # round trip back into olmoc: identical weights
    r = olmoc(build_dir, "convert", "--from-hf", hf_dir, tmp_path / "back")
    assert r.returncode == 0, r.stderr
    back = load_file(str(tmp_path / "back" / "model.safetensors"))
    assert all(torch.equal(back[k], ours[k]) for k in ours)


def test_import_rejects_unsupported(build_dir, tmp_path):
    hf = make_hf_model(HF_MODEL, seed=3)
    good = tmp_path / "good"
    hf.save_pretrained(good)
    base = json.loads((good / "config.json").read_text())

    def variant(name, change):
        d = tmp_path / name
        shutil.copytree(good, d)
        cfg = json.loads(json.dumps(base))
        change(cfg)
        (d / "config.json").write_text(json.dumps(cfg))
        return d

    linear = {"rope_type": "linear", "factor": 8.0, "rope_theta": 500000}  # YaRN: test_yarn.py
    cases = {
        "linear": (lambda c: c["rope_parameters"].update(full_attention=linear), "rope_type 'linear'"),
        "legacy_linear": (lambda c: (c.pop("rope_parameters"), c.update(rope_theta=500000, rope_scaling=linear)),
                          "rope_type 'linear'"),
        "tied": (lambda c: c.update(tie_word_embeddings=True), "tie_word_embeddings is true"),
        "bias": (lambda c: c.update(attention_bias=True), "attention_bias"),
        "olmo2": (lambda c: c.update(model_type="olmo2"), "model_type is 'olmo2'"),
        "gelu": (lambda c: c.update(hidden_act="gelu"), "hidden_act 'gelu'"),
        "layers": (lambda c: c.update(layer_types=["full_attention", "sliding_attention", "full_attention",
                                                   "sliding_attention", "sliding_attention"]), "layer_types"),
        "shape": (lambda c: c.update(intermediate_size=64), "mlp.gate_proj.weight"),
    }
    for name, (change, message) in cases.items():
        d = variant(name, change)
        for build in builds(build_dir):
            r = olmoc(build, "convert", "--from-hf", d, tmp_path / f"out_{name}")
            assert r.returncode == 1 and message in r.stderr, (name, r.stderr)

    # a legacy (transformers 4.x) config with a top-level rope_theta is read
    legacy = variant("legacy", lambda c: (c.pop("rope_parameters"), c.update(rope_theta=12345.0, rope_scaling=None)))
    r = olmoc(build_dir, "convert", "--from-hf", legacy, tmp_path / "out_legacy")
    assert r.returncode == 0 and "rope_theta: 12345" in (tmp_path / "out_legacy" / "config.yaml").read_text()

    # a shard index may only name files inside the directory
    sharded = tmp_path / "sharded"
    hf.save_pretrained(sharded, max_shard_size="30KB")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = "../good/model.safetensors"
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    r = olmoc(build_dir, "convert", "--from-hf", sharded, tmp_path / "out_sharded")
    assert r.returncode == 1 and "not a plain file name" in r.stderr, r.stderr


def test_safetensors_defensive_parsing(build_dir, tiny, tmp_path):
    """Malformed headers are refused with a message (Release and ASan builds)."""
    import struct
    cfg, data = tiny

    def st(header, data_bytes=b"\0" * 64):
        h = json.dumps(header).encode() if not isinstance(header, bytes) else header
        return struct.pack("<Q", len(h)) + h + data_bytes

    cases = {
        "dup": (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],'
                b'"data_offsets":[8,16]}}', "appears twice"),
        "overlap": ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                     "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}, "overlap"),
        "shape": ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, "bad shape"),
        "size": ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, "do not match shape"),
        "dtype": ({"a": {"dtype": "Q4", "shape": [3], "data_offsets": [0, 8]}}, "unsupported dtype"),
        "notobj": (b"[1,2,3]", "not a JSON object"),
        "entry": ({"a": 5}, "is not an object"),
    }
    for name, (header, message) in cases.items():
        path = tmp_path / f"{name}.safetensors"
        path.write_bytes(st(header))
        for build in builds(build_dir):
            r = olmoc(build, "train", cfg, "--set", f"data.train_path={data}", "--init", path,
                      "--set", f"data.out_dir={tmp_path / 'o'}", "--set", "train.peak_flops=1")
            assert r.returncode == 1 and message in r.stderr, (name, r.stderr)


def test_export_writes_the_tokenizer(build_dir, tiny, tmp_path):
    """--to-hf of a run with data.tokenizer writes tokenizer.json and tokenizer_config.json, and transformers'
    AutoTokenizer loads the export and encodes as the tokenizer file does; without a tokenizer file, a note."""
    from tokenizers import Tokenizer

    cfg, data = tiny
    tok_file = ROOT / "assets" / "tokenizer" / "demo-8192.json"
    run = tmp_path / "run"
    r = olmoc(build_dir, "train", cfg, "--set", f"data.train_path={data}", "--set", f"data.out_dir={run}",
              "--set", "train.steps=2", "--set", "train.save_every=2", "--set", "train.peak_flops=1e12",
              "--set", f"data.tokenizer={tok_file}")
    assert r.returncode == 0, r.stderr
    hf_dir = tmp_path / "hf"
    r = olmoc(build_dir, "convert", "--to-hf", run, hf_dir)
    assert r.returncode == 0 and "tokenizer.json" in r.stdout, r.stderr
    assert (hf_dir / "tokenizer.json").read_bytes() == tok_file.read_bytes()
    ref = Tokenizer.from_file(str(tok_file))
    hf_tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    text = "The quick brown fox, 12345 times: naïve café!"
    assert hf_tok(text)["input_ids"] == ref.encode(text).ids
    tiny_cfg = (cfg.read_text())
    eos = int(re.search(r"eos_token_id: (\d+)", tiny_cfg).group(1))
    pad = int(re.search(r"pad_token_id: (\d+)", tiny_cfg).group(1))
    assert hf_tok.eos_token_id == eos and hf_tok.pad_token_id == pad
    assert hf_tok.eos_token == ref.decode([eos], skip_special_tokens=False)

    # a tokenizer the config names but that is not there: the weights are exported, with a note
    r = olmoc(build_dir, "convert", "--to-hf", run, tmp_path / "hf2", "--set", "data.tokenizer=/nonexistent/t.json")
    assert r.returncode == 0 and "no tokenizer.json written" in r.stderr, r.stderr
    assert not (tmp_path / "hf2" / "tokenizer.json").exists()
