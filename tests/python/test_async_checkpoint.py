"""Asynchronous checkpoint saves (train.async_save, src/train/checkpoint_async.c):
training goes on while a writer thread writes the checkpoint from a host copy;
a signal and the run's end wait for the save in flight; the files are the
synchronous save's byte for byte.  OLMOC_DEBUG_SAVE_DELAY holds each save in
flight for that many seconds (a slow file system)."""
import json
import os
import shutil
import signal
import subprocess

import pytest

from test_cli import olmoc, tiny  # noqa: F401  (tiny is a fixture)
from test_reliability import unverified

MPIRUN = shutil.which("mpirun")
needs_mpi = pytest.mark.skipif(MPIRUN is None, reason="OpenMPI (mpirun) is not installed")

BASE = ["--set", "train.peak_flops=1e12", "--set", "train.schedule=constant", "--set", "train.keep_last=0",
        "--set", "train.log_every=1"]
ASYNC = ["--set", "train.async_save=true"]


def train_cmd(build_dir, cfg, data, out, ranks, *extra):
    cmd = [str(build_dir / "olmoc"), "train", str(cfg), "--set", f"data.train_path={data}",
           "--set", f"data.out_dir={out}", *BASE, *map(str, extra)]
    if ranks > 1:
        cmd = [MPIRUN, "--oversubscribe", "--allow-run-as-root", "-np", str(ranks), *cmd]
    return cmd


def env(delay=None):
    e = dict(os.environ, OMP_NUM_THREADS="1")
    if delay:
        e["OLMOC_DEBUG_SAVE_DELAY"] = str(delay)
    return e


def records(out):
    # timings, and the memory peak (the asynchronous save's host copy counts in it)
    skip = {"tokens_per_s", "mfu", "elapsed", "tokens_per_s_per_device", "mem_peak_bytes"}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in skip} for r in rows]


def checkpoints(out):
    """The step directories, and nothing a save left half written."""
    names = sorted(p.name for p in out.iterdir() if "step" in p.name)
    assert not [n for n in names if not n.startswith("step-")], names
    return names


def verified(ck):
    """Every file state.json lists has its size and XXH3-64 hash."""
    state, bad = unverified(ck)
    assert not bad, (ck, bad)
    return state


def same_checkpoint(a, b):
    """Byte-identical tensor files; state.json equal but for the wall time and config.yaml (which holds
    train.async_save itself)."""
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for n in names:
        if n.endswith(".safetensors"):
            assert (a / n).read_bytes() == (b / n).read_bytes(), (a, n)
    sa, sb = verified(a), verified(b)
    for s in (sa, sb):
        s.pop("elapsed_s")
        s["files"].pop("config.yaml")
    assert sa == sb


