"""A lost or hung rank ends an mpirun job within a bounded time, on the CPU
(MPI collectives) and on the emulated CUDA backend (NCCL collectives,
tests/c/cuda_emu): rank 1 of 2 is SIGKILLed in the middle of a step, in the
middle of a checkpoint save and while rank 0 waits for it in a collective,
or SIGSTOPped (then the collective watchdog, train.collective_timeout, ends
rank 0).  Each time the job ends, every rank gone, within BOUND seconds; the
newest complete checkpoint's files match the hashes of its state.json; and
a relaunch with --resume continues from it."""
import os
import queue
import random
import shutil
import signal
import subprocess
import threading
import time

import pytest

from test_cli import tiny  # noqa: F401  (fixture: tiny config + token file)
from test_reliability import rank_pids, unverified

MPIRUN = shutil.which("mpirun")
pytestmark = [pytest.mark.skipif(MPIRUN is None, reason="OpenMPI (mpirun) is not installed"), pytest.mark.slow]

BOUND = 60.0  # seconds from the fault to the end of the job (generous: a shared, loaded machine)
TIMEOUT = 10  # train.collective_timeout of these runs
ENV = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="passive")


@pytest.fixture(params=["cpu", "cuda-emulated"])
def launcher(request, build_dir):
    if request.param == "cpu":
        return [str(build_dir / "olmoc")], []
    emu = build_dir / "tests" / "olmoc_emu"
    if not emu.exists():
        pytest.skip("olmoc_emu not built (needs a C++ compiler: OLMOC_CUDA_EMULATION_TEST)")
    return [str(emu)], ["--backend", "cuda"]


def train_cmd(launcher, cfg, data, out, *extra):
    binary, backend = launcher
    return [MPIRUN, "--oversubscribe", "--allow-run-as-root", "-np", "2", *binary, "train", str(cfg), *backend,
            "--set", f"data.train_path={data}", "--set", f"data.out_dir={out}", "--set", "train.peak_flops=1e12",
            "--set", "train.save_every=2", "--set", "train.keep_last=0", "--set", f"train.collective_timeout={TIMEOUT}",
            *extra]


class Job:
    """A 2-rank training job that runs until it is made to fail; its output lines arrive in a queue."""

    def __init__(self, launcher, cfg, data, out):
        self.p = subprocess.Popen(train_cmd(launcher, cfg, data, out, "--set", "train.steps=1000000"),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                                  start_new_session=True)
        self.lines, self.err = queue.Queue(), []
        threading.Thread(target=lambda: [self.lines.put(x) for x in self.p.stdout], daemon=True).start()
        threading.Thread(target=lambda: self.err.extend(self.p.stderr), daemon=True).start()
        self.pids = rank_pids(self.p.pid, 2)

    def wait_for_step(self, n, timeout=300):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                assert self.p.poll() is None, "the job ended early:\n" + "".join(self.err)
                continue
            if line.startswith(f"step {n}/"):
                return
        raise AssertionError(f"no step {n} within {timeout} s")

    def ended_after(self, t0):
        """Seconds from t0 until mpirun has exited and no rank is left (at most BOUND + 30)."""
        try:
            self.p.wait(timeout=BOUND + 30)
        except subprocess.TimeoutExpired:
            pass
        while any(alive(pid) for pid in self.pids.values()) and time.monotonic() < t0 + BOUND + 30:
            time.sleep(0.05)
        return time.monotonic() - t0

    def kill(self):
        if self.p.poll() is None:
            for pid in self.pids.values():
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()


def alive(pid):
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def checkpoint_steps(out):
    return sorted(int(p.name[5:]) for p in out.iterdir() if p.name.startswith("step-"))


def verify_checkpoint(ck):
    """Every file state.json lists (the shards included) has its recorded size and XXH3-64 hash."""
    state, bad = unverified(ck)
    assert state["hash"] == "xxh3_64"
    names = list(state["files"]) + [s["file"] for s in state.get("shards", [])]
    assert any(name.startswith("shard-") for name in names)
    assert not bad, (ck, bad)


def sigkill_mid_step(job, out):
    job.wait_for_step(3)
    time.sleep(random.uniform(0, 0.03))
    os.kill(job.pids[1], signal.SIGKILL)
    return time.monotonic()


