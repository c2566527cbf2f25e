"""olmoc train's run directory: metrics.jsonl, checkpoints (atomic, keep-last-N,
verified on load), and resume after SIGKILL giving bit-identical losses."""
import json
import random
import shutil
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
import xxhash

from test_cli import ROOT, builds, olmoc, tiny  # noqa: F401  (tiny is a fixture)

FAST = ["--set", "train.peak_flops=1e12"]  # skip the startup SGEMM measurement


def train_args(cfg, data, out, *extra):
    return ["train", cfg, "--set", f"data.train_path={data}", "--set", f"data.out_dir={out}", *FAST, *extra]


def metrics(out):
    with open(out / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def deterministic(records):
    """Every field that must be bit-identical between runs (not timings)."""
    skip = {"tokens_per_s", "mfu", "elapsed", "tokens_per_s_per_device", "mem_peak_bytes"}
    return [{k: v for k, v in r.items() if k not in skip} for r in records]


RESUME = ["--set", "train.steps=60", "--set", "train.save_every=7", "--set", "train.keep_last=2",
          "--set", "train.eval_every=10", "--set", "train.log_every=5"]


def test_metrics_log(build_dir, tiny, tmp_path):
    cfg, data = tiny
    r = olmoc(build_dir, *train_args(cfg, data, tmp_path / "run", "--set", "train.steps=12", "--set",
                                     "train.eval_every=5", "--set", f"data.val_paths={data},{data}",
                                     "--set", "train.eval_batches=2"))
    assert r.returncode == 0, r.stderr
    recs = metrics(tmp_path / "run")
    train = [x for x in recs if x["type"] == "train"]
    evals = [x for x in recs if x["type"] == "eval"]
    assert [x["step"] for x in train] == list(range(1, 13))
    for x in train:
        assert set(x) == {"type", "step", "loss", "z_loss", "grad_norm", "lr", "tokens", "tokens_per_s", "mfu",
                          "elapsed", "tokens_per_s_per_device", "mem_peak_bytes"}
        assert x["tokens"] == x["step"] * 4 * 32 and 0 < x["mfu"] and x["tokens_per_s"] > 0
    # the printed line and the log agree
    printed = [line for line in r.stdout.splitlines() if line.startswith("step ")]
    assert len(printed) == 12 and "MFU" in printed[0] and "ETA" in printed[0] and "tok/s" in printed[0]
    assert float(printed[0].split("loss ")[1].split()[0]) == pytest.approx(train[0]["loss"], abs=1e-4)
    # two validation sets (same file twice), at steps 5, 10 and the last step
    assert [(x["step"], x["set"]) for x in evals] == [(s, "train") for s in (5, 5, 10, 10, 12, 12)]
    assert evals[0]["tokens"] == 2 * 2 * 31 and evals[0]["ppl"] == pytest.approx(np.exp(evals[0]["loss"]))
    assert "peak 1e+12 FLOP/s (train.peak_flops)" in r.stdout


@pytest.mark.parametrize("save", ["sync", "async"])
def test_kill_and_resume_is_bit_identical(build_dir, tiny, tmp_path, save):
    """An uninterrupted run vs runs killed with SIGKILL (right after a
    checkpoint, and at random moments) then resumed: every logged loss, grad
    norm, LR and validation loss, and the final weights and optimizer state,
    are bit-identical.  With train.async_save the killed runs save from a
    writer thread (a kill may land while a save is in flight) and are held
    to the synchronous reference."""
    cfg, data = tiny
    val = ["--set", f"data.val_paths={data}", "--set", "train.eval_batches=2"]
    mode = ["--set", f"train.async_save={str(save == 'async').lower()}"]
    ref = tmp_path / "ref"
    t0 = time.monotonic()
    r = olmoc(build_dir, *train_args(cfg, data, ref, *RESUME, *val))
    duration = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    expected = deterministic(metrics(ref))
    assert len([x for x in expected if x["type"] == "train"]) == 60

    rng = random.Random(1234)
    # (label, kill condition): a checkpoint line, or a random time within the run
    trials = [("after checkpoint 14", "checkpoint step 14"),
              *[(f"random {i}", rng.uniform(0.05, 0.95) * duration) for i in range(3)]]
    killed_mid_run = 0
    for label, when in trials:
        out = tmp_path / label.replace(" ", "_")
        cmd = [str(build_dir / "olmoc"), *map(str, train_args(cfg, data, out, *RESUME, *val, *mode))]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if isinstance(when, str):
            for line in p.stdout:
                if line.startswith(when):
                    break
        else:
            time.sleep(when)
        if p.poll() is None:
            killed_mid_run += 1
        p.send_signal(signal.SIGKILL)
        p.communicate()
        resumed = olmoc(build_dir, *train_args(cfg, data, out, *RESUME, *val, *mode, "--resume"))
        assert resumed.returncode == 0, (label, resumed.stderr)
        got = deterministic(metrics(out))
        assert got == expected, f"{label}: resumed run differs from the uninterrupted one"
        assert (out / "model.safetensors").read_bytes() == (ref / "model.safetensors").read_bytes(), label
        for name in ("model.safetensors", "optim.safetensors"):
            assert (out / "step-000060" / name).read_bytes() == (ref / "step-000060" / name).read_bytes(), label
        # keep_last = 2, no temporaries left behind
        assert sorted(p.name for p in out.iterdir() if "step" in p.name) == ["step-000056", "step-000060"], label
    assert killed_mid_run >= 1, "no trial killed the run before it finished"
    print(f"\nresume ({save}): {len(trials)} SIGKILL trials ({killed_mid_run} mid-run), all bit-identical over 60 "
          "steps")


def test_resume_rules_and_errors(build_dir, tiny, tmp_path):
    cfg, data = tiny
    out = tmp_path / "run"
    base = ["--set", "train.steps=10", "--set", "train.save_every=5", "--set", "train.keep_last=0"]
    assert olmoc(build_dir, *train_args(cfg, data, out, *base)).returncode == 0
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("step-")) == ["step-000005", "step-000010"]
    state = json.loads((out / "step-000010" / "state.json").read_text())
    assert state["step"] == 10 and state["tokens"] == 10 * 128 and set(state["files"]) == {
        "model.safetensors", "optim.safetensors", "config.yaml"}

    # an existing run is not overwritten by accident
    r = olmoc(build_dir, *train_args(cfg, data, out, *base))
    assert r.returncode == 1 and "already holds checkpoint" in r.stderr and "--resume" in r.stderr

    # resuming a finished run extends it when train.steps grows
    r = olmoc(build_dir, *train_args(cfg, data, out, "--set", "train.steps=12", "--set", "train.save_every=5",
                                     "--resume"))
    assert r.returncode == 0 and "resumed from" in r.stdout and "step 11/12" in r.stdout, r.stdout + r.stderr

    ck = out / "step-000005"
    # resuming an older checkpoint into the same directory would mix two runs
    r = olmoc(build_dir, *train_args(cfg, data, out, *base, "--resume-from", ck))
    assert r.returncode == 1 and "newer than the checkpoint to resume from (step 5)" in r.stderr, r.stderr
    for build in builds(build_dir):
        def resume_from(path, *extra):
            return olmoc(build, *train_args(cfg, data, tmp_path / "other", *base, *extra, "--resume-from", path))

        r = resume_from(ck, "--set", "model.d_model=64")
        assert r.returncode == 1 and "does not match the config: model.d_model is 32 in the checkpoint but 64" \
            in r.stderr, r.stderr
        r = resume_from(ck, "--set", "train.seed=5")
        assert r.returncode == 1 and "train.seed is 0 in the checkpoint but 5" in r.stderr, r.stderr
        r = resume_from(tmp_path / "nope")
        assert r.returncode == 1 and "is not a directory" in r.stderr, r.stderr

    other_data = tmp_path / "other.npy"
    np.save(other_data, np.arange(2, 64 * 40, dtype=np.uint16) % 64)
    r = olmoc(build_dir, "train", cfg, "--set", f"data.train_path={other_data}", "--set",
              f"data.out_dir={tmp_path / 'x'}", *FAST, *base, "--resume-from", ck)
    assert r.returncode == 1 and "not the same data" in r.stderr, r.stderr

    def corrupted(name, mutate):
        bad = tmp_path / f"bad_{name}"
        shutil.copytree(ck, bad)
        mutate(bad)
        return bad

    def flip(path, offset):
        b = bytearray(path.read_bytes())
        b[offset] ^= 0x10
        path.write_bytes(bytes(b))

    cases = {
        "flipped": (lambda d: flip(d / "model.safetensors", -5), "is corrupt: the content hash of model.safetensors"),
        "truncated": (lambda d: (d / "optim.safetensors").write_bytes((d / "optim.safetensors").read_bytes()[:1000]),
                      "is corrupt: optim.safetensors has 1000 bytes"),
        "nostate": (lambda d: (d / "state.json").unlink(), "is incomplete or corrupt"),
        "garbage": (lambda d: (d / "state.json").write_text("{not json"), "state.json is not a JSON object"),
        "missing": (lambda d: (d / "config.yaml").unlink(), "config.yaml is missing"),
        "version": (lambda d: (d / "state.json").write_text(
            (d / "state.json").read_text().replace('"version":\t1', '"version":\t7')), "format version 7"),
    }
    for name, (mutate, message) in cases.items():
        bad = corrupted(name, mutate)
        for build in builds(build_dir):
            r = olmoc(build, *train_args(cfg, data, tmp_path / "o2", *base, "--resume-from", bad))
            assert r.returncode == 1 and message in r.stderr, (name, r.stderr)
            r = olmoc(build, "eval", bad, "--val", data)
            assert r.returncode == 1 and message in r.stderr, (name, r.stderr)

    # an edit of state.json that keeps the loader's epoch, position and tokens consistent with each other
    # (one step further on) is refused too: optim.safetensors records the run state under its content hash
    def one_step_on(d):
        st = json.loads((d / "state.json").read_text())
        per_step = st["tokens"] // st["step"], st["loader"]["pos"] // st["step"]
        st["tokens"] += per_step[0]
        st["loader"]["pos"] += per_step[1]
        (d / "state.json").write_text(json.dumps(st))
    bad = corrupted("consistent", one_step_on)
    for build in builds(build_dir):
        r = olmoc(build, *train_args(cfg, data, tmp_path / "o3", *base, "--resume-from", bad))
        assert r.returncode == 1 and "state.json is inconsistent with its files: it says tokens = 768" in r.stderr \
            and "optim.safetensors' (under the content hash) records 640" in r.stderr, r.stderr