@pytest.mark.parametrize("ranks", [1, pytest.param(2, marks=needs_mpi)])
def test_run_end_waits_for_the_save_in_flight_and_matches_sync(build_dir, tiny, tmp_path, ranks):  # noqa: F811
    """Step 3's save is held in flight for 2 s: step 4 trains meanwhile, the
    last step's save waits for it, and the run's end for the last one.  Every
    checkpoint file (one rank: whole tensors; two: shards), the final weights
    and the metrics are the synchronous run's, byte for byte."""
    cfg, data = tiny
    steps = ["--set", "train.steps=4", "--set", "train.save_every=3"]
    ref, out = tmp_path / "sync", tmp_path / "async"
    r = subprocess.run(train_cmd(build_dir, cfg, data, ref, ranks, *steps), capture_output=True, text=True,
                       env=env(), timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(train_cmd(build_dir, cfg, data, out, ranks, *steps, *ASYNC), capture_output=True, text=True,
                       env=env(delay=2), timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    at = {key: next(i for i, line in enumerate(lines) if line.startswith(key))
          for key in ("step 4/4", "checkpoint step 3:", "checkpoint step 4:", "done:")}
    # training went on while step 3's save was in flight; the end waited for step 4's
    assert at["step 4/4"] < at["checkpoint step 3:"] < at["checkpoint step 4:"] < at["done:"], r.stdout
    assert "written in the background" in lines[at["checkpoint step 3:"]]
    assert checkpoints(out) == ["step-000003", "step-000004"] == checkpoints(ref)
    for ck in checkpoints(out):
        same_checkpoint(ref / ck, out / ck)
    assert (out / "model.safetensors").read_bytes() == (ref / "model.safetensors").read_bytes()
    assert records(out) == records(ref)


def test_sigterm_waits_for_the_save_in_flight(build_dir, tiny, tmp_path):  # noqa: F811
    """SIGTERM while step 3's save is in flight (held 3 s): the run finishes
    its step, completes that save, writes one of the step it stopped after,
    exits 143; resumed, it ends bit-identical to an uninterrupted run."""
    cfg, data = tiny
    out = tmp_path / "run"
    cmd = train_cmd(build_dir, cfg, data, out, 1, "--set", "train.steps=1000000", "--set", "train.save_every=3",
                    *ASYNC)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(delay=3))
    seen = []
    for line in p.stdout:
        seen.append(line)
        if line.startswith("step 4/"):
            break
    p.send_signal(signal.SIGTERM)
    stdout, stderr = p.communicate(timeout=120)
    stdout = "".join(seen) + stdout
    assert p.returncode == 128 + signal.SIGTERM, (p.returncode, stderr)
    assert "checkpoint step 3:" not in "".join(seen), "step 3's save was not in flight at the signal"
    steps = [x["step"] for x in records(out) if x["type"] == "train"]
    n = steps[-1]
    assert n >= 4 and steps == list(range(1, n + 1))
    assert f"stopped by SIGTERM after step {n}: checkpoint '{out}/step-{n:06d}' written" in stderr, stderr
    assert f"checkpoint step 3: {out}/step-000003" in stdout and f"checkpoint step {n}: {out}/step-{n:06d}" in stdout
    want = sorted({"step-000003", f"step-{n:06d}", *(f"step-{s:06d}" for s in range(3, n + 1, 3))})
    assert checkpoints(out) == want
    for ck in want:
        assert verified(out / ck)["step"] == int(ck[5:])
    total = n + 2
    steps_to = ["--set", f"train.steps={total}", "--set", "train.save_every=3"]
    r = subprocess.run(train_cmd(build_dir, cfg, data, out, 1, *steps_to, *ASYNC, "--resume"), capture_output=True,
                       text=True, env=env(), timeout=300)
    assert r.returncode == 0 and f"resumed from {out}/step-{n:06d}" in r.stdout, r.stderr
    ref = tmp_path / "ref"
    r = subprocess.run(train_cmd(build_dir, cfg, data, ref, 1, *steps_to), capture_output=True, text=True,
                       env=env(), timeout=300)
    assert r.returncode == 0, r.stderr
    assert records(out) == records(ref)
    assert (out / "model.safetensors").read_bytes() == (ref / "model.safetensors").read_bytes()
    same_checkpoint(ref / f"step-{total:06d}", out / f"step-{total:06d}")


def test_async_save_is_off_by_default(build_dir, tiny, tmp_path):  # noqa: F811
    cfg, data = tiny
    out = tmp_path / "run"
    r = subprocess.run(train_cmd(build_dir, cfg, data, out, 1, "--set", "train.steps=2", "--set",
                                 "train.save_every=2"), capture_output=True, text=True, env=env(), timeout=300)
    assert r.returncode == 0, r.stderr
    assert "async_save: false" in (out / "config.yaml").read_text()
    assert "written in the background" not in r.stdout
    r = olmoc(build_dir, "train", cfg, "--set", f"data.train_path={data}", "--set", f"data.out_dir={tmp_path / 'x'}",
              "--set", "train.async_save=maybe")
    assert r.returncode != 0 and "train.async_save" in r.stderr, r.stderr