def sigkill_in_collective(job, out):
    """Rank 1 stopped, rank 0 waits for it in a collective; then rank 1 is killed."""
    job.wait_for_step(3)
    os.kill(job.pids[1], signal.SIGSTOP)
    time.sleep(2)
    assert job.p.poll() is None and alive(job.pids[0])
    os.kill(job.pids[1], signal.SIGKILL)
    return time.monotonic()


def sigkill_mid_save(job, out):
    """Rank 1 stopped once its shard of a save is on disk and the save is not complete, then killed: the
    save cannot complete without it (rank 0 renames the directory into place after gathering every
    rank's record).  The save of step 2 has completed first."""
    job.wait_for_step(3)
    shard = "shard-00001-of-00002.safetensors"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        tmp = [p for p in out.iterdir() if p.name.startswith(".tmp-step-") and (p / shard).exists()]
        if not tmp:
            time.sleep(0.0005)
            continue
        os.kill(job.pids[1], signal.SIGSTOP)
        time.sleep(0.5)
        step = int(tmp[0].name[len(".tmp-step-"):])
        if not (out / f"step-{step:06d}").exists():
            os.kill(job.pids[1], signal.SIGKILL)
            return time.monotonic()
        os.kill(job.pids[1], signal.SIGCONT)  # it finished that save: the next one
        while tmp[0].exists():
            time.sleep(0.0005)
    raise AssertionError("never caught rank 1 in a save")


def sigstop(job, out):
    job.wait_for_step(3)
    time.sleep(random.uniform(0, 0.03))
    os.kill(job.pids[1], signal.SIGSTOP)
    return time.monotonic()


@pytest.mark.parametrize("fault", [sigkill_mid_step, sigkill_in_collective, sigkill_mid_save, sigstop],
                         ids=lambda f: f.__name__)
def test_a_lost_rank_ends_the_job(launcher, tiny, tmp_path, fault):  # noqa: F811
    cfg, data = tiny
    out = tmp_path / "run"
    job = Job(launcher, cfg, data, out)
    try:
        t0 = fault(job, out)
        took = job.ended_after(t0)
    finally:
        job.kill()
    stderr = "".join(job.err)
    print(f"\n{launcher[1] or ['--backend', 'cpu']} {fault.__name__}: the job ended {took:.1f} s after the fault"
          f" (mpirun exit {job.p.returncode})")
    assert took < BOUND, stderr
    assert job.p.returncode != 0
    assert not any(alive(pid) for pid in job.pids.values())
    if fault is sigstop:
        # rank 0's watchdog: the collective it waited in and the step
        line = next((x for x in stderr.splitlines() if x.startswith("olmoc (rank 0): ")), "")
        assert " has waited " in line and " at step " in line and "train.collective_timeout" in line, stderr
        assert ("NCCL " if launcher[1] else "MPI ") in line, line
        assert took >= TIMEOUT, stderr
        # the stopped rank, continued by mpirun to be ended, does not count its own stop as a wait
        assert not [x for x in stderr.splitlines() if x.startswith("olmoc (rank 1): ") and "has waited" in x], stderr
    steps = checkpoint_steps(out)
    assert steps, stderr
    newest = out / f"step-{steps[-1]:06d}"
    verify_checkpoint(newest)
    r = subprocess.run(train_cmd(launcher, cfg, data, out, "--set", f"train.steps={steps[-1] + 2}", "--resume"),
                       capture_output=True, text=True, env=ENV, timeout=600)
    assert r.returncode == 0 and f"resumed from {newest}" in r.stdout, r.stdout + r.stderr
    assert checkpoint_steps(out)[-1] == steps[-1] + 2
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp-")]  # the interrupted save's is removed


def test_collective_timeout_is_validated(build_dir, tiny):  # noqa: F811
    cfg, data = tiny
    for bad in ("-1", "nan", "inf", "ten"):
        r = subprocess.run([str(build_dir / "olmoc"), "train", str(cfg), "--set", f"data.train_path={data}",
                            "--set", f"train.collective_timeout={bad}"], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "train.collective_timeout" in r.stderr, (bad, r.stderr)

