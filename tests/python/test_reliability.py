"""Runs that survive what real runs meet: a diverging run (train.nonfinite:
stop or skip), NaN/inf in weights and optimizer state at load, SIGTERM and
SIGINT (alone, twice, and under mpirun), and error paths that free what they
allocated (LeakSanitizer on the sanitizer build).

The runs that push NaN through the model use the Release build only: the CPU
backend's fast exp converts a NaN to int32 (undefined behaviour that UBSan
reports), which is another change's to fix."""
import json
import math
import os
import shutil
import signal
import subprocess
import threading
import time

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from test_cli import ROOT, builds, olmoc, tiny  # noqa: F401  (tiny is a fixture)

FAST = ["--set", "train.peak_flops=1e12"]  # skip the startup SGEMM measurement
DIVERGE = ["--set", "train.lr=1e29"]  # step 1 is finite; its update makes every later loss NaN
MPIRUN = shutil.which("mpirun")


def train_args(cfg, data, out, *extra):
    return ["train", cfg, "--set", f"data.train_path={data}", "--set", f"data.out_dir={out}", *FAST, *extra]


def records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def deterministic(recs):
    skip = {"tokens_per_s", "mfu", "elapsed"}
    return [{k: v for k, v in r.items() if k not in skip} for r in recs]


def checkpoints(out):
    return sorted(p.name for p in out.iterdir() if p.name.startswith("step-"))


# ---- state.json's content hash (train/checkpoint.c olmo_hash64), to forge checkpoints that pass verification


M64 = (1 << 64) - 1


def _rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & M64


def hash64(data):
    h = 0x9E3779B97F4A7C15 ^ ((len(data) * 0xFF51AFD7ED558CCD) & M64)
    n8 = len(data) // 8 * 8
    for (w,) in np.frombuffer(data[:n8], dtype="<u8").reshape(-1, 1).tolist():
        h ^= (_rotl((w * 0x87C37B91114253D5) & M64, 31) * 0x4CF5AD432745937F) & M64
        h = (_rotl(h, 27) * 5 + 0x52DCE729) & M64
    tail = int.from_bytes(data[n8:], "little")
    h ^= (_rotl((tail * 0x87C37B91114253D5) & M64, 31) * 0x4CF5AD432745937F) & M64
    for mult in (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53):
        h ^= h >> 33
        h = (h * mult) & M64
    return h ^ (h >> 33)


def rehash(ck):
    """Rewrites state.json's sizes and hashes after a file of checkpoint ck was changed."""
    state = json.loads((ck / "state.json").read_text())
    for name, entry in state["files"].items():
        data = (ck / name).read_bytes()
        entry["bytes"] = len(data)
        entry["hash64"] = f"{hash64(data):016x}"
    (ck / "state.json").write_text(json.dumps(state, indent="\t"))


def test_hash64_matches_olmoc(build_dir, tiny, tmp_path):  # noqa: F811
    cfg, data = tiny
    r = olmoc(build_dir, *train_args(cfg, data, tmp_path / "run", "--set", "train.steps=1", "--set",
                                     "train.save_every=1"))
    assert r.returncode == 0, r.stderr
    ck = tmp_path / "run" / "step-000001"
    before = (ck / "state.json").read_text()
    rehash(ck)
    assert json.loads((ck / "state.json").read_text()) == json.loads(before)


# ---- non-finite steps


def test_nonfinite_step_stops_the_run_keeping_the_last_checkpoint(build_dir, tiny, tmp_path):  # noqa: F811
    cfg, data = tiny
    out = tmp_path / "run"
    r = olmoc(build_dir, *train_args(cfg, data, out, "--set", "train.steps=6", "--set", "train.save_every=1",
                                     "--set", "train.keep_last=0", *DIVERGE))
    assert r.returncode == 1, r.stdout + r.stderr
    assert ("olmoc train: step 2: the loss is NaN: stopping the run (train.nonfinite: stop; " in r.stderr and
            f"the last checkpoint is '{out}/step-000001'" in r.stderr), r.stderr
    assert checkpoints(out) == ["step-000001"]  # nothing of the NaN step was saved
    assert not (out / "model.safetensors").exists()
    recs = records(out)
    assert [x["step"] for x in recs] == [1, 2] and recs[1]["loss"] is None and recs[1]["grad_norm"] is None
    weights = load_file(str(out / "step-000001" / "model.safetensors"))
    assert all(torch.isfinite(t).all() for t in weights.values())
    # the last good checkpoint resumes (and meets the same wall)
    r = olmoc(build_dir, *train_args(cfg, data, out, "--set", "train.steps=6", *DIVERGE, "--resume"))
    assert r.returncode == 1 and "resumed from" in r.stdout and "step 2: the loss is NaN" in r.stderr, r.stderr


