"""SIGTERM, SIGINT and SIGHUP stop a training run cleanly whenever they come.
olmoc takes them on one thread of its own (src/train/signals.c), never on a
compute thread: oneDNN's JIT f32 GEMMs point the stack pointer at a heap
workspace, and a handler's frame there corrupted the heap ("corrupted size vs.
prev_size", rc 134) in most stops of this module's config. Stops at random
moments, single-process and under mpirun, each must exit 128 + the signal with
a checkpoint that resumes bit-identically; a signal in the first 50 ms after
olmoc starts stops it after its first step."""
import collections
import concurrent.futures
import os
import pathlib
import random
import re
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

from test_cli import builds, olmoc

pytestmark = pytest.mark.slow  # 60 stopped runs and 12 mpirun jobs: about 2 minutes
from test_reliability import (CONSTANT, MPIRUN, checkpoints, deterministic, mpi_cmd, no_sanitizer_report, rank_pids,
                              records, sanitizer_env, train_args)

# Small, but its GEMMs are large enough (the 4096-token LM head) that a
# signal lands in one most of the time.
SMALL = """model:
  vocab_size: 4096
  d_model: 128
  n_layers: 2
  n_heads: 4
  n_kv_heads: 2
  mlp_hidden: 512
  sliding_window: 64
  eos_token_id: 0
  pad_token_id: 1
train:
  seq_len: 128
  micro_batch: 4
  grad_accum: 1
  steps: 40
  lr: 2.0e-3
  warmup_steps: 2
"""

TINY = SMALL.replace("vocab_size: 4096", "vocab_size: 64").replace("d_model: 128", "d_model: 32") \
    .replace("mlp_hidden: 512", "mlp_hidden: 64").replace("seq_len: 128", "seq_len: 32")
ONEDNN = ["--backend", "cpu-onednn"]
NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT", signal.SIGHUP: "SIGHUP"}
ENV = dict(os.environ, OMP_NUM_THREADS="1")


