"""Runs that survive what real runs meet: a diverging run (train.nonfinite:
stop or skip), NaN/inf in weights and optimizer state at load, SIGTERM and
SIGINT (alone, twice, and under mpirun), and error paths that free what they
allocated (LeakSanitizer on the sanitizer build).

The stopping run pushes NaN through the model on the sanitizer build too:
the CPU backend's fast exp converted a NaN to int32 there (undefined
behaviour that UBSan reported)."""
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
import xxhash
from safetensors.torch import load_file, save_file

from test_cli import ROOT, SANITIZER_REPORTS, builds, olmoc, tiny  # noqa: F401  (tiny is a fixture)

FAST = ["--set", "train.peak_flops=1e12"]  # skip the startup SGEMM measurement
DIVERGE = ["--set", "train.lr=1e29"]  # step 1 is finite; its update makes every later loss NaN
MPIRUN = shutil.which("mpirun")


def train_args(cfg, data, out, *extra):
    return ["train", cfg, "--set", f"data.train_path={data}", "--set", f"data.out_dir={out}", *FAST, *extra]


def records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def deterministic(recs):
    skip = {"tokens_per_s", "mfu", "elapsed", "tokens_per_s_per_device", "mem_peak_bytes"}
    return [{k: v for k, v in r.items() if k not in skip} for r in recs]


def checkpoints(out):
    return sorted(p.name for p in out.iterdir() if p.name.startswith("step-"))


# ---- state.json's content hash (XXH3-64, "hash": "xxh3_64"), to forge checkpoints that pass verification


def hash64(data):
    return xxhash.xxh3_64_intdigest(data)


def unverified(ck):
    """state.json of checkpoint ck, and the files it lists (the shards included) whose size or XXH3-64 hash
    is not the one it records."""
    state = json.loads((ck / "state.json").read_text())
    entries = list(state["files"].items()) + [(s["file"], s) for s in state.get("shards", [])]
    bad = []
    for name, e in entries:
        data = (ck / name).read_bytes()
        if len(data) != e["bytes"] or f"{hash64(data):016x}" != e["hash64"]:
            bad.append(name)
    return state, bad