M64 = (1 << 64) - 1


def legacy_hash64(data):
    """The 64-bit file hash of olmoc versions whose state.json names no "hash" (still read)."""
    def rotl(x, k):
        return ((x << k) | (x >> (64 - k))) & M64
    h = 0x9E3779B97F4A7C15 ^ ((len(data) * 0xFF51AFD7ED558CCD) & M64)
    n8 = len(data) // 8 * 8
    for w in np.frombuffer(data[:n8], dtype="<u8").tolist():
        h ^= (rotl((w * 0x87C37B91114253D5) & M64, 31) * 0x4CF5AD432745937F) & M64
        h = (rotl(h, 27) * 5 + 0x52DCE729) & M64
    tail = int.from_bytes(data[n8:], "little")
    h ^= (rotl((tail * 0x87C37B91114253D5) & M64, 31) * 0x4CF5AD432745937F) & M64
    for mult in (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53):
        h ^= h >> 33
        h = (h * mult) & M64
    return h ^ (h >> 33)


def test_file_hashes_xxh3_and_earlier(build_dir, tiny, tmp_path):
    """state.json names its files' hash, XXH3-64 ("hash": "xxh3_64", as the
    xxhash package computes it), and a damaged file is refused under it; a
    checkpoint of earlier olmoc versions (no "hash", their own 64-bit hash)
    still loads and resumes as the same checkpoint does, and is still checked."""
    cfg, data = tiny
    base = ["--set", "train.steps=4", "--set", "train.save_every=2", "--set", "train.keep_last=0"]
    out = tmp_path / "run"
    r = olmoc(build_dir, *train_args(cfg, data, out, *base, "--set", "train.steps=2"))
    assert r.returncode == 0, r.stderr
    ck = out / "step-000002"
    state = json.loads((ck / "state.json").read_text())
    assert state["hash"] == "xxh3_64"
    for name, entry in state["files"].items():
        assert entry["hash64"] == f"{xxhash.xxh3_64_intdigest((ck / name).read_bytes()):016x}", name

    def variant(name, edit_state, hash_fn=None, damage=None):
        d = tmp_path / name
        shutil.copytree(ck, d)
        st = json.loads((d / "state.json").read_text())
        edit_state(st)
        for f, entry in st["files"].items():
            if hash_fn:
                entry["hash64"] = f"{hash_fn((d / f).read_bytes()):016x}"
        (d / "state.json").write_text(json.dumps(st, indent="\t"))
        if damage:
            b = bytearray((d / damage).read_bytes())
            b[-5] ^= 0x10
            (d / damage).write_bytes(bytes(b))
        return d

    def no_hash(st):
        del st["hash"]

    def keep(st):
        pass

    earlier = variant("earlier", no_hash, legacy_hash64)
    r = olmoc(build_dir, "eval", earlier, "--val", data)
    assert r.returncode == 0, r.stderr
    # resuming from either gives the same run
    runs = {}
    for name, src in (("new", ck), ("earlier", earlier)):
        o = tmp_path / f"resumed-{name}"
        r = olmoc(build_dir, *train_args(cfg, data, o, *base, "--resume-from", src))
        assert r.returncode == 0 and "resumed from" in r.stdout, r.stderr
        runs[name] = deterministic(metrics(o))
    assert runs["new"] == runs["earlier"] and len(runs["new"]) > 0

    refused = {
        "xxh3, damaged": (variant("damaged", keep, damage="model.safetensors"),
                          "is corrupt: the content hash of model.safetensors"),
        "earlier, damaged": (variant("earlier-damaged", no_hash, legacy_hash64, damage="model.safetensors"),
                             "is corrupt: the content hash of model.safetensors"),
        # the field chooses the hash: files hashed one way, state.json naming the other
        "xxh3 read as earlier": (variant("xxh3-unnamed", no_hash), "is corrupt: the content hash of"),
        "earlier read as xxh3": (variant("earlier-named", keep, legacy_hash64), "is corrupt: the content hash of"),
        "unknown": (variant("sha", lambda st: st.update(hash="sha256")), "state.json's 'hash' is 'sha256'"),
    }
    for name, (d, message) in refused.items():
        r = olmoc(build_dir, "eval", d, "--val", data)
        assert r.returncode == 1 and message in r.stderr, (name, r.stderr)
        r = olmoc(build_dir, *train_args(cfg, data, tmp_path / "o2", *base, "--resume-from", d))
        assert r.returncode == 1 and message in r.stderr, (name, r.stderr)
    assert "(xxh3_64)" in olmoc(build_dir, "eval", refused["xxh3, damaged"][0], "--val", data).stderr