@pytest.fixture(scope="module")
def small(build_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("signals")
    cfg = d / "small.yaml"
    cfg.write_text(SMALL)
    data = d / "train.npy"
    np.save(data, np.random.default_rng(0).integers(2, 64, 40000).astype(np.uint16))
    r = subprocess.run([str(build_dir / "olmoc"), *map(str, train_args(cfg, data, d / "probe", *ONEDNN, "--set",
                                                                          "train.steps=1"))],
                       capture_output=True, text=True, env=ENV, timeout=300)
    if "has no oneDNN" in r.stderr:
        pytest.skip("this build has no oneDNN")
    assert r.returncode == 0, r.stderr
    return cfg, data


def run_args(cfg, data, out, steps, *extra):
    return [*map(str, train_args(cfg, data, out, *ONEDNN, "--set", f"train.steps={steps}", *CONSTANT, *extra))]


def stopped_at(stderr, name):
    """{rank: step} of the 'stopped by NAME after step N' lines."""
    found = {}
    for line in stderr.splitlines():
        if f"stopped by {name} after step " in line:
            rank = int(line.split("(rank ")[1].split(")")[0]) if "(rank " in line else 0
            found[rank] = int(line.split("after step ")[1].split(":")[0])
    return found


def blocked_since(pid, timeout=30):
    """Waits until pid's main thread has SIGTERM blocked (olmoc's first act
    in main: from then on every thread it starts has it blocked too); returns
    the time then (None: it never did)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status = open(f"/proc/{pid}/status").read()
        except OSError:
            return None
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        if int(fields["SigBlk"], 16) & (1 << (signal.SIGTERM - 1)):
            return time.monotonic()
        time.sleep(0.0005)
    return None


def own_dir(root, name, pad, *files):
    """root/NAME_xxx (pad x's) holding copies of files, and its run directory:
    the paths' lengths move the process's heap layout, on which the damage a
    signal frame on a GEMM's stack does depends (the same paths in every stop
    crashed none, or nearly all, of the stops before the signal thread)."""
    d = root / (name + "_" + "x" * pad)
    d.mkdir()
    copies = [shutil.copy(f, d / f.name) for f in files]
    return d / "run", [pathlib.Path(c) for c in copies]


def check_resumes(outs, ref_records, launch):
    """Each stopped run, resumed for two more steps, matches the uninterrupted run bit for bit."""
    def resume(item):
        out, n = item
        r = launch(out, n + 2)
        assert r.returncode == 0 and f"resumed from {out}/step-{n:06d}" in r.stdout, r.stdout + r.stderr
        got = deterministic(records(out))
        assert got == ref_records[:n + 2], (out, n)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        list(pool.map(resume, outs))


def test_sixty_stops_at_random_moments(build_dir, small, tmp_path):
    """60 runs on the oneDNN backend, each sent SIGTERM (40), SIGINT (10) or
    SIGHUP (10) 0.5-2 s after it started: every one finishes its step, writes
    its checkpoint and exits 128 + the signal; its log and, resumed, its next
    two steps equal an uninterrupted run's. (Before the signal thread, most
    SIGTERM/SIGINT stops of this config aborted and SIGHUP killed the run.)"""
    cfg, data = small
    rng = random.Random(44)
    plan = [(i, sig, rng.uniform(0.5, 2.0), rng.randint(0, 64)) for i, sig in
            enumerate([signal.SIGTERM] * 40 + [signal.SIGINT] * 10 + [signal.SIGHUP] * 10)]
    rng.shuffle(plan)

    def stop(item):
        i, sig, delay, pad = item
        out, (cfg_i, data_i) = own_dir(tmp_path, f"run{i}", pad, cfg, data)
        p = subprocess.Popen([str(build_dir / "olmoc"), *run_args(cfg_i, data_i, out, 100000)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=ENV)
        time.sleep(delay)
        p.send_signal(sig)
        _, stderr = p.communicate(timeout=300)
        return out, sig, p.returncode, stderr

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        results = list(pool.map(stop, plan))
    bad = [(out.parent.name, NAMES[sig], rc, stderr[-400:]) for out, sig, rc, stderr in results if rc != 128 + sig]
    outcomes = collections.Counter(f"{name} rc {rc}" for _, name, rc, _ in bad)
    print(f"\n{len(results)} stops on the oneDNN backend: {len(results) - len(bad)} clean, {len(bad)} not "
          f"{dict(outcomes)}")
    assert not bad, bad  # before the signal thread: rc -6, "corrupted size vs. prev_size while consolidating"
    stops = []
    for out, sig, _, stderr in results:
        name = NAMES[sig]
        assert f"olmoc: {name}: finishing this step, then writing a checkpoint" in stderr, stderr
        n = stopped_at(stderr, name)[0]
        assert checkpoints(out) == [f"step-{n:06d}"], (out, stderr)
        assert [x["step"] for x in records(out)] == list(range(1, n + 1))
        stops.append((out, n))
    print(f"stopped after steps {sorted(n for _, n in stops)}")
    last = max(n for _, n in stops) + 2
    ref = tmp_path / "ref"
    r = olmoc(build_dir, *run_args(cfg, data, ref, last))
    assert r.returncode == 0, r.stderr
    ref_records = deterministic(records(ref))
    for out, n in stops:
        assert deterministic(records(out)) == ref_records[:n], out
    check_resumes(stops, ref_records, lambda out, steps: subprocess.run(
        [str(build_dir / "olmoc"), *run_args(out.parent / cfg.name, out.parent / data.name, out, steps, "--resume")],
        capture_output=True, text=True, env=ENV, timeout=300))


@pytest.mark.skipif(MPIRUN is None, reason="OpenMPI (mpirun) is not installed")
def test_stops_under_mpirun_at_random_moments(build_dir, small, tmp_path):
    """12 two-rank jobs, a signal to rank 0, rank 1 or both at a random moment
    of training (three of them within 50 ms of the targeted ranks' start): every rank stops after
    the same step with rc 128 + signal, and the checkpoint resumes on two ranks
    bit-identically to an uninterrupted two-rank run."""
    cfg, data = small
    rng = random.Random(4413)
    sigs = [signal.SIGTERM] * 6 + [signal.SIGINT] * 3 + [signal.SIGHUP] * 3
    plan = [(i, sig, rng.choice([(0,), (1,), (0, 1)]), rng.uniform(0, 0.05) if i < 3 else rng.uniform(0, 1.5),
             rng.randint(0, 64)) for i, sig in enumerate(sigs)]

    def job(item):
        i, sig, targets, delay, pad = item
        out, (cfg_i, data_i) = own_dir(tmp_path, f"job{i}", pad, cfg, data)
        p = subprocess.Popen(mpi_cmd(build_dir, 2, run_args(cfg_i, data_i, out, 100000)), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True)
        try:
            pids = rank_pids(p.pid, 2)
            if i < 3:  # early: counted from the moment the last targeted rank's main started listening
                # (before that moment a signal has its default action: a rank that starts later than the
                # other must be waited for too)
                sinces = [blocked_since(pids[r]) for r in targets]
                assert None not in sinces, "olmoc never blocked SIGTERM"
                time.sleep(max(0.0, max(sinces) + delay - time.monotonic()))
            else:  # counted from the first step (MPI's start-up alone can take seconds here)
                for line in p.stdout:
                    if line.startswith("step 1/"):
                        break
                time.sleep(delay)
            for r in targets:
                try:
                    os.kill(pids[r], sig)
                except ProcessLookupError:
                    pass  # already stopped (told by the other rank through the all-reduce) and exited
            stdout, stderr = p.communicate(timeout=300)
        except BaseException:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            raise
        return out, sig, p.returncode, stdout, stderr

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(job, plan))
    stops = []
    for out, sig, rc, stdout, stderr in results:
        name = NAMES[sig]
        at = stopped_at(stderr, name)
        assert rc == 128 + sig and sorted(at) == [0, 1] and len(set(at.values())) == 1, (out, rc, stderr)
        n = at[0]
        assert checkpoints(out)[-1] == f"step-{n:06d}" and [x["step"] for x in records(out)] == list(range(1, n + 1))
        stops.append((out, n))
    print(f"\n{len(results)} mpirun jobs (2 ranks) stopped cleanly after steps {sorted(n for _, n in stops)}")
    last = max(n for _, n in stops) + 2
    ref = tmp_path / "ref"
    r = subprocess.run(mpi_cmd(build_dir, 2, run_args(cfg, data, ref, last)), capture_output=True, text=True,
                       env=ENV, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    ref_records = deterministic(records(ref))
    check_resumes(stops, ref_records, lambda out, steps: subprocess.run(
        mpi_cmd(build_dir, 2, run_args(out.parent / cfg.name, out.parent / data.name, out, steps, "--resume")),
        capture_output=True, text=True, env=ENV, timeout=300))


@pytest.mark.parametrize("delay_ms", [0, 5, 20, 50])
def test_a_signal_in_the_first_50_ms(build_dir, tmp_path, delay_ms):
    """SIGTERM 0-50 ms after olmoc's main started (it blocks the signals
    first thing, before any other thread starts), during start-up on a loaded
    machine (on an idle one this tiny run may already be a few steps in by
    50 ms): the run stops at the first step boundary it reaches, writes that
    step's checkpoint, exits 143, and resumes. On both builds, with nothing
    leaked."""
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY)
    data = tmp_path / "train.npy"
    np.save(data, np.random.default_rng(0).integers(2, 64, 4000).astype(np.uint16))
    for build in builds(build_dir):
        out = tmp_path / f"run_{build.name}"
        p = subprocess.Popen([str(build / "olmoc"), *run_args(cfg, data, out, 100000)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=sanitizer_env(build))
        since = blocked_since(p.pid)
        if since is None:
            p.kill()
            raise AssertionError(f"olmoc never blocked SIGTERM: {p.communicate()}")
        time.sleep(max(0.0, since + delay_ms / 1000 - time.monotonic()))
        p.send_signal(signal.SIGTERM)
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 128 + signal.SIGTERM, (p.returncode, stderr)
        no_sanitizer_report(stderr)
        stop = re.search(r"stopped by SIGTERM after step (\d+): checkpoint '(.*)' written", stderr)
        assert stop, stderr
        n = int(stop.group(1))
        assert stop.group(2) == f"{out}/step-{n:06d}", stderr
        assert checkpoints(out)[-1] == f"step-{n:06d}" and [x["step"] for x in records(out)] == list(range(1, n + 1))
        r = olmoc(build, *run_args(cfg, data, out, n + 1, "--resume"))
        assert r.returncode == 0 and "resumed from" in r.stdout, r.stderr


def test_sighup_ignored_by_the_parent_stays_ignored(build_dir, tmp_path):
    """Under nohup (SIGHUP ignored) a SIGHUP neither stops nor kills the run;
    SIGTERM still stops it."""
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY)
    data = tmp_path / "train.npy"
    np.save(data, np.random.default_rng(0).integers(2, 64, 4000).astype(np.uint16))
    out = tmp_path / "run"
    p = subprocess.Popen([str(build_dir / "olmoc"), *run_args(cfg, data, out, 100000)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=ENV,
                         preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    for line in p.stdout:
        if line.startswith("step 3/"):
            break
    p.send_signal(signal.SIGHUP)
    time.sleep(0.3)
    assert p.poll() is None
    p.send_signal(signal.SIGTERM)
    _, stderr = p.communicate(timeout=120)
    assert p.returncode == 128 + signal.SIGTERM and "SIGHUP" not in stderr, (p.returncode, stderr)