def rehash(ck):
    """Rewrites state.json's sizes and hashes after a file of checkpoint ck was changed."""
    state = json.loads((ck / "state.json").read_text())
    assert state["hash"] == "xxh3_64", state.get("hash")
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
    for build in builds(build_dir):
        out = tmp_path / f"run-{build.name}"
        r = olmoc(build, *train_args(cfg, data, out, "--set", "train.steps=6", "--set", "train.save_every=1",
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
        r = olmoc(build, *train_args(cfg, data, out, "--set", "train.steps=6", *DIVERGE, "--resume"))
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
    first = (out / "step-000001" / "model.safetensors").read_bytes()
    assert all((out / f"step-00000{s}" / "model.safetensors").read_bytes() == first for s in range(2, 7))
    # the moments and Adam's step: the same tensors, bit for bit (the file's own record of the run state,
    # its step and tokens, moves on)
    first = load_file(out / "step-000001" / "optim.safetensors")
    for s in range(2, 7):
        later = load_file(out / f"step-00000{s}" / "optim.safetensors")
        assert later.keys() == first.keys() and all(torch.equal(later[k], first[k]) for k in first), s
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


# ---- SIGTERM / SIGINT


def sanitizer_env(build):
    return dict(os.environ, ASAN_OPTIONS="detect_leaks=1", OMP_NUM_THREADS="1")


def no_sanitizer_report(stderr):
    assert "Sanitizer" not in stderr and "runtime error:" not in stderr, stderr


CONSTANT = ["--set", "train.schedule=constant", "--set", "train.save_every=1000", "--set", "train.keep_last=0"]


@pytest.mark.parametrize("save", ["sync", "async"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1])
def test_signal_stops_after_the_step_with_a_checkpoint(build_dir, tiny, tmp_path, sig, save):  # noqa: F811
    """A signal mid-run: the run finishes its step, writes a checkpoint of it
    (here the only one: train.save_every is far away) and exits 128 + signal;
    resumed, it ends bit-identical to a run never interrupted (train.async_save
    or not: the stop waits for its save)."""
    cfg, data = tiny
    out = tmp_path / "run"
    mode = ["--set", f"train.async_save={str(save == 'async').lower()}"]
    cmd = [str(build_dir / "olmoc"), *map(str, train_args(cfg, data, out, "--set", "train.steps=1000000",
                                                           *CONSTANT, *mode))]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stdout:
        if line.startswith("step 5/"):
            break
    p.send_signal(sig)
    stdout, stderr = p.communicate(timeout=120)
    name = signal.Signals(sig).name
    assert p.returncode == 128 + sig, (p.returncode, stderr)
    assert f"olmoc: {name}: finishing this step, then writing a checkpoint" in stderr, stderr
    steps = [x["step"] for x in records(out)]
    n = steps[-1]
    assert n >= 5 and steps == list(range(1, n + 1))
    assert f"olmoc train: stopped by {name} after step {n}: checkpoint '{out}/step-{n:06d}' written; continue " \
           "with --resume" in stderr, stderr
    assert f"checkpoint step {n}: {out}/step-{n:06d}" in stdout
    assert checkpoints(out) == [f"step-{n:06d}"] and not (out / "model.safetensors").exists()
    total = n + 3
    r = olmoc(build_dir, *train_args(cfg, data, out, "--set", f"train.steps={total}", *CONSTANT, *mode, "--resume"))
    assert r.returncode == 0 and f"resumed from {out}/step-{n:06d}" in r.stdout, r.stderr
    ref = tmp_path / "ref"
    r = olmoc(build_dir, *train_args(cfg, data, ref, "--set", f"train.steps={total}", *CONSTANT))
    assert r.returncode == 0, r.stderr
    assert deterministic(records(out)) == deterministic(records(ref))
    assert (out / "model.safetensors").read_bytes() == (ref / "model.safetensors").read_bytes()
    for f in ("model.safetensors", "optim.safetensors"):
        assert (out / f"step-{total:06d}" / f).read_bytes() == (ref / f"step-{total:06d}" / f).read_bytes()


def blocked_on_dump_fifo(build, cfg, data, out, fifo):
    """A run held in olmoc's open of --dump-batches FIFO (its signal handlers
    already installed: metrics.jsonl, opened just before, exists)."""
    os.mkfifo(fifo)
    cmd = [str(build / "olmoc"), *map(str, train_args(cfg, data, out, "--set", "train.steps=50", *CONSTANT,
                                                      "--dump-batches", fifo))]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=sanitizer_env(build))
    deadline = time.monotonic() + 60
    while not (out / "metrics.jsonl").exists():
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.02)
    time.sleep(0.2)
    return p


def test_a_second_signal_exits_at_once(build_dir, tiny, tmp_path):  # noqa: F811
    """Held before its first step (blocked opening a FIFO nobody reads), a run
    signalled once would still do a step and write a checkpoint; signalled
    twice it ends at once, by the signal, writing nothing."""
    cfg, data = tiny
    for build in builds(build_dir):
        out = tmp_path / f"run_{build.name}"
        p = blocked_on_dump_fifo(build, cfg, data, out, tmp_path / f"fifo_{build.name}")
        p.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        assert p.poll() is None
        p.send_signal(signal.SIGINT)
        _, stderr = p.communicate(timeout=60)
        assert p.returncode == -signal.SIGINT, (p.returncode, stderr)
        assert "olmoc: SIGTERM: finishing this step" in stderr and \
            "olmoc: second signal: exiting at once, without a checkpoint" in stderr, stderr
        assert checkpoints(out) == [] and records(out) == []