def test_interrupted_save_leaves_no_checkpoint(build_dir, tiny, tmp_path):
    """A temporary directory of a save cut short is ignored and cleaned up; the
    newest complete checkpoint is used."""
    cfg, data = tiny
    out = tmp_path / "run"
    base = ["--set", "train.steps=10", "--set", "train.save_every=5"]
    assert olmoc(build_dir, *train_args(cfg, data, out, "--set", "train.steps=5", "--set",
                                        "train.save_every=5")).returncode == 0
    partial = out / ".tmp-step-000010"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half a file")
    r = olmoc(build_dir, *train_args(cfg, data, out, *base, "--resume"))
    assert r.returncode == 0 and "resumed from" in r.stdout and "step-000005" in r.stdout, r.stderr
    assert not partial.exists() and (out / "step-000010" / "state.json").exists()


@pytest.mark.slow
def test_plot_runs(build_dir, tiny, tmp_path):
    cfg, data = tiny
    for name in ("a", "b"):
        r = olmoc(build_dir, *train_args(cfg, data, tmp_path / name, "--set", "train.steps=8", "--set",
                                         "train.eval_every=4", "--set", f"data.val_paths={data}"))
        assert r.returncode == 0, r.stderr
    png = tmp_path / "loss.png"
    r = subprocess.run([sys.executable, ROOT / "scripts" / "plot_runs.py", tmp_path / "a",
                        tmp_path / "b" / "metrics.jsonl", "-o", png, "--smooth", "2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    assert width >= 400 and height >= 300
    r = subprocess.run([sys.executable, ROOT / "scripts" / "plot_runs.py", tmp_path / "nothing"], capture_output=True,
                       text=True)
    assert r.returncode != 0 and "no metrics file" in r.stderr


def test_skip_step_window_is_checkpointed(build_dir, tiny, tmp_path):
    """SkipStepAdamW's rolling window (losses and grad norms) is saved in
    state.json and restored on resume, so the resumed run's window at a later
    step equals an uninterrupted run's (an empty window after resume would hold
    only the steps since).  A checkpoint without it (OLMo-core's, imported)
    starts with an empty window, as OLMo-core's own resume does."""
    cfg, data = tiny
    skip = ["--set", "train.optimizer=skip_step_adamw", "--set", "train.rolling_interval_length=6"]
    ref, out = tmp_path / "ref", tmp_path / "run"
    common = ["--set", "train.save_every=4", "--set", "train.keep_last=0", "--set", "train.schedule_steps=8", *skip]
    r = olmoc(build_dir, *train_args(cfg, data, ref, "--set", "train.steps=8", *common))
    assert r.returncode == 0, r.stderr
    r = olmoc(build_dir, *train_args(cfg, data, out, "--set", "train.steps=4", *common))
    assert r.returncode == 0, r.stderr
    st4 = json.loads((out / "step-000004" / "state.json").read_text())
    win = st4["optimizer"]["skip_step"]
    train = [x for x in metrics(out) if x["type"] == "train"]
    # [n_loss, n_norm, losses..., norms...]: the four steps' CE losses and gradient norms as logged, rounded to
    # fp32 as OLMo-core's window holds them, exactly
    f32 = lambda v: struct.unpack("f", struct.pack("f", v))[0]  # noqa: E731
    assert st4["optimizer"]["name"] == "SkipStepAdamW" and win[:2] == [4, 4]
    assert win[2:6] == [f32(x["loss"]) for x in train] and win[6:10] == [f32(x["grad_norm"]) for x in train], win
    r = olmoc(build_dir, *train_args(cfg, data, out, "--set", "train.steps=8", *common, "--resume"))
    assert r.returncode == 0, r.stderr
    a = json.loads((ref / "step-000008" / "state.json").read_text())["optimizer"]["skip_step"]
    b = json.loads((out / "step-000008" / "state.json").read_text())["optimizer"]["skip_step"]
    assert a[:2] == [7, 7] and a == b  # the window holds rolling_interval_length + 1 entries
    assert deterministic(metrics(ref)) == deterministic(metrics(out))
    # a window that does not fit this optimizer is refused with a message
    st = json.loads((out / "step-000008" / "state.json").read_text())
    st["optimizer"]["skip_step"] = [3, 3, 1.0]
    (out / "step-000008" / "state.json").write_text(json.dumps(st))
    r = olmoc(build_dir, *train_args(cfg, data, out, "--set", "train.steps=9", *common, "--resume"))
    assert r.returncode != 0 and "skip_step" in r.stderr, r.stderr
