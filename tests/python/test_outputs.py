"""Outputs of `olmoc tokenize` and `olmoc train` (written as FILE.tmp, then renamed into place):
an existing output that is a character device or a FIFO is refused, never replaced by a regular file
(before, `-o NODE` and `--save NODE` turned the node into a regular file); a start removes the .tmp
files a killed run left beside its outputs, and never writes through one; and tokenize bounds a JSONL
line (--max-line-bytes: before, a 200 MB line cost 2.7 GB).  The device is a null device node made in
the test's temporary directory (mknod c 1 3, as root; skipped otherwise), never a system device."""
import json
import os
import signal
import stat
import subprocess
import time

import numpy as np
import pytest

from test_cli import builds, olmoc, tiny  # noqa: F401  (tiny is a fixture)
from test_tokenize_cli import run_measured, tok  # noqa: F401  (tok is a fixture)


def null_node(path):
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, OSError) as e:
        pytest.skip(f"cannot make a device node here ({e})")
    return path


def kind(path):
    return stat.S_IFMT(os.lstat(path).st_mode)


def special_outputs(tmp_path):
    """[(path, S_IFCHR / S_IFIFO, the word the refusal uses)]: a null device node and a FIFO."""
    null_node(tmp_path / "null")
    os.mkfifo(tmp_path / "fifo")
    return [(tmp_path / "null", stat.S_IFCHR, "character device"), (tmp_path / "fifo", stat.S_IFIFO, "FIFO")]


def leftover_tmp(directory):
    return sorted(p.name for p in directory.rglob("*.tmp"))


# ------------------------------------------------------------------------------------ tokenize

def test_tokenize_refuses_a_device_or_fifo_output(build_dir, tok, tmp_path):
    path, _ = tok
    (tmp_path / "a.jsonl").write_text('{"text": "hello world"}\n')
    for build in builds(build_dir):
        for node, k, word in special_outputs(tmp_path):
            r = olmoc(build, "tokenize", "--tokenizer", path, "-o", node, "--quiet", tmp_path / "a.jsonl")
            assert r.returncode == 1, r.stderr
            assert f"'{node}' exists and is a {word}, not a regular file: refusing to replace it" in r.stderr
            assert r.stderr.count("\n") == 1, r.stderr
            assert kind(node) == k, f"{node} was replaced by {stat.filemode(os.lstat(node).st_mode)}"
        assert leftover_tmp(tmp_path) == []
        for p in (tmp_path / "null", tmp_path / "fifo"):
            p.unlink()