def test_one_signal_before_the_first_step(build_dir, tiny, tmp_path):  # noqa: F811
    """The same held run signalled once: released, it trains one step, writes
    step-000001 and stops (under ASan: with nothing leaked)."""
    cfg, data = tiny
    for build in builds(build_dir):
        out = tmp_path / f"run_{build.name}"
        fifo = tmp_path / f"fifo_{build.name}"
        p = blocked_on_dump_fifo(build, cfg, data, out, fifo)
        p.send_signal(signal.SIGTERM)
        drained = []
        reader = threading.Thread(target=lambda: drained.append(len(fifo.read_bytes())))
        reader.start()
        stdout, stderr = p.communicate(timeout=120)
        if reader.is_alive():  # olmoc died without opening the FIFO: let the reader's open return
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join()
        assert p.returncode == 128 + signal.SIGTERM, (p.returncode, stderr)
        no_sanitizer_report(stderr)
        assert f"stopped by SIGTERM after step 1: checkpoint '{out}/step-000001' written" in stderr, stderr
        assert checkpoints(out) == ["step-000001"] and [x["step"] for x in records(out)] == [1]
        assert drained == [4 * 32 * 4]  # one step's batch
        r = olmoc(build, *train_args(cfg, data, out, "--set", "train.steps=2", *CONSTANT, "--resume"))
        assert r.returncode == 0 and "resumed from" in r.stdout, r.stderr