def lr_schedule(peak, warmup, steps, alpha_f=0.1):
    def lr(s):
        if s < warmup:
            return peak * s / warmup
        p = (s - warmup) / (steps - warmup)
        return peak * alpha_f + (peak - peak * alpha_f) * (1 + math.cos(math.pi * p)) / 2
    return [lr(s) for s in range(1, steps + 1)]


def test_nonfinite_steps_are_skipped(build_dir, tiny, tmp_path):  # noqa: F811
    """train.nonfinite: skip: the NaN steps are logged (skipped: true) but apply
    no update: weights and optimizer state (its step count included) stay those
    of the last finite step; the LR schedule still counts the skipped steps; a
    checkpoint with skipped steps resumes."""
    cfg, data = tiny
    out = tmp_path / "run"
    skip = ["--set", "train.nonfinite=skip", "--set", "train.save_every=1", "--set", "train.keep_last=0"]
    r = olmoc(build_dir, *train_args(cfg, data, out, "--set", "train.steps=6", *DIVERGE, *skip))
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("skipped: the loss is NaN (train.nonfinite: skip): no update") == 5, r.stdout
    recs = records(out)
    assert [x.get("skipped", False) for x in recs] == [False] + [True] * 5
    assert all(x["loss"] is None for x in recs[1:])
    assert [x["lr"] for x in recs] == pytest.approx(lr_schedule(1e29, 2, 6), rel=1e-12)
    for name in ("model.safetensors", "optim.safetensors"):
        first = (out / "step-000001" / name).read_bytes()
        assert all((out / f"step-00000{s}" / name).read_bytes() == first for s in range(2, 7)), name
    assert (out / "model.safetensors").read_bytes() == (out / "step-000001" / "model.safetensors").read_bytes()
    state = json.loads((out / "step-000006" / "state.json").read_text())
    assert state["step"] == 6 and state["skipped_steps"] == 5
    assert "skipped_steps" not in json.loads((out / "step-000001" / "state.json").read_text())
    r = olmoc(build_dir, *train_args(cfg, data, out, "--set", "train.steps=8", *DIVERGE, *skip, "--resume"))
    assert r.returncode == 0 and "resumed from" in r.stdout, r.stderr
    assert json.loads((out / "step-000008" / "state.json").read_text())["skipped_steps"] == 7
    # a state.json whose skipped steps do not add up is refused
    bad = tmp_path / "bad"
    shutil.copytree(out / "step-000006", bad)
    state["skipped_steps"] = 4
    (bad / "state.json").write_text(json.dumps(state, indent="\t"))
    r = olmoc(build_dir, *train_args(cfg, data, tmp_path / "o", *skip, "--resume-from", bad))
    assert r.returncode == 1 and "is inconsistent: optimizer step 1 and 4 skipped steps, state.json step 6" \
        in r.stderr, r.stderr


def test_nonfinite_policy_is_checked(build_dir, tiny):  # noqa: F811
    cfg, _ = tiny
    for build in builds(build_dir):
        r = olmoc(build, "info", cfg, "--set", "train.nonfinite=ignore")
        assert r.returncode == 1 and "'train.nonfinite' must be stop or skip; got 'ignore'" in r.stderr, r.stderr


# ---- NaN / inf refused at load


def with_value(src, dst, tensor, value, index=3):
    tensors = load_file(str(src))
    tensors[tensor].view(-1)[index] = value
    save_file(tensors, str(dst), metadata={"format": "pt"})


