"""scripts/track.py: metrics.jsonl into Weights & Biases (offline mode) and
TensorBoard, read back with W&B's own reader of its transaction log
(`wandb leet inspect --json`) and TensorBoard's EventAccumulator.

A run followed live sends every train, eval and downstream record under
OLMo-core's metric names at its step, with metrics.jsonl's values (W&B:
exactly; TensorBoard: as float32, its scalar type); a run resumed from an
older checkpoint (which writes the steps after it again) and a restarted
tracker send each step once.  The per-step memory and per-device
throughput fields of metrics.jsonl are checked too."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from test_cli import ROOT, olmoc, tiny  # noqa: F401

wandb = pytest.importorskip("wandb")
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

TRACK = ROOT / "scripts" / "track.py"
TASK = ROOT / "tests" / "data" / "tiny_mc.jsonl"
PYTHON = sys.executable


def load_track():
    spec = importlib.util.spec_from_file_location("track", TRACK)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def env_for(tmp_path):
    return dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=str(tmp_path / "wb"),
                WANDB_DISABLE_GIT="true", OMP_NUM_THREADS="1")


def track(tmp_path, run, *args, timeout=120):
    (tmp_path / "wb").mkdir(exist_ok=True)
    r = subprocess.run([PYTHON, str(TRACK), str(run), "--wandb", "olmoc-test/tiny", "--tensorboard",
                        str(tmp_path / "tb"), *args], capture_output=True, text=True, env=env_for(tmp_path),
                       timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def train_args(cfg, data, run, val, *extra):
    return ["train", cfg, "--set", f"data.train_path={data}", "--set", f"data.out_dir={run}",
            "--set", f"data.val_paths={val}", "--set", "train.eval_batches=2", "--set", f"data.eval_tasks={TASK}",
            "--set", "train.peak_flops=1e12", *extra]


def records(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def wandb_records(tmp_path):
    """Every record of every offline session of the W&B run (W&B's reader of its transaction log)."""
    out = []
    for d in sorted((tmp_path / "wb" / "wandb").glob("offline-run-*")):
        r = subprocess.run([str(pathlib_bin("wandb")), "leet", "inspect", "--json", str(d)], capture_output=True,
                           text=True, env=env_for(tmp_path), timeout=120)
        assert r.returncode == 0, r.stderr
        out += [json.loads(line) for line in r.stdout.splitlines()]
    return out


def wandb_history(tmp_path):
    """Every history row of the W&B run, as (step, items)."""
    return [(x["history"]["step"]["num"], x["history"]["item"]) for x in wandb_records(tmp_path)
            if x.get("type") == "history"]


def pathlib_bin(name):
    return os.path.join(os.path.dirname(PYTHON), name)


def tensorboard_scalars(tmp_path):
    acc = event_accumulator.EventAccumulator(str(tmp_path / "tb"), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def expected_metrics(recs):
    """step -> OLMo-core name -> value, from metrics.jsonl, the names spelled out here."""
    out = {}
    for rec in recs:
        m = out.setdefault(rec["step"], {})
        if rec["type"] == "train":
            m.update({"train/CE loss": rec["loss"], "train/Z loss": rec["z_loss"],
                      "optim/total grad norm": rec["grad_norm"], "optim/LR (group 0)": rec["lr"],
                      "throughput/total tokens": rec["tokens"],
                      "throughput/device/TPS": rec["tokens_per_s_per_device"],
                      "throughput/device/MFU": 100 * rec["mfu"],
                      "gpu_memory/GPU active mem (GiB)": max(rec["mem_peak_bytes"]) / 2**30})
        elif rec["type"] == "eval":
            m.update({f"eval/lm/{rec['set']}/CE loss": rec["loss"], f"eval/lm/{rec['set']}/PPL": rec["ppl"]})
        elif rec["type"] == "downstream":
            m.update({f"eval/downstream/{rec['task']} (accuracy)": rec["acc"],
                      f"eval/downstream/{rec['task']} (accuracy per token)": rec["acc_per_token"]})
    return out


def check_sinks(tmp_path, recs, earlier=()):
    """W&B and TensorBoard hold every metric of recs once per step, with its value (or, for a step a resumed run
    wrote again, the value of its first writing, in earlier: the same but for timings)."""
    expected, before = expected_metrics(recs), expected_metrics(earlier)

    def allowed(step, name):
        return {expected[step][name]} | ({before[step][name]} if name in before.get(step, {}) else set())

    history = wandb_history(tmp_path)
    steps = [s for s, _ in history]
    assert sorted(steps) == sorted(set(steps)) == sorted(expected), steps  # each step once, none missing
    for step, items in history:
        for name in expected[step]:
            assert items[name] in allowed(step, name), (step, name, items.get(name), allowed(step, name))
    scalars = tensorboard_scalars(tmp_path)
    for name in {n for m in expected.values() for n in m}:
        got = scalars[name]
        assert [s for s, _ in got] == [s for s, m in sorted(expected.items()) if name in m], (name, got)
        for step, v in got:
            assert v in {np.float32(x) for x in allowed(step, name)}, (name, step, v, allowed(step, name))
    return history, scalars


@pytest.fixture
def data(tiny, tmp_path):  # noqa: F811
    cfg, train = tiny
    tokens = np.load(train)
    val = tmp_path / "val.npy"
    np.save(val, tokens[: 40 * 32])
    return cfg, train, val


def test_follows_a_live_run(build_dir, data, tmp_path):
    cfg, train, val = data
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "wb").mkdir()
    # the tracker starts first and follows the file as the run writes it, then ends with the run
    tracker = subprocess.Popen([PYTHON, str(TRACK), str(run), "--wandb", "olmoc-test/tiny", "--tensorboard",
                                str(tmp_path / "tb"), "--poll", "0.2"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env_for(tmp_path))
    time.sleep(1)
    mem = dict(os.environ, OLMOC_MEMSTATS="1")
    r = subprocess.run([str(build_dir / "olmoc"), *map(str, train_args(
        cfg, train, run, val, "--set", "train.steps=40", "--set", "train.eval_every=20",
        "--set", "train.save_every=20"))], capture_output=True, text=True, env=mem, timeout=300)
    assert r.returncode == 0, r.stderr
    ended_run = time.time()
    try:
        out, err = tracker.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        tracker.kill()
        pytest.fail("the tracker did not end after the run ended")
    assert tracker.returncode == 0, out + err
    print(f"\ntracker ended {time.time() - ended_run:.1f}s after the run: {err.strip().splitlines()[-1]}")

    recs = records(run)
    assert [x["step"] for x in recs if x["type"] == "train"] == list(range(1, 41))
    assert {(x["type"], x["step"]) for x in recs if x["type"] != "train"} == {
        ("eval", 20), ("eval", 40), ("downstream", 20), ("downstream", 40)}
    # the new fields: one process, so per device = the whole run; the peak from the backend's counters
    final_peak = int(r.stderr.split("| peak ")[1].split(" bytes")[0]) if "| peak " in r.stderr else \
        int(r.stdout.split("| peak ")[1].split(" bytes")[0])
    peaks = [x["mem_peak_bytes"] for x in recs if x["type"] == "train"]
    assert all(len(p) == 1 and 0 < p[0] <= final_peak for p in peaks)
    assert all(a[0] <= b[0] for a, b in zip(peaks, peaks[1:]))
    assert all(x["tokens_per_s_per_device"] == x["tokens_per_s"] for x in recs if x["type"] == "train")

    history, scalars = check_sinks(tmp_path, recs)
    # W&B's config: the run's config.yaml (given when it appears, after the tracker started)
    config = {}
    for x in wandb_records(tmp_path):
        if x.get("type") in ("run", "config"):
            config.update((x.get("run", x).get("config") or {}).get("update", {}))
    assert config["train"]["steps"] == 40 and config["model"]["d_model"] == 32, config
    print(f"W&B offline: {len(history)} history rows (steps 1-40), "
          f"{len({k for _, items in history for k in items if not k.startswith('_')})} metrics; "
          f"TensorBoard: {len(scalars)} scalar tags, {sum(len(v) for v in scalars.values())} points")


def test_resume_and_restart_send_each_step_once(build_dir, data, tmp_path):
    cfg, train, val = data
    run = tmp_path / "run"
    # one LR schedule for both parts (its length otherwise follows train.steps)
    common = ("--set", "train.eval_every=3", "--set", "train.save_every=2", "--set", "train.schedule_steps=8")
    r = olmoc(build_dir, *train_args(cfg, train, run, val, "--set", "train.steps=6", *common))
    assert r.returncode == 0, r.stderr
    first = records(run)
    track(tmp_path, run, "--once")
    tb_state = next((run / ".track").glob("tensorboard-*.json"))
    early_tb_state = tb_state.read_text()
    check_sinks(tmp_path, first)

    # resume from step 2 (the newer checkpoints removed): steps 3-6 are written again, then 7 and 8
    shutil.rmtree(run / "step-000006")
    shutil.rmtree(run / "step-000004")
    r = olmoc(build_dir, *train_args(cfg, train, run, val, "--set", "train.steps=8", *common), "--resume")
    assert r.returncode == 0 and "step-000002" in r.stdout + r.stderr, r.stdout + r.stderr
    recs = records(run)
    assert [x["step"] for x in recs if x["type"] == "train"] == list(range(1, 9))  # the run's own log: no repeats
    replayed = [x for x in recs if x["step"] <= 6]
    assert [x["loss"] for x in replayed if "loss" in x] == [x["loss"] for x in first if "loss" in x]
    track(tmp_path, run, "--once")
    track(tmp_path, run, "--once")  # nothing new
    # a tracker killed after sending but before saving its state: TensorBoard drops what it had sent
    tb_state.write_text(early_tb_state.replace('"step": 6', '"step": 4'))
    track(tmp_path, run, "--once")
    history, scalars = check_sinks(tmp_path, recs, earlier=first)
    sessions = len(list((tmp_path / "wb" / "wandb").glob("offline-run-*")))
    ids = {json.loads(p.read_text())["extra"]["run_id"] for p in (run / ".track").glob("wandb-*.json")}
    assert len(ids) == 1 and all(d.name.endswith(next(iter(ids))) for d in (tmp_path / "wb" / "wandb").glob(
        "offline-run-*"))
    print(f"\nresume + 3 restarts: W&B {sessions} offline sessions of one run, {len(history)} rows (steps 1-8 once); "
          f"TensorBoard {sum(len(v) for v in scalars.values())} points, no step twice")


def test_follower_reads_a_cut_or_replaced_file(tmp_path):
    Follower = load_track().Follower
    path = tmp_path / "m.jsonl"
    f = Follower(path)
    assert f.lines() == []  # not there yet
    path.write_bytes(b'{"step":1}\n{"step":2}\n{"st')
    assert f.lines() == [b'{"step":1}', b'{"step":2}']  # a partial last line waits
    with open(path, "ab") as fp:
        fp.write(b'ep":3}\n')
    assert f.lines() == [b'{"step":3}']
    path.write_bytes(b'{"step":1}\n')  # cut (a resumed run): read again from the top
    assert f.lines() == [b'{"step":1}']
    tmp = tmp_path / "m.tmp"
    tmp.write_bytes(b'{"step":1}\n{"step":2}\n')
    os.replace(tmp, path)  # rewritten through a temporary file: another inode
    assert f.lines() == [b'{"step":1}', b'{"step":2}']


def test_values_that_are_not_finite():
    t = load_track()
    rec = t.parse_record(b'{"type":"train","step":3,"loss":nan,"z_loss":null,"grad_norm":-inf,"lr":0.5}')
    assert rec["step"] == 3 and rec["loss"] is None and rec["grad_norm"] is None  # an older olmoc's bare nan
    assert t.metrics_of(rec)["optim/LR (group 0)"] == 0.5
    assert not {"train/CE loss", "train/PPL", "train/Z loss", "optim/total grad norm"} & set(t.metrics_of(rec))


def test_downstream_names_are_olmo_core_s():
    core = pytest.importorskip("olmo_core.train.callbacks.evaluator_callback")
    labels = core.DownstreamEvaluator.metric_type_to_label
    mine = load_track().DOWNSTREAM_LABELS
    assert {k: mine[k] for k in labels} == labels


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI (mpirun) is not installed")
def test_memory_of_each_rank(build_dir, data, tmp_path):
    cfg, train, val = data
    run = tmp_path / "run"
    cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", "2", str(build_dir / "olmoc"), "train", str(cfg),
           "--set", f"data.train_path={train}", "--set", f"data.out_dir={run}", "--set", "train.steps=2",
           "--set", "train.grad_accum=1", "--set", "train.peak_flops=1e12"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1",
                                                                     OLMOC_MEMSTATS="1"), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [x for x in records(run) if x["type"] == "train"]
    reported = {}
    for line in (r.stdout + r.stderr).splitlines():
        if "olmoc memstats: rank" in line:
            reported[int(line.split("rank ")[1].split(" ")[0])] = int(line.split("| peak ")[1].split(" ")[0])
    assert len(reported) == 2
    for row in rows:
        assert len(row["mem_peak_bytes"]) == 2 and all(0 < p <= reported[i] for i, p in enumerate(
            row["mem_peak_bytes"]))
        assert abs(row["tokens_per_s_per_device"] - row["tokens_per_s"] / 2) <= 1e-5 * row["tokens_per_s"]
    print(f"\n2 ranks: mem_peak_bytes {rows[-1]['mem_peak_bytes']} (OLMOC_MEMSTATS at exit: {reported})")
