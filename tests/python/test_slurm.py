"""A real Slurm on this machine: munged, slurmctld and slurmd started by the
test with a generated slurm.conf (one node, this host, a partition of its
cores), jobs submitted with sbatch through scripts/slurm/launch.sh, as on a
cluster. A 2-rank fully sharded CPU run gets Slurm's time-limit warning
(--time=1 --signal=B:USR1@10: slurmctld sends it at its first periodic
time-limit check 20-50 s into the job), stops with a checkpoint, requeues
itself and continues; the finished run's losses and weights equal an
uninterrupted run's bit for bit. A job cancelled with scancel (SIGTERM) or
one whose ranks are killed (SIGKILL, as at the end of KillWait) leaves only complete
checkpoints, and resuming the newest matches the uninterrupted run.

When Slurm cannot start, the tests fail naming the daemon and its log: CI
installs slurm-wlm and munge (scripts/setup.sh)."""
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import numpy as np
import pytest

from test_reliability import deterministic, records, unverified

pytestmark = pytest.mark.slow  # a calibration, a 2-3 attempt job, a reference run and two cancelled jobs: ~5 minutes

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "scripts" / "slurm" / "launch.sh"
DAEMONS = ["munged", "slurmctld", "slurmd"]
CLIENTS = ["sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo"]

CONFIG = """model:
  vocab_size: 8192
  d_model: 64
  n_layers: 2
  n_heads: 4
  n_kv_heads: 2
  mlp_hidden: 256
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
  schedule: constant
  log_every: 1
  save_every: 25
  keep_last: 0
  sharding: fsdp
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path, n=25):
    try:
        return "\n".join(pathlib.Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError as e:
        return f"(no log: {e})"


class Slurm:
    """munged, slurmctld and slurmd in one short temporary directory (unix
    socket paths have a length limit), and the client environment."""

    def __init__(self):
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="olmoc-slurm-"))
        self.dir.chmod(0o755)  # munged wants its socket reachable
        self.procs = {}
        self.user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
        self.env["SLURM_CONF"] = str(self.dir / "slurm.conf")

    def log(self, name):
        return self.dir / "log" / f"{name}.log"

    def start(self):
        d = self.dir
        for sub in ["munge", "state", "spool", "log"]:
            (d / sub).mkdir(mode=0o755 if sub == "munge" else 0o700)  # munged: its socket's directory readable
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        sock = d / "munge" / "munge.sock"
        self.spawn("munged", ["munged", "-F", "--force", f"--socket={sock}", f"--key-file={key}",
                              f"--pid-file={d / 'munge' / 'munged.pid'}", f"--seed-file={d / 'munge' / 'seed'}",
                              f"--log-file={self.log('munged')}"])
        self.wait_for(lambda: sock.exists(), "munged", "its socket never appeared", 30)

        host = socket.gethostname().split(".")[0]
        node = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=60)
        m = re.search(r"(CPUs=.*RealMemory=\d+)", node.stdout)
        if node.returncode or not m:
            pytest.fail(f"Slurm could not start: 'slurmd -C' did not describe this node:\n{node.stdout}{node.stderr}")
        (d / "plugstack.conf").write_text("")
        (d / "slurm.conf").write_text(f"""ClusterName=olmoctest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser={self.user}
