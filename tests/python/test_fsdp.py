"""Fully sharded data parallelism (train.sharding: fsdp, and HSDP with
train.shard_degree) over MPI: 2, 3 and 4 ranks fully sharded and 2 x 2 HSDP
must train like one unsharded rank with the same global batch (losses, grad
norms and the final weights), evaluate like it, and a fully sharded
checkpoint must resume on another layout."""
import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
from safetensors.numpy import load_file

from test_cli import tiny  # noqa: F401  (fixture: tiny config + token file)

MPIRUN = shutil.which("mpirun")
pytestmark = [pytest.mark.skipif(MPIRUN is None, reason="OpenMPI (mpirun) is not installed"), pytest.mark.slow]

STEPS = 20
# As in test_mpi.py: at lr 2e-3 the rounding differences of another summation
# order (reduce-scatter vs sequential accumulation) stay at rounding level.
SMALL_LR = ("--set", "train.lr=2e-3")


def train(build_dir, cfg, data, out, ranks, accum, *extra):
    cmd = [str(build_dir / "olmoc"), "train", str(cfg), "--set", f"data.train_path={data}",
           "--set", f"data.out_dir={out}", "--set", f"train.grad_accum={accum}",
           "--set", f"train.steps={STEPS}", *SMALL_LR, *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if ranks > 1:
        cmd = [MPIRUN, "--oversubscribe", "--allow-run-as-root", "-np", str(ranks), *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return rows, r.stdout


def of_type(rows, kind):
    return [row for row in rows if row["type"] == kind]


def rel(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


def max_weight_diff(a, b):
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys()
    return max(float(np.max(np.abs(wa[k] - wb[k]))) for k in wa)


def compare(one, many, a_dir, b_dir):
    """Measured figures (losses and grad norms relative, weights absolute)."""
    t1, tn = of_type(one, "train"), of_type(many, "train")
    assert len(t1) == len(tn) == STEPS
    loss = max(rel(a["loss"], b["loss"]) for a, b in zip(t1, tn))
    gnorm = max(rel(a["grad_norm"], b["grad_norm"]) for a, b in zip(t1, tn))
    return loss, gnorm, max_weight_diff(a_dir, b_dir)


# Tolerances (fp32, 20 steps): loss 1e-5 relative and grad norm 1e-4 relative
# (test_mpi.py's), final weights 1e-5 absolute (weights are O(0.02..1)).
def check(figures, what):
    loss, gnorm, weights = figures
    print(f"{what}: max rel |dloss| {loss:.2e}, max rel |dgrad_norm| {gnorm:.2e}, max |dweight| {weights:.2e}")
    assert loss <= 1e-5 and gnorm <= 1e-4 and weights <= 1e-5, (what, figures)


def test_fully_sharded_matches_one_rank(build_dir, tiny, tmp_path):  # noqa: F811
    cfg, data = tiny
    one, _ = train(build_dir, cfg, data, tmp_path / "one", 1, 4)
    # one rank through the sharding engine (groups of one): the same arithmetic but for the order of
    # accumulating micro-batches' gradients
    f1, _ = train(build_dir, cfg, data, tmp_path / "f1", 1, 4, "--set", "train.sharding=fsdp")
    check(compare(one, f1, tmp_path / "one", tmp_path / "f1"), "fsdp 1 rank")
    for ranks, accum, extra, groups in ((2, 2, (), "groups of 2 ranks, 1 replicas"),
                                        (4, 1, (), "groups of 4 ranks, 1 replicas"),
                                        (4, 1, ("--set", "train.shard_degree=2"), "groups of 2 ranks, 2 replicas")):
        out = tmp_path / f"r{ranks}{'h' if extra else ''}"
        many, stdout = train(build_dir, cfg, data, out, ranks, accum, "--set", "train.sharding=fsdp", *extra)
        assert f"data parallel: {ranks} ranks" in stdout and f"fully sharded (FSDP) in {groups}" in stdout, stdout
        check(compare(one, many, tmp_path / "one", out), f"fsdp {ranks} ranks {' '.join(extra)}")


def test_fully_sharded_pads_units(build_dir, tiny, tmp_path):  # noqa: F811
    """3 ranks: no unit of the tiny model divides by 3, so every shard group pads."""
    cfg, data = tiny
    one, _ = train(build_dir, cfg, data, tmp_path / "one", 1, 3)
    three, _ = train(build_dir, cfg, data, tmp_path / "three", 3, 1, "--set", "train.sharding=fsdp")
    check(compare(one, three, tmp_path / "one", tmp_path / "three"), "fsdp 3 ranks")


def test_fully_sharded_eval_and_resume(build_dir, tiny, tmp_path):  # noqa: F811
    """In-loop evaluation runs through the same residency hooks; a fully sharded checkpoint resumes
    unsharded (and the other way round)."""
    cfg, data = tiny
    ev = ("--set", f"data.val_paths={data}", "--set", "train.eval_every=10", "--set", "train.eval_batches=2",
          "--set", "train.save_every=10")
    one, _ = train(build_dir, cfg, data, tmp_path / "one", 1, 2, *ev)
    two, _ = train(build_dir, cfg, data, tmp_path / "two", 2, 1, "--set", "train.sharding=fsdp", *ev)
    e1, e2 = of_type(one, "eval"), of_type(two, "eval")
    assert len(e1) == len(e2) == 2
    for a, b in zip(e1, e2):
        assert rel(a["loss"], b["loss"]) <= 1e-5, (a, b)
    for src, ranks, extra in (("two", 1, ()), ("one", 2, ("--set", "train.sharding=fsdp"))):
        out = tmp_path / f"resume-{src}"
        shutil.copytree(tmp_path / src, out)
        shutil.rmtree(out / f"step-{STEPS:06d}")
        resumed, stdout = train(build_dir, cfg, data, out, ranks, 2 // ranks, *ev, *extra, "--resume")
        assert "resumed from" in stdout
        full = of_type(one, "train")
        rows = of_type(resumed, "train")
        assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
        for a, b in zip(full[10:], rows[10:]):
            assert rel(a["loss"], b["loss"]) <= 1e-5 and rel(a["grad_norm"], b["grad_norm"]) <= 1e-4, (a, b)
        assert max_weight_diff(tmp_path / "one", out) <= 1e-5


def test_fully_sharded_bf16_backend(build_dir, tiny, tmp_path):  # noqa: F811
    """cpu-bf16: the GEMM matrices are gathered in bf16 (the compute copy the GEMMs read), the embeddings
    and norm weights in fp32.  Across rank
    counts bf16 runs drift apart (~6% in the grad norm by step 20 at any sharding: another summation
    order flips bf16 roundings), so fully sharded runs are compared with ZeRO-1 on the same ranks, whose
    micro-batches and bf16 operands are the same."""
    cfg, data = tiny
    bf = ("--backend", "cpu-bf16")
    for ranks in (2, 3):
        zero1, _ = train(build_dir, cfg, data, tmp_path / f"zero1-{ranks}", ranks, 1, *bf)
        fsdp, _ = train(build_dir, cfg, data, tmp_path / f"fsdp-{ranks}", ranks, 1, "--set", "train.sharding=fsdp", *bf)
        loss, gnorm, weights = compare(zero1, fsdp, tmp_path / f"zero1-{ranks}", tmp_path / f"fsdp-{ranks}")
        print(f"cpu-bf16, {ranks} ranks fsdp vs zero1: loss {loss:.2e} grad norm {gnorm:.2e} weights {weights:.2e}")
        if ranks == 2:  # a sum of two is the same in any order: the same run
            assert loss <= 1e-6 and gnorm <= 1e-6 and weights <= 1e-6
        else:
            # 3 ranks (every unit padded, its pieces gathered in bf16): the reduce-scatter adds three
            # ranks' gradients in another order than the all-reduce (~1e-10 in the grad norm), which bf16
            # amplifies over 20 steps.  Steps 1 and 2 must agree to the last digits: step 1 runs the
            # gathered initial weights, and AdamW's first update (m / sqrt(v) = g / |g| elementwise) does
            # not see a 1e-10 difference in g, so step 2's bf16 weights are the same too.  From the second
            # update on the difference reaches the weights and a flipped bf16 rounding may show at once
            # (how soon depends on the GEMM library's kernels: on an Intel AVX-512 machine with oneDNN's
            # bf16 matmul, step 3's losses differed by 7.3e-7, every step's by at most 7.6e-5)
            t0, t1 = of_type(zero1, "train"), of_type(fsdp, "train")
            assert all(rel(a["loss"], b["loss"]) <= 1e-12 for a, b in zip(t0[:2], t1[:2])), (t0[:2], t1[:2])
            assert all(rel(a["grad_norm"], b["grad_norm"]) <= 1e-8 for a, b in zip(t0[:2], t1[:2])), (t0[:2], t1[:2])
            assert loss <= 1e-3, loss  # a wrong gathered piece moves the loss by far more


def test_bad_shard_degree(build_dir, tiny, tmp_path):  # noqa: F811
    cfg, data = tiny
    env = dict(os.environ, OMP_NUM_THREADS="1")
    base = [str(build_dir / "olmoc"), "train", str(cfg), "--set", f"data.train_path={data}",
            "--set", f"data.out_dir={tmp_path / 'x'}", "--set", "train.steps=1"]
    r = subprocess.run([MPIRUN, "--oversubscribe", "--allow-run-as-root", "-np", "2", *base,
                        "--set", "train.sharding=fsdp", "--set", "train.shard_degree=3"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode != 0 and "train.shard_degree 3 must divide the number of ranks (2)" in r.stderr
    r = subprocess.run([*base, "--set", "train.shard_degree=2"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode != 0 and "train.shard_degree applies to train.sharding: fsdp" in r.stderr


def test_fully_sharded_through_nccl(build_dir, tiny, tmp_path):  # noqa: F811
    """The CUDA backend's path (build/tests/olmoc_emu: the CUDA backend's source on an emulated runtime, NCCL
    done with MPI): shard and replica groups get NCCL communicators; all-gather, reduce-scatter and the
    replicas' all-reduce run on device buffers.  2 ranks fully sharded and 2 x 2 HSDP match one rank.
    The emulated NCCL refuses an operation on a communicator whose previous one, on another stream, is not
    ordered before it by an event: the all-gathers (main and side stream) and the reduce-scatters (gradient
    stream) must keep to communicators of their own, or these runs fail.
    3 steps: the emulation runs a step in ~4 s."""
    emu = build_dir / "tests" / "olmoc_emu"
    if not emu.exists():
        pytest.skip("olmoc_emu not built (needs a C++ compiler: OLMOC_CUDA_EMULATION_TEST)")
    cfg, data = tiny
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="passive")

    def run(out, ranks, accum, *extra):
        cmd = [str(emu), "train", str(cfg), "--set", f"data.train_path={data}", "--set", f"data.out_dir={out}",
               "--set", f"train.grad_accum={accum}", "--set", "train.steps=3", "--set", "train.peak_flops=1e12",
               *SMALL_LR, "--backend", "cuda", *extra]
        if ranks > 1:
            cmd = [MPIRUN, "--oversubscribe", "--allow-run-as-root", "-np", str(ranks), *cmd]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        return of_type([json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()], "train"), r.stdout

    one, _ = run(tmp_path / "one", 1, 4)
    for ranks, accum, extra, groups in ((2, 2, (), "groups of 2 ranks, 1 replicas"),
                                        (4, 1, ("--set", "train.shard_degree=2"), "groups of 2 ranks, 2 replicas")):
        out = tmp_path / f"r{ranks}"
        many, stdout = run(out, ranks, accum, "--set", "train.sharding=fsdp", *extra)
        assert f"fully sharded (FSDP) in {groups}; through NCCL; the next block gathered on a second stream; " \
            "gradients reduce-scattered on a third stream" in stdout, stdout
        # the side stream, 4 layers: per step block 0 is gathered when needed (the weights changed), every
        # other block ahead, except those the two buffers still hold: the last two blocks of a forward pass
        # are the first two of the backward pass, and its last two the next micro-batch's first two.  So
        # per step 3 + 2 ahead on the first micro-batch, 2 + 2 on each further one.
        m = re.search(r"fsdp: (\d+) block gathers when a block was needed, (\d+) ahead on the side stream\n", stdout)
        assert m and (int(m.group(1)), int(m.group(2))) == (3, 3 * (5 + 4 * (accum - 1))), stdout
        assert len(many) == len(one) == 3
        loss = max(rel(a["loss"], b["loss"]) for a, b in zip(one, many))
        gnorm = max(rel(a["grad_norm"], b["grad_norm"]) for a, b in zip(one, many))
        weights = max_weight_diff(tmp_path / "one", out)
        print(f"emulated cuda, {ranks} ranks {' '.join(extra)}: loss {loss:.2e} grad norm {gnorm:.2e} "
              f"weights {weights:.2e}")
        assert loss <= 1e-5 and gnorm <= 1e-4 and weights <= 1e-5
    # cuda-bf16: matrices all-gathered in bf16 through NCCL; the same micro-batches as ZeRO-1 on 2 ranks
    bf = ("--backend", "cuda-bf16", "--set", "train.grad_accum=1")
    zero1, _ = run(tmp_path / "bf-zero1", 2, 1, *bf)
    fsdp, _ = run(tmp_path / "bf-fsdp", 2, 1, *bf, "--set", "train.sharding=fsdp")
    loss = max(rel(a["loss"], b["loss"]) for a, b in zip(zero1, fsdp))
    gnorm = max(rel(a["grad_norm"], b["grad_norm"]) for a, b in zip(zero1, fsdp))
    weights = max_weight_diff(tmp_path / "bf-zero1", tmp_path / "bf-fsdp")
    print(f"emulated cuda-bf16, 2 ranks fsdp vs zero1: loss {loss:.2e} grad norm {gnorm:.2e} weights {weights:.2e}")
    assert loss <= 1e-6 and gnorm <= 1e-6 and weights <= 1e-6


def test_one_rank_collectives_through_nccl(build_dir, tiny, tmp_path):  # noqa: F811
    """OLMOC_FSDP_COMM=1: one rank fully sharded still runs its all-gathers and reduce-scatters through
    (one-rank) NCCL communicators instead of skipping them, which is how one GPU exercises the collective
    path (scripts/gpu_check.sh); the weights are those of the run that skips them, bit for bit."""
    emu = build_dir / "tests" / "olmoc_emu"
    if not emu.exists():
        pytest.skip("olmoc_emu not built (needs a C++ compiler: OLMOC_CUDA_EMULATION_TEST)")
    cfg, data = tiny
    outs = []
    for force in ("0", "1"):
        out = tmp_path / f"comm{force}"
        env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="passive", OLMOC_FSDP_COMM=force)
        r = subprocess.run([str(emu), "train", str(cfg), "--set", f"data.train_path={data}", "--set",
                            f"data.out_dir={out}", "--set", "train.steps=2", "--set", "train.grad_accum=2",
                            "--set", "train.peak_flops=1e12", "--set", "train.sharding=fsdp",
                            "--backend", "cuda-bf16"], capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        assert ("its collectives through NCCL" in r.stdout) == (force == "1"), r.stdout
        outs.append((out / "model.safetensors").read_bytes())
    assert outs[0] == outs[1]


def test_hsdp_checkpoint_saves_one_replica_and_resumes(build_dir, tiny, tmp_path):  # noqa: F811
    """HSDP 2 x 2: the second replica group holds copies of the first group's shards, so only the
    first group's pieces are saved (the manifest's pieces tile the parameters once); the checkpoint
    resumes on the same layout bit-identically and on one unsharded rank within the tolerances."""
    cfg, data = tiny
    hsdp = ("--set", "train.sharding=fsdp", "--set", "train.shard_degree=2", "--set", "train.save_every=10",
            "--set", "train.keep_last=0")
    full, _ = train(build_dir, cfg, data, tmp_path / "full", 4, 1, *hsdp)
    state = json.loads((tmp_path / "full" / "step-000010" / "state.json").read_text())
    lens = [sum(p[2] for p in sh["pieces"]) if "pieces" in sh else None for sh in state["shards"]]
    assert state["world"] == 4 and lens[2:] == [0, 0] and sum(lens) == state["n_floats"], lens
    for ranks, extra in ((4, hsdp), (1, ())):
        out = tmp_path / f"resume{ranks}"
        shutil.copytree(tmp_path / "full", out)
        shutil.rmtree(out / f"step-{STEPS:06d}")
        resumed, stdout = train(build_dir, cfg, data, out, ranks, 4 // ranks, *extra, "--resume")
        assert "resumed from" in stdout
        a, b = of_type(full, "train")[10:], of_type(resumed, "train")[10:]
        if ranks == 4:
            assert [(x["loss"], x["grad_norm"]) for x in a] == [(x["loss"], x["grad_norm"]) for x in b]
            assert (tmp_path / "full" / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
        else:
            for x, y in zip(a, b):
                assert rel(x["loss"], y["loss"]) <= 1e-5 and rel(x["grad_norm"], y["grad_norm"]) <= 1e-4, (x, y)
            assert max_weight_diff(tmp_path / "full", out) <= 1e-5


def test_checkpointing_under_fsdp_is_bit_identical(build_dir, tiny, tmp_path):  # noqa: F811
    """Activation checkpointing inside the residency hooks: a checkpointed block recomputes with the
    weights gathered for its backward pass, so 2 fully sharded ranks train bit-identically with
    feed_forward and block checkpointing (every second block) as without."""
    cfg, data = tiny
    fsdp = ("--set", "train.sharding=fsdp")
    base, _ = train(build_dir, cfg, data, tmp_path / "none", 2, 1, *fsdp)
    for mode, every in (("feed_forward", 1), ("block", 2)):
        out = tmp_path / f"{mode}{every}"
        rows, stdout = train(build_dir, cfg, data, out, 2, 1, *fsdp, "--set", f"train.activation_checkpointing={mode}",
                             "--set", f"train.block_every={every}")
        key = [(r["loss"], r["grad_norm"], r["lr"]) for r in of_type(base, "train")]
        assert [(r["loss"], r["grad_norm"], r["lr"]) for r in of_type(rows, "train")] == key, mode
        assert (tmp_path / "none" / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()


def bf16_copy(src, dst):
    """src's tensors as BF16 (the reader widens them; every run reads the same values)."""
    import torch
    from safetensors.torch import load_file as load_torch, save_file as save_torch
    save_torch({k: v.to(torch.bfloat16) for k, v in load_torch(str(src)).items()}, str(dst))


def test_init_file_under_fsdp_matches_one_rank(build_dir, tiny, tmp_path):  # noqa: F811
    """--init W.safetensors: each rank reads only its pieces of the file (fsdp, HSDP and ZeRO-1), and
    the runs match one rank starting from the same file."""
    cfg, data = tiny
    base, _ = train(build_dir, cfg, data, tmp_path / "base", 1, 4)
    init = tmp_path / "init.safetensors"
    bf16_copy(tmp_path / "base" / "model.safetensors", init)
    one, _ = train(build_dir, cfg, data, tmp_path / "one", 1, 4, "--init", str(init))
    # the file, not the seed, set the starting point (20 trained steps: a lower first loss)
    assert of_type(one, "train")[0]["loss"] < 0.97 * of_type(base, "train")[0]["loss"], (one[0], base[0])
    for ranks, accum, extra in ((2, 2, ("--set", "train.sharding=fsdp")),
                                (4, 1, ("--set", "train.sharding=fsdp")),
                                (4, 1, ("--set", "train.sharding=fsdp", "--set", "train.shard_degree=2")),
                                (2, 2, ())):
        out = tmp_path / f"r{ranks}-{len(extra)}"
        many, _ = train(build_dir, cfg, data, out, ranks, accum, *extra, "--init", str(init))
        check(compare(one, many, tmp_path / "one", out), f"--init, {ranks} ranks {' '.join(extra) or 'zero1'}")


def test_bad_init_file_fails_every_rank(build_dir, tiny, tmp_path):  # noqa: F811
    """A file with a tensor missing, of another shape, or holding a NaN in one rank's piece only is
    refused on every rank with the cause (no rank hangs in a collective)."""
    import torch
    from safetensors.torch import load_file as load_torch, save_file as save_torch
    cfg, data = tiny
    train(build_dir, cfg, data, tmp_path / "base", 1, 1, "--set", "train.steps=1")
    good = load_torch(str(tmp_path / "base" / "model.safetensors"))
    names = list(good)
    last = names[-1]
    missing = dict(good)
    del missing[names[0]]
    shape = dict(good)
    shape[names[1]] = good[names[1]].reshape(-1)[:-1].clone()
    nan = {k: v.clone() for k, v in good.items()}
    n = nan[last].numel()
    nan[last].view(-1)[n - 1] = float("nan")  # the end of the last tensor: in the last rank's piece
    cases = {"missing": (missing, f"has no tensor '{names[0]}'"),
             "shape": (shape, f"tensor '{names[1]}' has shape [{good[names[1]].numel() - 1}]"),
             "nan": (nan, f"tensor '{last}' has 1 values that are not finite (the first, element {n - 1}, is NaN)")}
    for what, (tensors, message) in cases.items():
        path = tmp_path / f"{what}.safetensors"
        save_torch(tensors, str(path))
        for ranks in (2, 4):
            cmd = [MPIRUN, "--oversubscribe", "--allow-run-as-root", "-np", str(ranks), str(build_dir / "olmoc"),
                   "train", str(cfg), "--set", f"data.train_path={data}", "--set",
                   f"data.out_dir={tmp_path / ('o-' + what)}", "--set", "train.sharding=fsdp", "--init", str(path)]
            r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                               timeout=120)
            assert r.returncode != 0, (what, r.stdout + r.stderr)
            for rank in range(ranks):
                line = next((x for x in r.stderr.splitlines() if x.startswith(f"olmoc train (rank {rank}): ")), "")
                assert f"'{path}'" in line and message in line, (what, ranks, rank, r.stderr)