def test_nonfinite_weights_are_refused(build_dir, tiny, tmp_path):  # noqa: F811
    cfg, data = tiny
    out = tmp_path / "run"
    r = olmoc(build_dir, *train_args(cfg, data, out, "--set", "train.steps=2", "--set", "train.save_every=2"))
    assert r.returncode == 0, r.stderr
    ck = out / "step-000002"
    name = "model.layers.1.mlp.down_proj.weight"
    cases = 0
    for value, shown in ((float("nan"), "NaN"), (float("inf"), "+inf"), (float("-inf"), "-inf")):
        message = f"tensor '{name}' has 1 values that are not finite (the first, element 3, is {shown})"
        # --init
        init = tmp_path / f"init_{shown}.safetensors"
        with_value(out / "model.safetensors", init, name, value)
        # a checkpoint's model (hashes made to match: the values, not the file, are bad)
        bad = tmp_path / f"ck_{shown}"
        shutil.copytree(ck, bad)
        with_value(ck / "model.safetensors", bad / "model.safetensors", name, value)
        rehash(bad)
        for build in builds(build_dir):
            r = olmoc(build, *train_args(cfg, data, tmp_path / "o1", "--set", "train.steps=3", "--init", init))
            assert r.returncode == 1 and f"'{init}': {message}" in r.stderr, r.stderr
            r = olmoc(build, *train_args(cfg, data, tmp_path / "o2", "--set", "train.steps=3", "--resume-from",
                                         bad))
            assert r.returncode == 1 and message in r.stderr and str(bad) in r.stderr, r.stderr
            r = olmoc(build, "eval", bad, "--val", data)
            assert r.returncode == 1 and message in r.stderr, r.stderr
            cases += 3
    assert not (tmp_path / "o1" / "model.safetensors").exists()
    print(f"\nnon-finite weights: {cases} loads refused")


def test_nonfinite_hugging_face_weights_are_refused(build_dir, tmp_path):
    from test_convert import HF_MODEL, make_hf_model
    hf = make_hf_model(HF_MODEL, seed=3)
    with torch.no_grad():
        hf.model.layers[2].self_attn.k_proj.weight[1, 5] = float("nan")
    hf.save_pretrained(tmp_path / "hf")
    for build in builds(build_dir):
        r = olmoc(build, "convert", "--from-hf", tmp_path / "hf", tmp_path / "out")
        assert r.returncode == 1, r.stderr
        assert "tensor 'model.layers.2.self_attn.k_proj.weight' has 1 values that are not finite (the first, " \
               "element 37, is NaN)" in r.stderr, r.stderr
        r = olmoc(build, "generate", tmp_path / "hf", "--ids", "1,2,3")
        assert r.returncode == 1 and "model.layers.2.self_attn.k_proj.weight" in r.stderr, r.stderr


def test_nonfinite_or_negative_optimizer_state_is_refused(build_dir, tiny, tmp_path):  # noqa: F811
    cfg, data = tiny
    out = tmp_path / "run"
    r = olmoc(build_dir, *train_args(cfg, data, out, "--set", "train.steps=2", "--set", "train.save_every=2"))
    assert r.returncode == 0, r.stderr
    ck = out / "step-000002"
    cases = [("model.norm.weight.exp_avg", float("nan"), "has 1 values that are not finite (the first, element 3, "
              "is NaN)"),
             ("model.embed_tokens.weight.exp_avg_sq", float("inf"), "has 1 values that are not finite (the first, "
              "element 3, is +inf)"),
             ("lm_head.weight.exp_avg_sq", -1.0, "has a negative value at element 3 (-1)")]
    for tensor, value, message in cases:
        bad = tmp_path / tensor
        shutil.copytree(ck, bad)
        with_value(ck / "optim.safetensors", bad / "optim.safetensors", tensor, value)
        rehash(bad)
        for build in builds(build_dir):
            r = olmoc(build, *train_args(cfg, data, tmp_path / "o", "--set", "train.steps=3", "--resume-from", bad))
            assert r.returncode == 1 and f"tensor '{tensor}' {message}" in r.stderr, r.stderr
