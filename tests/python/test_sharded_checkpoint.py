"""Sharded checkpoints (src/train/checkpoint.h): every rank writes its own
shard (master weights and AdamW moments), a checkpoint written by N ranks
resumes on M (re-sharded on load), the Hugging Face export gathered from the
shards is the unsharded one byte for byte, damaged shards are refused, and a
new stage (--init-from CKPT --with-optimizer-state) carries the moments as
OLMo-core's load_optim_state=True, load_trainer_state=False does."""
import json
import os
import shutil
import subprocess

import pytest
import torch
import xxhash
import yaml
from safetensors.torch import load_file

import olmo3_ref as ref
from test_cli import tiny  # noqa: F401  (fixture: tiny config + token file)

MPIRUN = shutil.which("mpirun")
needs_mpi = pytest.mark.skipif(MPIRUN is None, reason="OpenMPI (mpirun) is not installed")

GLOBAL_ROWS = 12  # divisible by 1, 2, 3 and 4 ranks (micro_batch 1)
# Other rank counts compose micro-batches differently (OLMo-core deals the
# instances to ranks in turn) and sum gradients in another order: not
# bit-identical; at lr 2e-3 the differences stay at fp32 rounding level
# (test_mpi.py).  The same rank count resumes bit-identically.
SMALL_LR = ["--set", "train.lr=2e-3", "--set", "train.micro_batch=1"]
TOL_LOSS, TOL_NORM = 1e-5, 1e-4