def test_tokenize_killed_then_restarted(build_dir, tok, tmp_path):
    """SIGKILL mid-run leaves out.npy.tmp; the next run removes it at its start and writes the
    complete output.  A stale .tmp that is a symlink is removed, not written through (before, the
    next run wrote the token file into the symlink's target), and a FIFO there is refused rather
    than waited on."""
    path, t = tok
    rng = np.random.default_rng(3)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    with open(tmp_path / "big.jsonl", "w") as f:
        for i in range(60_000):
            f.write(json.dumps({"text": " ".join(rng.choice(words, 60))}) + "\n")
    out, tmp = tmp_path / "out.npy", tmp_path / "out.npy.tmp"
    cmd = [str(build_dir / "olmoc"), "tokenize", "--tokenizer", str(path), "-o", str(out), "--quiet", "--threads",
           "1", str(tmp_path / "big.jsonl")]
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not tmp.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait()
    if out.exists():
        pytest.skip("tokenize finished before it could be killed")
    assert tmp.exists(), "a killed tokenize leaves its .tmp (nothing can remove it)"
    for build in builds(build_dir):
        # the next start: the stale .tmp is removed, the output is complete
        r = olmoc(build, "tokenize", "--tokenizer", path, "-o", out, "--quiet", tmp_path / "big.jsonl")
        assert r.returncode == 0, r.stderr
        assert not tmp.exists() and len(np.load(out)) > 60_000 * 60
        # a symlink at .tmp: removed, its target untouched
        (tmp_path / "victim").write_text("precious")
        out.unlink()
        tmp.symlink_to(tmp_path / "victim")
        (tmp_path / "a.jsonl").write_text('{"text": "hello world"}\n')
        r = olmoc(build, "tokenize", "--tokenizer", path, "-o", out, "--quiet", tmp_path / "a.jsonl")
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "victim").read_bytes() == b"precious", "written through the stale symlink"
        assert kind(out) == stat.S_IFREG and not os.path.lexists(tmp)
        # a FIFO at .tmp: refused with a message, not opened (that would wait for a reader forever)
        os.mkfifo(tmp)
        r = subprocess.run([str(build / "olmoc"), "tokenize", "--tokenizer", str(path), "-o", str(out), "--quiet",
                            str(tmp_path / "a.jsonl")], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and f"'{tmp}' is a FIFO, not a temporary olmoc wrote" in r.stderr, r.stderr
        assert kind(tmp) == stat.S_IFIFO
        tmp.unlink()


def test_tokenize_bounds_a_jsonl_line(build_dir, tok, tmp_path):
    """A JSONL line is held whole while it is decoded and encoded (about ten times its size): one over
    --max-line-bytes (default 64 MiB) stops the run with an error naming the file and line, before
    it is read whole.  Before, a 69 MB line was tokenized in ~1 GB and a 200 MB one took 2.7 GB."""
    path, t = tok
    huge = tmp_path / "huge.jsonl"
    with open(huge, "w") as f:
        f.write('{"text": "first"}\n{"text": "')
        f.write("ab " * 23_000_000)
        f.write('"}\n')
    (tmp_path / "tiny.txt").write_text("a b")
    rc, base_mb, err = run_measured(build_dir, "--tokenizer", path, "-o", tmp_path / "tiny.npy", "--quiet",
                                    tmp_path / "tiny.txt")
    assert rc == 0, err
    rc, rss_mb, err = run_measured(build_dir, "--tokenizer", path, "-o", tmp_path / "h.npy", "--quiet", huge,
                                   timeout=300)
    assert rc == 1 and f"{huge}:2 (byte offset 18): a line longer than --max-line-bytes 67108864" in err, err
    assert rss_mb - base_mb < 250, f"peak RSS {rss_mb} MB, {rss_mb - base_mb} MB over the baseline"
    assert leftover_tmp(tmp_path) == []
    # --max-line-bytes: the reader's bound (a 5 MB line) and the exact one (a 3 MB line, read whole)
    for n in (5_000_000, 3_000_000):
        (tmp_path / "long.jsonl").write_text('{"text": "x"}\n\n' + json.dumps({"text": "a" * n}) + "\n")
        for build in builds(build_dir):
            r = olmoc(build, "tokenize", "--tokenizer", path, "-o", tmp_path / "l.npy", "--quiet",
                      "--max-line-bytes", "2MiB", tmp_path / "long.jsonl")
            assert r.returncode == 1 and f"long.jsonl:3 (byte offset 15): a line" in r.stderr, r.stderr
            assert "longer than --max-line-bytes 2097152" in r.stderr, r.stderr
            assert not (tmp_path / "l.npy").exists() and leftover_tmp(tmp_path) == []
    for build in builds(build_dir):
        r = olmoc(build, "tokenize", "--tokenizer", path, "-o", tmp_path / "l.npy", "--quiet",
                  "--max-line-bytes", "4MiB", tmp_path / "long.jsonl")
        assert r.returncode == 0, r.stderr
        r = olmoc(build, "tokenize", "--tokenizer", path, "-o", tmp_path / "l.npy", "--max-line-bytes", "0",
                  tmp_path / "long.jsonl")
        assert r.returncode == 2 and "--max-line-bytes" in r.stderr, r.stderr


# --------------------------------------------------------------------------------------- train

def test_train_refuses_a_device_or_fifo_for_the_weights(build_dir, tiny, tmp_path):
    """--save NODE and data.out_dir/model.safetensors as a node: refused at the start, before any
    step, and the node left as it was (not replaced by a regular file after training).
    metrics.jsonl as a device is written in place (appended to)."""
    cfg, data = tiny
    nodes = special_outputs(tmp_path)
    for build in builds(build_dir):
        base = ["train", cfg, "--set", f"data.train_path={data}", "--set", "train.steps=2"]
        for node, k, word in nodes:
            out = tmp_path / f"run-{build.name}-{node.name}"
            r = olmoc(build, *base, "--set", f"data.out_dir={out}", "--save", node)
            assert r.returncode == 1, r.stderr
            assert f"the output weights file '{node}' exists and is a {word}" in r.stderr, r.stderr
            assert "step" not in r.stdout, "refused only after training"
            assert kind(node) == k
        out = tmp_path / f"run-{build.name}-in-out-dir"
        out.mkdir()
        null_node(out / "model.safetensors")
        r = olmoc(build, *base, "--set", f"data.out_dir={out}")
        assert r.returncode == 1 and "model.safetensors' exists and is a character device" in r.stderr, r.stderr
        assert kind(out / "model.safetensors") == stat.S_IFCHR
        out = tmp_path / f"run-{build.name}-metrics"
        out.mkdir()
        null_node(out / "metrics.jsonl")
        r = olmoc(build, *base, "--set", f"data.out_dir={out}")
        assert r.returncode == 0, r.stderr
        assert kind(out / "metrics.jsonl") == stat.S_IFCHR and kind(out / "model.safetensors") == stat.S_IFREG
        assert leftover_tmp(tmp_path) == []


def test_train_start_removes_stale_tmp(build_dir, tiny, tmp_path):
    """The .tmp files a run killed while writing its weights or cutting its metrics log leaves
    (model.safetensors.tmp, --save's FILE.tmp, metrics.jsonl.tmp) are removed when the next run in
    that out_dir starts, not only if it reaches its end: the second run here is SIGKILLed as soon as
    it started (before, they stayed until a run finished, and forever beside a run that never
    does)."""
    cfg, data = tiny
    for build in builds(build_dir):
        out = tmp_path / f"run-{build.name}"
        out.mkdir()
        stale = [out / "model.safetensors.tmp", out / "metrics.jsonl.tmp", tmp_path / f"w-{build.name}.st.tmp"]
        for s in stale:
            s.write_bytes(b"\0" * 4096)
        for save in ([], ["--save", tmp_path / f"w-{build.name}.st"]):
            for s in stale:
                s.write_bytes(b"\0" * 4096)
            p = subprocess.Popen([str(build / "olmoc"), "train", str(cfg), "--set", f"data.train_path={data}",
                                  "--set", f"data.out_dir={out}", "--set", "train.steps=100000", *map(str, save)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            deadline = time.monotonic() + 60
            watched = stale[:2] + stale[2:] * bool(save)
            while any(s.exists() for s in watched) and p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            p.send_signal(signal.SIGKILL)
            err = p.communicate()[1].decode()
            assert p.returncode == -signal.SIGKILL, err
            assert not any(s.exists() for s in watched), [s.name for s in watched if s.exists()]
            (out / "metrics.jsonl").unlink(missing_ok=True)


def test_train_start_removes_incomplete_checkpoints(build_dir, tiny, tmp_path):
    """A save killed before its rename leaves .tmp-step-N/ (never a complete checkpoint): the next start
    removes it, not only the next save, so a run that saves no checkpoint does not keep it.  A
    .old-step-N/ (a same-step checkpoint moved aside) goes once step-N/ is in place; a lone one, the only
    copy of its step, is kept with a note."""
    cfg, data = tiny
    for build in builds(build_dir):
        out = tmp_path / f"run-{build.name}"
        stale, replaced, lone = out / ".tmp-step-000003", out / ".old-step-000002", out / ".old-step-000007"
        for d in (stale, replaced, lone, out / "step-000002"):
            d.mkdir(parents=True)
            (d / "model.safetensors").write_bytes(b"\0" * 64)
        r = olmoc(build, "train", cfg, "--set", f"data.train_path={data}", "--set", f"data.out_dir={out}",
                  "--set", "train.steps=1", "--set", "train.save_every=1000", "--save", tmp_path / "w.st")
        # the start refuses to overwrite step-000002 without --resume, after the clean-up
        assert r.returncode == 1 and "already holds checkpoint" in r.stderr, r.stderr
        assert not stale.exists() and not replaced.exists(), sorted(p.name for p in out.iterdir())
        assert lone.exists() and f"'{lone}' is the complete checkpoint of step 7" in r.stderr, r.stderr


def test_train_refuses_a_fifo_for_its_config_or_metrics(build_dir, tiny, tmp_path):
    """A FIFO as out_dir/config.yaml or out_dir/metrics.jsonl would block the run (opening it for writing
    waits for a reader): refused at the start, naming it."""
    cfg, data = tiny
    for build in builds(build_dir):
        for name, words in (("config.yaml", "config"), ("metrics.jsonl", "metrics log")):
            out = tmp_path / f"{build.name}-{name}"
            out.mkdir()
            os.mkfifo(out / name)
            try:
                r = subprocess.run([str(build / "olmoc"), "train", str(cfg), "--set", f"data.train_path={data}",
                                    "--set", f"data.out_dir={out}", "--set", "train.steps=1"],
                                   capture_output=True, text=True, timeout=120)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"a FIFO as {name} blocked the run")
            assert r.returncode == 1, r.stderr
            assert words in r.stderr and "FIFO" in r.stderr and str(out / name) in r.stderr, r.stderr
            assert kind(out / name) == stat.S_IFIFO