SlurmdUser={self.user}
AuthType=auth/munge
CredType=cred/munge
# cred_expire also holds a requeued job back that long (default 120 s)
AuthInfo=socket={sock},cred_expire=10
StateSaveLocation={d / 'state'}
SlurmdSpoolDir={d / 'spool'}
SlurmctldPidFile={d / 'slurmctld.pid'}
SlurmdPidFile={d / 'slurmd.pid'}
SlurmctldLogFile={self.log('slurmctld')}
SlurmdLogFile={self.log('slurmd')}
PlugStackConfig={d / 'plugstack.conf'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
# a loaded machine: time to finish the step and checkpoint after the limit
OverTimeLimit=2
KillWait=60
MinJobAge=3600
NodeName={host} NodeAddr=127.0.0.1 {m.group(1)} State=UNKNOWN
PartitionName=cpu Nodes={host} Default=YES MaxTime=INFINITE State=UP
""")
        conf = str(d / "slurm.conf")
        self.spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", conf])
        self.spawn("slurmd", ["slurmd", "-D", "-N", host, "-f", conf])
        self.wait_for(lambda: self.run(["sinfo", "-h", "-o", "%T"], check=False).stdout.strip() == "idle",
                      "slurmctld/slurmd", "the node never became idle", 90)

    def spawn(self, name, cmd):
        out = open(self.dir / "log" / f"{name}.out", "w")
        self.procs[name] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True)

    def wait_for(self, ready, what, why, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    pytest.fail(self.failure(f"{name} exited with {p.returncode}"))
            if ready():
                return
            time.sleep(1)
        pytest.fail(self.failure(f"{what}: {why} within {timeout} s"))

    def failure(self, why):
        named = sorted(DAEMONS, key=lambda n: n not in why)  # the daemon named first
        files = [f for n in named for f in (self.log(n), self.dir / "log" / f"{n}.out") if f.exists()]
        logs = [f"--- {f.name} (tail) ---\n{tail(f)}" for f in files]
        return f"Slurm could not start: {why}\n" + "\n".join(logs)

    def run(self, cmd, check=True, timeout=120):
        r = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=timeout)
        if check and r.returncode:
            pytest.fail(f"{' '.join(map(str, cmd))} failed ({r.returncode}): {r.stdout}{r.stderr}")
        return r

    def job(self, job_id):
        """scontrol's fields of a job."""
        out = self.run(["scontrol", "-o", "show", "job", str(job_id)]).stdout
        return dict(f.split("=", 1) for f in out.split() if "=" in f)

    def wait_job(self, job_id, done, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if done(info):
                return info
            time.sleep(2)
        pytest.fail(f"job {job_id} still {self.job(job_id).get('JobState')} after {timeout} s\n"
                    f"slurmctld: {tail(self.log('slurmctld'), 15)}")

    def stop(self):
        if (self.dir / "slurm.conf").exists() and "slurmctld" in self.procs:
            self.run(["scancel", "--signal=KILL", "--user", self.user], check=False)
            self.run(["scancel", "--user", self.user], check=False)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and self.run(["squeue", "-h"], check=False).stdout.strip():
                time.sleep(1)
        for name in reversed(list(self.procs)):
            p = self.procs[name]
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm():
    missing = [b for b in DAEMONS + CLIENTS if not shutil.which(b)]
    if missing:
        pytest.fail(f"Slurm is not installed: {', '.join(missing)} not found (scripts/setup.sh installs slurm-wlm "
                    "and munge)")
    s = Slurm()
    try:
        s.start()
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def work(build_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("slurm")
    (d / "cfg.yaml").write_text(CONFIG)
    np.save(d / "train.npy", np.random.default_rng(0).integers(2, 8192, 400000).astype(np.uint16))
    return d


def olmoc_args(build_dir, work, out, steps, *extra):
    return [str(build_dir.resolve() / "olmoc"), "train", str(work / "cfg.yaml"),
            "--set", f"data.train_path={work / 'train.npy'}", "--set", f"data.out_dir={out}",
            "--set", f"train.steps={steps}", *extra]


def srun(slurm, build_dir, work, out, steps, *extra, timeout=900):
    """An uninterrupted 2-rank run under srun (PMIx)."""
    env = dict(slurm.env, OMP_NUM_THREADS="1")
    r = subprocess.run(["srun", "-n", "2", "--mpi=pmix", "--time=30", *olmoc_args(build_dir, work, out, steps, *extra)],
                       capture_output=True, text=True, env=env, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def sbatch(slurm, build_dir, work, name, steps, options, *extra):
    """A batch job running launch.sh as the 7B scripts do; its out_dir and log file."""
    out = work / name
    out.mkdir()
    script = work / f"{name}.sbatch"
    args = " ".join(f"'{a}'" for a in olmoc_args(build_dir, work, out, steps, *extra)[2:])
    script.write_text(f"""#!/bin/bash
#SBATCH --ntasks=2 --open-mode=append --output={out}/slurm-%j.out {options}
export OMP_NUM_THREADS=1 OUT_DIR={out} OLMOC={build_dir.resolve() / 'olmoc'}
exec {LAUNCH} {args}
""")
    job = slurm.run(["sbatch", "--parsable", str(script)]).stdout.strip().split(";")[0]
    return job, out, out / f"slurm-{job}.out"


def ranks(build_dir, out):
    """The pids of the olmoc processes writing to out."""
    exe = os.path.realpath(build_dir / "olmoc")
    found = []
    for pid in subprocess.run(["pgrep", "-f", f"data.out_dir={out}"], capture_output=True, text=True).stdout.split():
        try:
            if os.path.realpath(f"/proc/{pid}/exe") == exe:
                found.append(int(pid))
        except OSError:
            pass
    return found


def ended(info):
    return info["JobState"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def complete(ckpt):
    """Every file state.json lists is there with its size and XXH3-64 hash."""
    return not unverified(ckpt)[1]


@pytest.fixture(scope="module")
def reference(slurm, build_dir, work):
    """Steps for the time-limit job and an uninterrupted run of them: about
    120 s of training at the calibration's fastest step, so that the warning,
    20-50 s in, comes before the end even when the calibration ran slowed by
    other tests on the machine and the job runs alone."""
    cal = work / "calibrate"
    srun(slurm, build_dir, work, cal, 12)
    # the first step's time includes the start
    elapsed = [r["elapsed"] for r in records(cal) if r.get("type") == "train"][1:]
    per_step = min(b - a for a, b in zip(elapsed, elapsed[1:]))
    steps = max(100, min(20000, int(120 / per_step)))
    t0 = time.monotonic()
    ref = work / "reference"
    srun(slurm, build_dir, work, ref, steps, timeout=1800)
    print(f"\nslurm: {per_step:.3f} s a step (2 ranks): {steps} steps; uninterrupted run {time.monotonic() - t0:.0f} s")
    return steps, ref


def test_time_limit_signal_requeues_and_resumes_bit_identically(slurm, build_dir, work, reference):
    steps, ref = reference
    t0 = time.monotonic()
    job, out, log = sbatch(slurm, build_dir, work, "timelimit", steps, "--time=1 --signal=B:USR1@10 --requeue")
    info = slurm.wait_job(job, ended, timeout=1800)
    wall = time.monotonic() - t0
    text = log.read_text()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, text[-4000:])
    stops = [int(n) for n in re.findall(r"olmoc train \(rank 0\): stopped by SIGUSR1 after step (\d+)", text)]
    resumes = [int(n) for n in re.findall(r"resumed from \S+/step-(\d+) at step", text)]
    attempts = re.findall(r"olmoc job \d+ attempt (\d+)", text)
    assert stops, "the time-limit warning never stopped the run:\n" + text[-4000:]
    assert "second signal" not in text and "TIMEOUT" not in text, text[-4000:]
    assert resumes == stops, (stops, resumes)  # each attempt continues where the last stopped
    assert len(attempts) == len(stops) + 1 and int(info["Restarts"]) == len(stops), (attempts, info["Restarts"])
    assert text.count("got SIGUSR1") == len(stops) and text.count("requeued;") == len(stops)
    assert text.count("olmoc exited with 0 ") == 1 and re.search(r"olmoc exited with 0 at [^\n]*\n$", text)
    got, want = deterministic(records(out)), deterministic(records(ref))
    assert len(got) == steps and got == want
    assert (out / "model.safetensors").read_bytes() == (ref / "model.safetensors").read_bytes()
    final = f"step-{steps:06d}"
    for shard in sorted((ref / final).glob("shard-*.safetensors")):
        assert (out / final / shard.name).read_bytes() == shard.read_bytes(), shard.name
    print(f"\nslurm time limit: {len(attempts)} attempts, stopped after steps {stops}, resumed at {resumes}, "
          f"final loss {got[-1]['loss']!r} == {want[-1]['loss']!r} (uninterrupted), weights identical; "
          f"job wall time {wall:.0f} s")


@pytest.mark.parametrize("how", ["TERM", "KILL"])
def test_cancelled_or_killed_job_leaves_only_complete_checkpoints(slurm, build_dir, work, reference, how):
    """scancel (SIGTERM to every task, as when a job is cancelled or
    preempted): the ranks stop after the same step with a checkpoint and exit
    143. SIGKILL to every rank in the middle of the run, saving every step:
    whatever the kill cut short, every step-* directory left is complete, and
    resuming the newest matches the uninterrupted run."""
    steps, ref = reference
    save = "25" if how == "TERM" else "1"
    job, out, log = sbatch(slurm, build_dir, work, f"scancel-{how}", 100000, "--time=30 --requeue",
                           "--set", f"train.save_every={save}")
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if (out / "metrics.jsonl").exists() and len((out / "metrics.jsonl").read_text().splitlines()) >= 12:
            break
        assert not ended(slurm.job(job)), log.read_text()[-3000:]
        time.sleep(0.5)
    else:
        pytest.fail("the job trained no 12 steps in 600 s:\n" + log.read_text()[-3000:])
    time.sleep(np.random.default_rng().uniform(0, 2))
    if how == "TERM":
        slurm.run(["scancel", job])
    else:  # SIGKILL to every rank at once, as at the end of KillWait (scancel --signal=KILL is a plain scancel)
        pids = ranks(build_dir, out)
        assert len(pids) == 2, pids
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
    info = slurm.wait_job(job, lambda i: ended(i) and not slurm.run(["squeue", "-h", "-j", job], check=False)
                          .stdout.strip(), timeout=300)
    # the processes of a cancelled job may outlive its record for a moment
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and ranks(build_dir, out):
        time.sleep(1)
    text = log.read_text()
    assert info["JobState"] == ("CANCELLED" if how == "TERM" else "FAILED"), info
    assert "requeued;" not in text, text[-3000:]
    kept = sorted(p for p in out.iterdir() if re.fullmatch(r"step-\d+", p.name))
    assert kept, text[-3000:]
    assert all(complete(p) for p in kept), [p.name for p in kept if not complete(p)]
    newest = int(kept[-1].name[5:])
    if how == "KILL":
        assert "olmoc exited with 137" in text and "stopped by" not in text, text[-3000:]
    if how == "TERM":
        stopped = re.findall(r"olmoc train \(rank \d\): stopped by SIGTERM after step (\d+)", text)
        assert len(stopped) == 2 and len(set(stopped)) == 1 and int(stopped[0]) == newest, text[-3000:]
        assert "olmoc exited with 143" in text, text[-3000:]
    tmp = [p.name for p in out.iterdir() if p.name.startswith(".tmp-step-")]
    # resume: olmoc picks the newest complete checkpoint, never a temporary
    r = srun(slurm, build_dir, work, out, newest + 2, "--resume", timeout=600)
    assert f"resumed from {out}/step-{newest:06d} at step {newest}" in r.stdout, r.stdout[-2000:]
    assert deterministic(records(out)) == deterministic(records(ref))[:newest + 2]
    print(f"\n{'scancel' if how == 'TERM' else 'SIGKILL to the ranks'}: {len(kept)} complete checkpoints, newest "
          f"step {newest}, temporaries left {tmp}, resumed to step {newest + 2} bit-identically")