def rank_pids(launcher_pid, n, timeout=60):
    """PIDs of the ranks mpirun started, by rank (OMPI_COMM_WORLD_RANK)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                stat = open(f"/proc/{d}/stat").read()
                if int(stat.rsplit(")", 1)[1].split()[1]) != launcher_pid:
                    continue
                env = open(f"/proc/{d}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            for kv in env:
                if kv.startswith(b"OMPI_COMM_WORLD_RANK="):
                    found[int(kv.split(b"=")[1])] = int(d)
        if len(found) == n:
            return found
        time.sleep(0.05)
    raise AssertionError(f"did not find {n} ranks under mpirun (pid {launcher_pid})")


def mpi_cmd(build_dir, ranks, args):
    return [MPIRUN, "--oversubscribe", "--allow-run-as-root", "-np", str(ranks), str(build_dir / "olmoc"),
            *map(str, args)]


@pytest.mark.slow
@pytest.mark.skipif(MPIRUN is None, reason="OpenMPI (mpirun) is not installed")
def test_signals_under_mpirun_stop_every_rank_at_the_same_step(build_dir, tiny, tmp_path):  # noqa: F811
    """Three ranks; the scheduler's SIGTERM reaches rank 1, then (a little
    later) rank 2, never rank 0: every rank stops after the same step, the checkpoint of
    that step is complete, and resuming it on 3 ranks matches an uninterrupted
    3-rank run."""
    cfg, data = tiny
    out = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    args = train_args(cfg, data, out, "--set", "train.steps=1000000", "--set", "train.grad_accum=1", *CONSTANT)
    p = subprocess.Popen(mpi_cmd(build_dir, 3, args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, start_new_session=True)
    try:
        pids = rank_pids(p.pid, 3)
        for line in p.stdout:
            if line.startswith("step 3/"):
                break
        os.kill(pids[1], signal.SIGTERM)
        time.sleep(0.01)
        try:
            os.kill(pids[2], signal.SIGTERM)
        except ProcessLookupError:
            pass  # rank 2 has already stopped (told by rank 1 through the all-reduce) and exited
        stdout, stderr = p.communicate(timeout=120)
    except BaseException:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise
    assert p.returncode != 0, stdout + stderr
    stopped = {}
    for line in stderr.splitlines():
        if "): stopped by SIGTERM after step " in line:
            rank = int(line.split("(rank ")[1].split(")")[0])
            stopped[rank] = int(line.split("after step ")[1].split(":")[0])
    assert sorted(stopped) == [0, 1, 2] and len(set(stopped.values())) == 1, stderr
    n = stopped[0]
    assert checkpoints(out) == [f"step-{n:06d}"] and [x["step"] for x in records(out)] == list(range(1, n + 1))
    total = n + 2
    more = ["--set", f"train.steps={total}", "--set", "train.grad_accum=1", *CONSTANT]
    r = subprocess.run(mpi_cmd(build_dir, 3, train_args(cfg, data, out, *more, "--resume")), capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0 and f"resumed from {out}/step-{n:06d}" in r.stdout, r.stdout + r.stderr
    ref = tmp_path / "ref"
    r = subprocess.run(mpi_cmd(build_dir, 3, train_args(cfg, data, ref, *more)), capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert deterministic(records(out)) == deterministic(records(ref))
    assert (out / "model.safetensors").read_bytes() == (ref / "model.safetensors").read_bytes()
    print(f"\nmpirun -np 3: SIGTERM to ranks 1 and 2 only; all 3 ranks stopped after step {n}")



@pytest.mark.skipif(MPIRUN is None, reason="OpenMPI (mpirun) is not installed")
def test_nonfinite_step_stops_every_rank(build_dir, tiny, tmp_path):  # noqa: F811
    """Under mpirun the ranks judge the same all-reduced loss: both stop at
    step 2, each saying so, and the job ends (no rank left in a collective)."""
    cfg, data = tiny
    out = tmp_path / "run"
    args = train_args(cfg, data, out, "--set", "train.steps=6", "--set", "train.save_every=1", "--set",
                      "train.grad_accum=1", *DIVERGE)
    r = subprocess.run(mpi_cmd(build_dir, 2, args), capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode != 0, r.stdout + r.stderr
    for rank in (0, 1):
        assert f"olmoc train (rank {rank}): step 2: the loss is NaN: stopping the run" in r.stderr, r.stderr
    assert "MPI_ABORT" not in r.stderr, r.stderr
    assert checkpoints(out) == ["step-000001"] and not (out / "model.safetensors").exists()

# ---- error paths free what they allocated


def test_refused_runs_free_what_they_allocated(build_dir, tiny, tmp_path):  # noqa: F811
    """Every refusal of a resume or of a bad input, on each build; on the
    sanitizer build (OLMOC_BUILD_ASAN) with leak detection on, where olmoc()
    fails the test on any LeakSanitizer or AddressSanitizer report."""
    cfg, data = tiny
    out = tmp_path / "run"
    base = ["--set", "train.steps=4", "--set", "train.save_every=2", "--set", "train.keep_last=0"]
    r = olmoc(build_dir, *train_args(cfg, data, out, *base))
    assert r.returncode == 0, r.stderr
    ck = out / "step-000002"

    def state_edit(fn):
        def mutate(d):
            state = json.loads((d / "state.json").read_text())
            fn(state)
            (d / "state.json").write_text(json.dumps(state))
        return mutate

    def tensors_edit(name, fn):
        def mutate(d):
            tensors = load_file(str(d / name))
            fn(tensors)
            save_file(tensors, str(d / name), metadata={"format": "pt"})
            rehash(d)
        return mutate

    def write(name, content, rehashed=True):
        def mutate(d):
            (d / name).write_bytes(content(d) if callable(content) else content)
            if rehashed:
                rehash(d)
        return mutate

    emb = "model.embed_tokens.weight"
    checkpoint_cases = {
        "no state.json": (lambda d: (d / "state.json").unlink(), "is incomplete or corrupt"),
        "state.json not JSON": (write("state.json", b"{not json", False), "state.json is not a JSON object"),
        "state.json a list": (write("state.json", b"[1, 2]", False), "state.json is not a JSON object"),
        "other format": (state_edit(lambda s: s.update(format="x")), "is not an olmoc checkpoint state"),
        "version 7": (state_edit(lambda s: s.update(version=7)), "format version 7"),
        "no step": (state_edit(lambda s: s.pop("step")), "state.json has no valid 'step'"),
        "negative tokens": (state_edit(lambda s: s.update(tokens=-5)), "state.json has no valid 'tokens'"),
        "no loader": (state_edit(lambda s: s.pop("loader")), "state.json has no valid 'loader'"),
        "epoch a string": (state_edit(lambda s: s["loader"].update(epoch="1")), "has no valid 'epoch'"),
        "no files": (state_edit(lambda s: s.pop("files")), "state.json lists no files"),
        "no optim hash": (state_edit(lambda s: s["files"]["optim.safetensors"].pop("hash64")),
                          "has no size/hash for optim.safetensors"),
        "negative skipped_steps": (state_edit(lambda s: s.update(skipped_steps=-1)), "no valid 'skipped_steps'"),
        "no config.yaml": (lambda d: (d / "config.yaml").unlink(), "config.yaml is missing"),
        "truncated model": (write("model.safetensors", lambda d: (d / "model.safetensors").read_bytes()[:999], False),
                            "model.safetensors has 999 bytes"),
        "flipped byte": (write("model.safetensors", lambda d: (d / "model.safetensors").read_bytes()[:-3] + b"\x7f\x7f\x7f",
                               False), "the content hash of model.safetensors"),
        "model header garbage": (write("model.safetensors", b"\x10\0\0\0\0\0\0\0{garbage garbage}"), "model.safetensors"),
        "model truncated, rehashed": (write("model.safetensors", lambda d: (d / "model.safetensors").read_bytes()[:4000]),
                                      "model.safetensors"),
        "model missing a tensor": (tensors_edit("model.safetensors", lambda t: t.pop("lm_head.weight")),
                                   "has no tensor 'lm_head.weight'"),
        "model wrong shape": (tensors_edit("model.safetensors", lambda t: t.update({emb: t[emb][:, :16].clone()})),
                              f"tensor '{emb}' has shape [64, 16] but the config needs [64, 32]"),
        "model extra tensor": (tensors_edit("model.safetensors", lambda t: t.update(extra=torch.zeros(2))),
                               "has unexpected tensor 'extra'"),
        "optim missing a moment": (tensors_edit("optim.safetensors", lambda t: t.pop(f"{emb}.exp_avg")),
                                   f"has no tensor '{emb}.exp_avg'"),
        "optim fp16 moment": (tensors_edit("optim.safetensors", lambda t: t.update(
            {f"{emb}.exp_avg": t[f"{emb}.exp_avg"].half()})), f"tensor '{emb}.exp_avg' is not F32"),
        "optim step 3": (tensors_edit("optim.safetensors", lambda t: t.update(step=torch.tensor([3]))),
                         "is inconsistent: optimizer step 3"),
        "optim NaN": (tensors_edit("optim.safetensors", lambda t: t[f"{emb}.exp_avg"].view(-1).__setitem__(0, math.nan)),
                      "that are not finite"),
        "config unknown key": (write("config.yaml", lambda d: (d / "config.yaml").read_bytes() + b"  bogus: 1\n"),
                               "unknown key"),
        "config other d_model": (write("config.yaml", lambda d: (d / "config.yaml").read_bytes().replace(
            b"d_model: 32", b"d_model: 48")), "model.d_model is 48 in the checkpoint but 32"),
    }
    other_data = tmp_path / "other.npy"
    np.save(other_data, np.arange(2, 64 * 40, dtype=np.uint16) % 64)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x08\0\0\0\0\0\0\0{}garbage")
    run_cases = {
        "not a directory": (["--resume-from", tmp_path / "nope"], "is not a directory"),
        "other data": (["--set", f"data.train_path={other_data}", "--resume-from", ck], "not the same data"),
        "newer checkpoint in out_dir": (["--set", f"data.out_dir={out}", "--resume-from", ck],
                                        "newer than the checkpoint to resume from (step 2)"),
        "out_dir holds a run": (["--set", f"data.out_dir={out}"], "already holds checkpoint"),
        "--init missing": (["--init", tmp_path / "none.safetensors"], "none.safetensors"),
        "--init garbage": (["--init", garbage], "garbage.safetensors"),
        "seq_len mismatch": (["--set", "train.seq_len=16", "--resume-from", ck], "train.seq_len is 32 in the checkpoint"),
    }
    tried = 0
    for i, (name, (mutate, message)) in enumerate(checkpoint_cases.items()):
        bad = tmp_path / f"bad{i}"
        shutil.copytree(ck, bad)
        mutate(bad)
        for build in builds(build_dir):
            r = olmoc(build, *train_args(cfg, data, tmp_path / "o", *base, "--resume-from", bad))
            assert r.returncode == 1 and message in r.stderr, (name, r.stderr)
            r = olmoc(build, "eval", bad, "--val", data)
            assert r.returncode == (0 if name.startswith("optim") else 1), (name, r.stderr)  # eval reads no optim
            tried += 2
    for name, (extra, message) in run_cases.items():
        for build in builds(build_dir):
            r = olmoc(build, *train_args(cfg, data, tmp_path / "o", *base, *extra))
            assert r.returncode == 1 and message in r.stderr, (name, r.stderr)
            tried += 1
    print(f"\nrefused: {len(checkpoint_cases)} damaged checkpoints (train --resume-from and eval) and "
          f"{len(run_cases)} other refusals; {tried} runs on {len(builds(build_dir))} build(s)")


def test_configs_that_cannot_fit_in_memory_are_refused_up_front(build_dir, tiny, tmp_path):  # noqa: F811
    """A config whose parameters or activations cannot fit in this process's
    memory is refused before allocating, naming what to reduce, on any
    machine: ~3e12 parameters (26 TB of weights and gradients), then 2^24
    tokens x a 2^20 vocabulary of logits (64 TiB).  Before, the allocations
    themselves failed ("out of memory") or, split into buffers each smaller
    than the machine, succeeded and left the OOM killer to end the run.
    On the sanitizer build both run with leak detection on and any sanitizer
    report fails the test: the model made before the activations are refused
    is freed."""
    cfg, data = tiny
    huge_model = ["--set", "model.d_model=16384", "--set", "model.n_heads=128", "--set", "model.n_kv_heads=128",
                  "--set", "model.n_layers=1024", "--set", "model.mlp_hidden=65536"]
    huge_batch = ["--set", "model.vocab_size=1048576", "--set", "train.micro_batch=256", "--set",
                  "train.seq_len=65536", "--set", "model.sliding_window=64"]
    for build in builds(build_dir):
        r = olmoc(build, *train_args(cfg, data, tmp_path / f"run-{build.name}", "--set", "train.steps=1",
                                     *huge_model))
        assert r.returncode == 1, r.stdout + r.stderr
        assert all(w in r.stderr for w in ("parameters need", "more than this process may use", "model.n_layers")), \
            r.stderr
        # random tokens (bench_train): no token file needs 2^24 tokens.  The model exists when the
        # activations are refused: on the sanitizer build, leak detection shows it was freed
        env = dict(os.environ, ASAN_OPTIONS=":".join(filter(None, [os.environ.get("ASAN_OPTIONS", ""),
                                                                   "detect_leaks=1"])))
        r = subprocess.run([str(build / "tests" / "bench_train"), str(cfg), "cpu", "--steps", "1", "--warmup", "0",
                            *huge_batch], capture_output=True, text=True, timeout=120, env=env)
        reports = [x for x in SANITIZER_REPORTS if x in r.stderr]
        assert not reports, f"bench_train on {build}: {reports[0]}\n{r.stderr}"
        assert r.returncode == 1, r.stdout + r.stderr
        assert ("activations for train.micro_batch 256 x train.seq_len 65536 need" in r.stderr and
                "reduce train.micro_batch" in r.stderr), r.stderr
