"""Hostile and careless inputs through the whole CLI; the C-level
cases are in tests/c/test_hostile.c.  Each test failed before its fix."""
import json
import shutil

from test_cli import builds, olmoc, tiny  # noqa: F401  (tiny is a fixture)

FAST = ["--set", "train.peak_flops=1e12"]  # skip the startup SGEMM measurement
BASE = ["--set", "train.steps=10", "--set", "train.save_every=5", "--set", "train.keep_last=0"]


def train(build, cfg, data, out, *extra):
    return olmoc(build, "train", cfg, "--set", f"data.train_path={data}", "--set", f"data.out_dir={out}", *FAST,
                 *BASE, *extra)


def test_quote_and_backslash_in_paths_keep_checkpoints_readable(build_dir, tiny, tmp_path):
    """config.yaml was written with unescaped strings: a '"' or '\\' in a path
    made every checkpoint of the run unreadable."""
    cfg, data = tiny
    odd = tmp_path / 'we "quote" \\ back\\slash: #x'
    odd.mkdir()
    odd_data = odd / 'train "1".npy'
    shutil.copy(data, odd_data)
    out = odd / "run"
    r = train(build_dir, cfg, odd_data, out)
    assert r.returncode == 0, r.stderr
    r = train(build_dir, cfg, odd_data, out, "--set", "train.steps=12", "--resume")
    assert r.returncode == 0 and "resumed from" in r.stdout, r.stderr
    for build in builds(build_dir):
        r = olmoc(build, "eval", out / "step-000010", "--val", odd_data)
        assert r.returncode == 0, r.stderr


def test_edited_loader_epoch_is_refused(build_dir, tiny, tmp_path):
    """state.json's loader.epoch was neither validated nor hashed: an edit
    silently changed the data order on resume."""
    cfg, data = tiny
    out = tmp_path / "run"
    assert train(build_dir, cfg, data, out).returncode == 0
    ck = out / "step-000005"
    state = json.loads((ck / "state.json").read_text())
    assert state["loader"]["epoch"] == 0 and state["tokens"] == 5 * 4 * 32
    # the checkpoint as written resumes
    r = train(build_dir, cfg, data, tmp_path / "ok", "--resume-from", ck)
    assert r.returncode == 0 and "resumed from" in r.stdout, r.stderr
    for field, value in (("epoch", 1), ("epoch", 3), ("pos", 21), ("epoch", 0.5)):
        bad = tmp_path / f"bad_{field}_{value}"
        shutil.copytree(ck, bad)
        edited = json.loads((bad / "state.json").read_text())
        edited["loader"][field] = value
        (bad / "state.json").write_text(json.dumps(edited))
        for build in builds(build_dir):
            r = train(build, cfg, data, tmp_path / f"o_{field}_{value}", "--resume-from", bad)
            message = "state.json has no valid 'epoch'" if value == 0.5 else "state.json is inconsistent"
            assert r.returncode == 1 and message in r.stderr, (field, value, r.stderr)