def run(build_dir, cfg, data, out, ranks, *extra, check=True):
    accum = GLOBAL_ROWS // ranks
    cmd = [str(build_dir / "olmoc"), "train", str(cfg), "--set", f"data.train_path={data}",
           "--set", f"data.out_dir={out}", "--set", f"train.grad_accum={accum}", "--set", "train.peak_flops=1e12",
           *SMALL_LR, *map(str, extra)]
    if ranks > 1:
        cmd = [MPIRUN, "--oversubscribe", "--allow-run-as-root", "-np", str(ranks), *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def train_records(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [x for x in rows if x["type"] == "train"]


def close(a, b, tol):
    return abs(a - b) <= tol * max(abs(a), abs(b), 1e-12)


def assert_continues(full, resumed, exact):
    assert [x["step"] for x in resumed] == [x["step"] for x in full]
    for a, b in zip(full, resumed):
        if exact:
            assert (a["loss"], a["grad_norm"], a["lr"]) == (b["loss"], b["grad_norm"], b["lr"]), (a, b)
        else:
            assert close(a["loss"], b["loss"], TOL_LOSS) and close(a["grad_norm"], b["grad_norm"], TOL_NORM), (a, b)
            assert a["lr"] == b["lr"]


STEPS = ["--set", "train.steps=6", "--set", "train.save_every=3", "--set", "train.keep_last=0"]


@pytest.mark.slow
@needs_mpi
@pytest.mark.parametrize("save", ["sync", "async"])
def test_save_on_4_ranks_resumes_on_1_2_3_and_4(build_dir, tiny, tmp_path, save):  # noqa: F811
    cfg, data = tiny
    full = tmp_path / "full"
    mode = ["--set", f"train.async_save={str(save == 'async').lower()}"]
    run(build_dir, cfg, data, full, 4, *STEPS, *mode)
    ck = full / "step-000003"
    state = json.loads((ck / "state.json").read_text())
    assert state["version"] == 2 and state["world"] == 4 and state["optimizer"]["step"] == 3
    files = sorted(p.name for p in ck.iterdir())
    assert files == ["config.yaml", *[f"shard-{r:05d}-of-00004.safetensors" for r in range(4)], "state.json"]
    # the pieces tile the flat parameters; each shard file holds 3 x n_local floats
    pieces = sorted(tuple(p) for s in state["shards"] for p in s["pieces"])
    assert pieces[0][0] == 0 and all(a[0] + a[2] == b[0] for a, b in zip(pieces, pieces[1:]))
    assert pieces[-1][0] + pieces[-1][2] == state["n_floats"]
    for s in state["shards"]:
        t = load_file(str(ck / s["file"]))
        assert sorted(t) == ["exp_avg", "exp_avg_sq", "step", "weights"] and t["step"].tolist() == [3]
        assert all(t[k].numel() == s["n_local"] for k in ("weights", "exp_avg", "exp_avg_sq"))
    ref_records = train_records(full)[3:]
    for ranks in (4, 1, 2, 3):
        out = tmp_path / f"resume{ranks}"
        shutil.copytree(full, out)
        shutil.rmtree(out / "step-000006")
        r = run(build_dir, cfg, data, out, ranks, *STEPS, *mode, "--resume")
        assert "resumed from" in r.stdout
        assert_continues(ref_records, train_records(out)[3:], exact=ranks == 4)
        if ranks == 4:  # the same rank count: every byte of the final checkpoint and export
            for f in ["model.safetensors", *(f"step-000006/shard-{r:05d}-of-00004.safetensors" for r in range(4))]:
                assert (out / f).read_bytes() == (full / f).read_bytes(), f


@needs_mpi
def test_save_on_1_rank_resumes_on_4(build_dir, tiny, tmp_path):  # noqa: F811
    cfg, data = tiny
    full = tmp_path / "full"
    run(build_dir, cfg, data, full, 1, *STEPS)
    assert json.loads((full / "step-000003" / "state.json").read_text())["version"] == 1  # whole tensors, HF names
    out = tmp_path / "resume4"
    shutil.copytree(full, out)
    shutil.rmtree(out / "step-000006")
    # the layout as written before sharding (and by Python tools): no "optimizer" in state.json
    state = json.loads((out / "step-000003" / "state.json").read_text())
    del state["optimizer"]
    (out / "step-000003" / "state.json").write_text(json.dumps(state))
    run(build_dir, cfg, data, out, 4, *STEPS, "--resume")
    assert_continues(train_records(full)[3:], train_records(out)[3:], exact=False)
    assert json.loads((out / "step-000006" / "state.json").read_text())["version"] == 2


@needs_mpi
def test_export_from_shards_is_the_unsharded_export(build_dir, tiny, tmp_path):  # noqa: F811
    """model.safetensors gathered from 4 ranks' shards == the one a single
    rank writes from the same checkpoint (resumed with no step left)."""
    cfg, data = tiny
    out = tmp_path / "run"
    run(build_dir, cfg, data, out, 4, *STEPS)
    one = tmp_path / "one"
    shutil.copytree(out, one)
    (one / "model.safetensors").unlink()
    r = run(build_dir, cfg, data, one, 1, *STEPS, "--resume")
    assert "resumed from" in r.stdout and not train_records(one)[6:]
    assert (one / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    # the manifest describes the shards: the master weights put together by
    # their pieces are the exported tensors, in file order (the flat layout)
    header = json.loads((out / "model.safetensors").read_bytes()[8:8 + int.from_bytes(
        (out / "model.safetensors").read_bytes()[:8], "little")])
    names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
    w = load_file(str(out / "model.safetensors"))
    flat = torch.cat([w[n].reshape(-1) for n in names])
    state = json.loads((out / "step-000006" / "state.json").read_text())
    assembled = torch.full_like(flat, float("nan"))
    for s in state["shards"]:
        shard = load_file(str(out / "step-000006" / s["file"]))["weights"]
        for g, loc, n in s["pieces"]:
            assembled[g:g + n] = shard[loc:loc + n]
    assert torch.equal(assembled, flat)
    # eval reads a sharded checkpoint directory like any other
    r = subprocess.run([str(build_dir / "olmoc"), "eval", str(out / "step-000006"), "--val", str(data), "--batches",
                        "1"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.slow
@needs_mpi
def test_missing_or_corrupt_shard_is_refused(build_dir, tiny, tmp_path):  # noqa: F811
    cfg, data = tiny
    out = tmp_path / "run"
    run(build_dir, cfg, data, out, 4, "--set", "train.steps=2", "--set", "train.save_every=2")
    ck = out / "step-000002"
    missing = tmp_path / "missing"
    shutil.copytree(ck, missing)
    (missing / "shard-00002-of-00004.safetensors").unlink()
    corrupt = tmp_path / "corrupt"
    shutil.copytree(ck, corrupt)
    f = corrupt / "shard-00001-of-00004.safetensors"
    b = bytearray(f.read_bytes())
    b[-5] ^= 0x40
    f.write_bytes(bytes(b))
    def edited(name, fn):
        d = tmp_path / name
        shutil.copytree(ck, d)
        state = json.loads((d / "state.json").read_text())
        fn(state)
        (d / "state.json").write_text(json.dumps(state))
        return d

    hole = edited("hole", lambda s: s["shards"][1]["pieces"][0].__setitem__(2, s["shards"][1]["pieces"][0][2] - 1))
    step = edited("step", lambda s: s["optimizer"].__setitem__("step", 5))
    for bad, msg in ((missing, "is incomplete: shard-00002-of-00004.safetensors is missing"),
                     (corrupt, "is corrupt: the content hash of shard-00001-of-00004.safetensors is"),
                     (hole, "the shards' pieces leave a hole in the flat parameters at"),
                     (step, "shard-00000-of-00004.safetensors' holds optimizer step 2, state.json says 5")):
        for ranks in (1, 2):
            r = run(build_dir, cfg, data, tmp_path / f"o{ranks}{bad.name}", ranks, "--set", "train.steps=3",
                    "--resume-from", bad, check=False)
            assert r.returncode != 0 and msg in r.stderr, r.stderr
        if bad is not step:  # eval reads no optimizer state
            r = subprocess.run([str(build_dir / "olmoc"), "eval", str(bad), "--val", str(data)], capture_output=True,
                               text=True)
            assert r.returncode == 1 and msg in r.stderr, r.stderr


def header(path):
    raw = path.read_bytes()
    return json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])


@needs_mpi
def test_edited_state_json_is_refused(build_dir, tiny, tmp_path):  # noqa: F811
    """Each shard records its own name, rank, pieces and the run state in its
    __metadata__ (under its hash): a state.json whose piece lists or file
    entries were swapped loaded permuted weights and exited 0; a loader seed
    "abc" read as 0; an edit of epoch, position and tokens that kept them
    consistent with each other was taken as the data position."""
    cfg, data = tiny
    out = tmp_path / "run"
    run(build_dir, cfg, data, out, 4, "--set", "train.steps=2", "--set", "train.save_every=2")
    ck = out / "step-000002"
    state = json.loads((ck / "state.json").read_text())

    def edited(name, fn):
        d = tmp_path / name
        shutil.copytree(ck, d)
        st = json.loads((d / "state.json").read_text())
        fn(st)
        (d / "state.json").write_text(json.dumps(st))
        return d

    def swap(keys):
        def fn(st):
            a, b = st["shards"][0], st["shards"][1]
            for k in keys:
                a[k], b[k] = b[k], a[k]
        return fn

    def shift_epoch(st):  # one epoch later, tokens to match: consistent with each other
        assert st["loader"]["epoch"] == 0 and st["loader"]["pos"] > 0
        seq_len = st["tokens"] // st["loader"]["pos"]
        st["loader"]["epoch"] += 1
        st["tokens"] += st["loader"]["n_instances"] * seq_len

    cases = {
        "pieces": (swap(["pieces", "n_local"]), "state.json's pieces of 'shard-00000-of-00004.safetensors'"),
        "files": (swap(["file", "bytes", "hash64"]),
                  "lists 'shard-00001-of-00004.safetensors' as the shard of rank 0, but the file records rank 1"),
        "seed": (lambda st: st["loader"].__setitem__("seed", "abc"),
                 "state.json's loader seed \"abc\" is not a decimal 64-bit number"),
        "epoch": (shift_epoch, "state.json is inconsistent with its files: it says tokens = "),
    }
    for name, (fn, msg) in cases.items():
        bad = edited(name, fn)
        for ranks in (1, 2):
            r = run(build_dir, cfg, data, tmp_path / f"o{ranks}{name}", ranks, "--set", "train.steps=3",
                    "--resume-from", bad, check=False)
            assert r.returncode != 0 and msg in r.stderr, (name, ranks, r.stderr)
        if name in ("pieces", "files", "seed"):  # eval reads the weights (and state.json) only
            r = subprocess.run([str(build_dir / "olmoc"), "eval", str(bad), "--val", str(data)], capture_output=True,
                               text=True)
            assert r.returncode == 1 and msg in r.stderr, (name, r.stderr)
    # what a shard records
    meta = header(ck / "shard-00001-of-00004.safetensors")["__metadata__"]
    assert meta["file"] == "shard-00001-of-00004.safetensors" and meta["rank"] == "1"
    assert json.loads(meta["pieces"]) == state["shards"][1]["pieces"]
    assert json.loads(meta["state"])["tokens"] == state["tokens"]
    # a shard without the records (an earlier olmoc wrote none) still loads: the absence is accepted
    old = tmp_path / "old"
    shutil.copytree(ck, old)
    st = json.loads((old / "state.json").read_text())
    for sh in st["shards"]:
        f = old / sh["file"]
        raw = f.read_bytes()
        n = int.from_bytes(raw[:8], "little")
        h = json.loads(raw[8:8 + n])
        h["__metadata__"] = {"format": "olmoc-shard", "rank": h["__metadata__"]["rank"]}
        text = json.dumps(h, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        f.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])
        sh["bytes"] = f.stat().st_size
        sh["hash64"] = f"{xxhash.xxh3_64_intdigest(f.read_bytes()):016x}"
    (old / "state.json").write_text(json.dumps(st))
    r = run(build_dir, cfg, data, tmp_path / "o_old", 2, "--set", "train.steps=3", "--resume-from", old)
    assert "resumed from" in r.stdout, r.stderr


def reference_update(ck, batch, model_cfg, tcfg, lr, carried_step):
    """One torch.optim.AdamW step (float64) from the checkpoint's weights with
    its moments loaded as the optimizer state; state["step"] = carried_step."""
    w = {n: t.double() for n, t in load_file(str(ck / "model.safetensors")).items()}
    o = load_file(str(ck / "optim.safetensors"))
    params = {n: t.clone().requires_grad_(True) for n, t in w.items()}
    emb = "model.embed_tokens.weight"
    opt = torch.optim.AdamW([{"params": [params[emb]], "weight_decay": tcfg["embedding_weight_decay"]},
                             {"params": [t for n, t in params.items() if n != emb],
                              "weight_decay": tcfg["weight_decay"]}],
                            lr=lr, betas=(tcfg["beta1"], tcfg["beta2"]), eps=tcfg["eps"], foreach=False)
    for n, p in params.items():
        opt.state[p] = {"step": torch.tensor(float(carried_step), dtype=torch.float64),
                        "exp_avg": o[f"{n}.exp_avg"].double(), "exp_avg_sq": o[f"{n}.exp_avg_sq"].double()}
    labels = ref.labels_for(batch)
    n_labels = int((labels != -100).sum())
    logits = ref.forward(params, batch, model_cfg, tcfg["intra_doc_masking"])
    ce, zz = ref.loss_sums(logits, labels)
    ((ce + tcfg["z_loss"] * zz) / n_labels).backward()
    torch.nn.utils.clip_grad_norm_(list(params.values()), tcfg["clip_grad_norm"])
    opt.step()
    return {n: (p.detach() - w[n]) for n, p in params.items()}


def number(v):
    """YAML 1.1 reads 1e-08 (no dot) as a string."""
    try:
        return float(v) if isinstance(v, str) else v
    except ValueError:
        return v


def max_rel(a, b):
    num = max(float((a[n].double() - b[n].double()).abs().max()) for n in b)
    return num / max(float(b[n].abs().max()) for n in b)


def test_stage_handoff_carries_adam_moments(build_dir, tiny, tmp_path):  # noqa: F811
    """Stage 2 from Stage 1 (--init-from CKPT --with-optimizer-state): its
    first update equals torch.optim.AdamW with the checkpoint's moments and
    Adam step count loaded (OLMo-core loads each parameter's state["step"]
    with the optimizer state, so the bias correction continues), and differs
    from a fresh-moment start; the LR schedule and data order start afresh."""
    cfg, data = tiny
    stage1 = tmp_path / "stage1"
    run(build_dir, cfg, data, stage1, 1, "--set", "train.steps=3", "--set", "train.save_every=3")
    ck = stage1 / "step-000003"
    assert json.loads((ck / "state.json").read_text())["optimizer"]["step"] == 3
    stage2 = ["--set", "train.steps=1", "--set", "train.schedule=constant", "--set", "train.warmup_steps=0",
              "--set", "train.lr=1e-3", "--set", "train.save_every=1", "--init-from", ck]
    carried, fresh = tmp_path / "carried", tmp_path / "fresh"
    r = run(build_dir, cfg, data, carried, 1, *stage2, "--with-optimizer-state", "--dump-batches",
            tmp_path / "b.bin")
    assert train_records(carried)[0]["step"] == 1 and train_records(carried)[0]["lr"] == 1e-3
    run(build_dir, cfg, data, fresh, 1, *stage2)
    # a Stage 2 checkpoint records the carried Adam steps; its own step count restarts
    st = json.loads((carried / "step-000001" / "state.json").read_text())
    assert st["step"] == 1 and st["optimizer"] == {"name": "AdamW", "step": 4, "step_base": 3}
    assert json.loads((fresh / "step-000001" / "state.json").read_text())["optimizer"]["step"] == 1

    conf = yaml.safe_load((carried / "config.yaml").read_text())
    model_cfg, tcfg = ({k: number(v) for k, v in conf[s].items()} for s in ("model", "train"))
    batch = torch.frombuffer(bytearray((tmp_path / "b.bin").read_bytes()), dtype=torch.int32).long()
    batch = batch.view(GLOBAL_ROWS, tcfg["seq_len"])
    # first Stage-2 batch == Stage 1's first batch: a fresh data order
    s1 = tmp_path / "s1b.bin"
    run(build_dir, cfg, data, tmp_path / "s1again", 1, "--set", "train.steps=1", "--dump-batches", s1)
    assert s1.read_bytes() == (tmp_path / "b.bin").read_bytes()

    w0 = load_file(str(ck / "model.safetensors"))
    upd = {n: t.double() - w0[n].double() for n, t in load_file(str(carried / "model.safetensors")).items()}
    upd_fresh = {n: t.double() - w0[n].double() for n, t in load_file(str(fresh / "model.safetensors")).items()}
    ref_carried = reference_update(ck, batch, model_cfg, tcfg, 1e-3, 3)
    ref_reset = reference_update(ck, batch, model_cfg, tcfg, 1e-3, 0)
    err, err_fresh, err_reset = max_rel(upd, ref_carried), max_rel(upd_fresh, ref_carried), max_rel(upd, ref_reset)
    print(f"\nhand-off: first Stage-2 update vs torch AdamW with carried moments and step: {err:.2e}; "
          f"a fresh-moment start differs by {err_fresh:.2e}; a step counter reset to 0 by {err_reset:.2e}")
    assert err < 1e-3, err  # fp32 C vs float64 torch (stated tolerance)
    assert err_fresh > 0.05 and err_reset > 0.05, (err_fresh, err_reset)
    if MPIRUN:  # the same hand-off on 2 ranks (each loads its shard of the 1-rank checkpoint)
        two = tmp_path / "carried2"
        run(build_dir, cfg, data, two, 2, *stage2, "--with-optimizer-state")
        upd2 = {n: t.double() - w0[n].double() for n, t in load_file(str(two / "model.safetensors")).items()}
        err2 = max_rel(upd2, ref_carried)
        print(f"hand-off on 2 ranks: {err2:.2e}")
        assert err2 < 1e-3, err2


def test_init_from_flags_are_checked(build_dir, tiny, tmp_path):  # noqa: F811
    cfg, data = tiny
    base = [str(build_dir / "olmoc"), "train", str(cfg), "--set", f"data.train_path={data}",
            "--set", f"data.out_dir={tmp_path / 'o'}"]
    for extra, msg in ((["--with-optimizer-state"], "--with-optimizer-state needs --init-from CKPT"),
                       (["--init-from", tmp_path, "--resume"], "--init-from starts a new run"),
                       (["--init-from", tmp_path, "--init", tmp_path / "w.safetensors"], "either --init or --init-from"),
                       (["--init-from"], "--init-from needs a value"),
                       (["--init-from", tmp_path / "nope"], "is not a directory")):
        r = subprocess.run([*base, *map(str, extra)], capture_output=True, text=True)
        assert r.returncode in (1, 2) and msg in r.stderr, (extra, r.stderr)
    r = subprocess.run([str(build_dir / "olmoc"), "train", "--help"], capture_output=True, text=True)
    assert "--init-from CKPT" in r.stdout and "--with-optimizer-state" in r.stdout
