"""olmoc train's run directory under careless use: two trainers on one
data.out_dir, a disk that fills up under metrics.jsonl, NaN losses in the log
and through a resume, a damaged log, and a rank that fails under mpirun."""
import json
import os
import shutil
import signal
import subprocess

import pytest

from test_cli import builds, olmoc, tiny  # noqa: F401  (tiny is a fixture)

FAST = ["--set", "train.peak_flops=1e12"]  # skip the startup SGEMM measurement


def train_args(cfg, data, out, *extra):
    return ["train", cfg, "--set", f"data.train_path={data}", "--set", f"data.out_dir={out}", *FAST, *extra]


def strict_json(line):
    def no_constant(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(line, parse_constant=no_constant)


def test_second_trainer_on_the_same_out_dir_is_refused(build_dir, tiny, tmp_path):  # noqa: F811
    cfg, data = tiny
    out = tmp_path / "run"
    first = subprocess.Popen([str(build_dir / "olmoc"), *map(str, train_args(cfg, data, out, "--set",
                                                                              "train.steps=1000000"))],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in first.stdout:
            if line.startswith("step 1/"):
                break
        assert first.poll() is None, first.stderr.read()
        for build in builds(build_dir):
            r = olmoc(build, *train_args(cfg, data, out, "--set", "train.steps=2"))
            assert r.returncode == 1, (build, r.stdout, r.stderr)
            assert f"is in use by another training run (pid {first.pid}," in r.stderr, r.stderr
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate()
    # the lock dies with its holder: the directory is usable again
    r = olmoc(build_dir, *train_args(cfg, data, out, "--set", "train.steps=2", "--resume"))
    assert r.returncode == 0, r.stderr
    assert [strict_json(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_full_disk_under_the_metrics_log_fails_the_run(build_dir, tiny, tmp_path):  # noqa: F811
    cfg, data = tiny
    for build in builds(build_dir):
        out = tmp_path / build.name
        out.mkdir()
        (out / "metrics.jsonl").symlink_to("/dev/full")  # every write: ENOSPC
        r = olmoc(build, *train_args(cfg, data, out, "--set", "train.steps=3"))
        assert r.returncode == 1, (build, r.stdout, r.stderr)
        assert "metrics.jsonl' failed: No space left on device" in r.stderr, r.stderr
        assert not (out / "model.safetensors").exists()


@pytest.fixture
def small_disk(tmp_path):
    """A 16 KiB tmpfs (needs root; skipped where mounting is not allowed)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(disk)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


def test_metrics_log_filling_a_small_disk_fails_the_run(build_dir, tiny, tmp_path, small_disk):  # noqa: F811
    """The log grows until the disk is full (the final weights go elsewhere):
    the run stops with the error instead of finishing with a truncated log."""
    cfg, data = tiny
    r = olmoc(build_dir, *train_args(cfg, data, small_disk / "run", "--set", "train.steps=2000", "--set",
                                     "train.log_every=1000", "--save", tmp_path / "final.safetensors"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "metrics.jsonl' failed: No space left on device" in r.stderr, r.stderr
    assert not (tmp_path / "final.safetensors").exists()


def test_nan_losses_are_json_and_survive_resume(build_dir, tiny, tmp_path):  # noqa: F811
    cfg, data = tiny
    out = tmp_path / "run"
    # train.nonfinite: skip keeps going through the NaN steps (stop, the default, ends the run: test_reliability)
    diverge = ["--set", "train.lr=1e30", "--set", "train.save_every=2", "--set", "train.keep_last=0", "--set",
               "train.nonfinite=skip"]
    r = olmoc(build_dir, *train_args(cfg, data, out, "--set", "train.steps=4", *diverge))
    assert r.returncode == 0, r.stderr
    lines = (out / "metrics.jsonl").read_text().splitlines()
    recs = [strict_json(x) for x in lines]
    assert [x["step"] for x in recs] == [1, 2, 3, 4]
    assert recs[-1]["loss"] is None and recs[-1]["grad_norm"] is None and recs[-1]["lr"] > 0
    shutil.rmtree(out / "step-000004")
    r = olmoc(build_dir, *train_args(cfg, data, out, "--set", "train.steps=5", *diverge, "--resume"))
    assert r.returncode == 0, r.stderr
    assert "removed 2 records after step 2" in r.stdout, r.stdout
    after = (out / "metrics.jsonl").read_text().splitlines()
    assert after[:2] == lines[:2]  # the NaN records before the checkpoint are kept as they were
    assert [strict_json(x)["step"] for x in after] == [1, 2, 3, 4, 5]


def test_nul_byte_in_the_metrics_log_is_refused_on_resume(build_dir, tiny, tmp_path):  # noqa: F811
    cfg, data = tiny
    out = tmp_path / "run"
    base = ["--set", "train.save_every=2", "--set", "train.keep_last=0"]
    r = olmoc(build_dir, *train_args(cfg, data, out, "--set", "train.steps=4", *base))
    assert r.returncode == 0, r.stderr
    log = out / "metrics.jsonl"
    text = log.read_bytes()
    offset = text.index(b"\n") + 5  # in the second record
    log.write_bytes(text[:offset] + b"\0" * 8 + text[offset + 8:])
    for build in builds(build_dir):
        r = olmoc(build, *train_args(cfg, data, out, "--set", "train.steps=6", *base, "--resume"))
        assert r.returncode == 1, (build, r.stdout, r.stderr)
        assert f"'{log}' has a NUL byte at offset {offset}" in r.stderr, r.stderr
        assert log.read_bytes()[offset:offset + 8] == b"\0" * 8


MPIRUN = shutil.which("mpirun")


@pytest.mark.skipif(MPIRUN is None, reason="OpenMPI (mpirun) is not installed")
def test_a_failing_rank_ends_the_mpi_job(build_dir, tiny, tmp_path):  # noqa: F811
    """Rank 0 alone opens metrics.jsonl (here a directory); the launcher is told
    not to end the job when a process exits with an error (as some do), so
    without MPI_Abort rank 1 would wait in its first all-reduce forever."""
    cfg, data = tiny
    out = tmp_path / "run"
    (out / "metrics.jsonl").mkdir(parents=True)
    cmd = [MPIRUN, "--oversubscribe", "--allow-run-as-root", "--mca", "orte_abort_on_non_zero_status", "0",
           "-np", "2", str(build_dir / "olmoc"), *map(str, train_args(cfg, data, out, "--set", "train.steps=4"))]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        stdout, stderr = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail("the job hung after rank 0 failed")
    assert p.returncode != 0, stdout + stderr
    assert "olmoc train (rank 0): the metrics log" in stderr and "is a directory" in stderr, stderr


def test_names_in_the_metrics_log_are_escaped(build_dir, tiny, tmp_path):  # noqa: F811
    cfg, data = tiny
    val = tmp_path / 'held "out"\\set.npy'
    shutil.copy(data, val)
    out = tmp_path / "run"
    r = olmoc(build_dir, *train_args(cfg, data, out, "--set", "train.steps=2", "--set", "train.eval_every=2",
                                     "--set", f"data.val_paths={val}", "--set", "train.eval_batches=1"))
    assert r.returncode == 0, r.stderr
    recs = [strict_json(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["set"] for x in recs if x["type"] == "eval"] == ['held "out"\\set']
