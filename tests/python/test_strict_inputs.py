"""Bounds and strictness through the CLI: generate within the model's context
and with a seed in range, an evaluation that is not finite exits non-zero with
JSON that stays JSON, and a misspelled config key names the one meant.  Each
test failed before its fix; the C-level cases are in tests/c/test_strict.c."""
import json
import subprocess

import torch
from safetensors.torch import save_file

from test_cli import ROOT, builds, olmoc, tiny  # noqa: F401  (tiny is a fixture)
from test_fidelity import random_params

MODEL = dict(vocab_size=64, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, mlp_hidden=64)  # test_cli's TINY
TASK = ROOT / "tests" / "data" / "tiny_mc.jsonl"


def weights(path, lm_head_scale=None):
    params = random_params(MODEL, seed=11)
    if lm_head_scale is not None:  # finite weights whose logits overflow to inf
        params["lm_head.weight"] = torch.full_like(params["lm_head.weight"], lm_head_scale)
    save_file(params, str(path))
    return path


def strict_json(line):
    """json.loads without Python's NaN / Infinity extension."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(line, parse_constant=refuse)


def test_generate_stays_within_the_context(build_dir, tiny, tmp_path):  # noqa: F811
    """A 100k-token request on a 32-token model ran for minutes; the default of 32
    new tokens now shortens to the room the prompt leaves."""
    cfg, _ = tiny
    w = weights(tmp_path / "w.safetensors")
    for build in builds(build_dir):
        base = ["generate", w, "--config", cfg, "--ignore-eos"]
        try:
            r = subprocess.run([str(build / "olmoc"), *map(str, base), "--ids", "1,2,3", "--max-new-tokens", "100000"],
                               capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError("a 100000-token request ran past 60 s instead of being refused")
        assert r.returncode == 1, r.stderr
        assert ("the prompt (3 tokens) and --max-new-tokens 100000 make 100003 positions, more than the model's "
                "context of 32 (train.seq_len): at most 29 new tokens fit") in r.stderr, r.stderr
        r = olmoc(build, *base, "--ids", ",".join(["5"] * 30), "--json")
        assert r.returncode == 0, r.stderr
        assert len(json.loads(r.stdout)["generated"]) == 2  # 32 positions: 30 + 2
        r = olmoc(build, *base, "--ids", ",".join(["5"] * 33))
        assert r.returncode == 1 and "the prompt has 33 tokens, more than the model's context of 32" in r.stderr
        r = olmoc(build, *base, "--ids", "1,2,3", "--max-new-tokens", "29", "--json")
        assert r.returncode == 0 and len(json.loads(r.stdout)["generated"]) == 29, r.stderr
        r = olmoc(build, *base, "--ids", "1,2,3", "--max-new-tokens", "40", "--set", "train.seq_len=64",
                  "--json")
        assert r.returncode == 0 and len(json.loads(r.stdout)["generated"]) == 40, r.stderr


def test_generate_seed_in_range(build_dir, tiny, tmp_path):  # noqa: F811
    """--seed 2^64 saturated to 2^64-1 and ' -1' wrapped to it: both ran."""
    cfg, _ = tiny
    w = weights(tmp_path / "w.safetensors")
    for build in builds(build_dir):
        base = ["generate", w, "--config", cfg, "--ids", "1,2", "--max-new-tokens", "2", "--temperature", "1"]
        for seed in ("18446744073709551616", " -1", "-1", "0x10"):
            r = olmoc(build, *base, "--seed", seed)
            assert r.returncode == 2, (seed, r.stderr)
            assert f"--seed expects an integer in [0, 18446744073709551615], got '{seed}'" in r.stderr, r.stderr
        assert olmoc(build, *base, "--seed", "18446744073709551615").returncode == 0


def test_nonfinite_evaluation_fails_with_valid_json(build_dir, tiny, tmp_path):  # noqa: F811
    """eval --json and --scores-out printed -nan (not JSON) and exited 0 for a model
    whose outputs are not finite."""
    cfg, data = tiny
    w = weights(tmp_path / "w.safetensors", lm_head_scale=3e38)
    good = weights(tmp_path / "good.safetensors")
    for build in builds(build_dir):
        scores = tmp_path / f"scores-{build.name}.jsonl"
        r = olmoc(build, "eval", w, "--config", cfg, "--val", data, "--task", TASK, "--batches", "1", "--json",
                  "--scores-out", scores)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "the evaluation is not finite" in r.stderr and "the model's outputs are not finite" in r.stderr, \
            r.stderr
        records = [strict_json(line) for line in r.stdout.splitlines()]
        assert records and records[0]["loss"] is None, records
        lines = [strict_json(line) for line in scores.read_text().splitlines()]
        assert lines and any(None in line["logprobs"] for line in lines), lines[:2]
        # the token-id task alone: its accuracy is finite, its log-likelihoods are not
        r = olmoc(build, "eval", w, "--config", cfg, "--task", TASK, "--scores-out", scores)
        assert r.returncode == 1 and "log-likelihoods are NaN or infinite" in r.stderr, r.stderr
        assert f"written as null in {scores}" in r.stderr, r.stderr
        # ... and without --scores-out, where no null is written anywhere: the evaluator counts them
        r = olmoc(build, "eval", w, "--config", cfg, "--task", TASK)
        assert r.returncode == 1 and "log-likelihoods are NaN or infinite" in r.stderr, r.stdout + r.stderr
        # a finite model: exit 0 (null inside a name, quoted and escaped in the JSON, is not a value)
        task = tmp_path / 'say "null" \\ null.jsonl'
        task.write_bytes(TASK.read_bytes())
        r = olmoc(build, "eval", good, "--config", cfg, "--val", f"a\"null\" null={data}", "--task", task,
                  "--batches", "1", "--json", "--scores-out", scores)
        assert r.returncode == 0, r.stderr
        assert 'null' in scores.read_text().splitlines()[0], scores.read_text()[:200]
        assert all(strict_json(line)["loss"] is not None for line in r.stdout.splitlines() if '"loss"' in line)


def test_misspelled_key_names_the_one_meant(build_dir, tiny, tmp_path):  # noqa: F811
    cfg, _ = tiny
    bad = tmp_path / "bad.yaml"
    bad.write_text(cfg.read_text().replace("warmup_steps:", "warmup_step:"))
    for build in builds(build_dir):
        r = olmoc(build, "info", cfg, "--set", "train.lrr=1")
        assert r.returncode == 1 and "unknown key 'train.lrr' (did you mean 'train.lr'?)" in r.stderr, r.stderr
        r = olmoc(build, "info", bad)
        assert r.returncode == 1 and "unknown key 'train.warmup_step' (did you mean 'train.warmup_steps'?)" in \
            r.stderr, r.stderr
        r = olmoc(build, "info", cfg, "--set", "train.lr=0x10")
        assert r.returncode == 1 and "hexadecimal" in r.stderr, r.stderr
