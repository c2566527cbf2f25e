"""The command line on the CUDA backend, on machines without a GPU.

build/tests/olmoc_emu is olmoc linked against the CUDA backend's own source
compiled for the host (tests/c/cuda_emu: kernels on CPU threads, cuBLAS by its
documented semantics, NCCL done with MPI).  This checks the wiring a GPU run
goes through: --backend in train / eval / generate, checkpoints moving between
backends, and data parallelism through the NCCL path with ZeRO-1 shards.
The kernels themselves are checked op by op in tests/c/test_backend_parity.c."""
import json
import os
import re
import shutil
import subprocess

import pytest

from test_cli import profiled_attention, tiny  # noqa: F401  (tiny: fixture, tiny config + token file)

MPIRUN = shutil.which("mpirun")


@pytest.fixture
def emu(build_dir):
    path = build_dir / "tests" / "olmoc_emu"
    if not path.exists():
        pytest.skip("olmoc_emu not built (needs a C++ compiler: OLMOC_CUDA_EMULATION_TEST)")
    return path


def run(binary, *args, ranks=1, env=None):
    cmd = [str(binary), *map(str, args)]
    if ranks > 1:
        cmd = [MPIRUN, "--oversubscribe", "--allow-run-as-root", "-np", str(ranks), *cmd]
    # the emulation runs a kernel's threads on one CPU thread; idle OpenMP threads must not spin against it
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="passive", **(env or {}))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def train(binary, cfg, data, out, *extra, ranks=1, env=None):
    # peak_flops given: measuring it with a 1024^3 GEMM would take long under emulation
    stdout = run(binary, "train", cfg, "--set", f"data.train_path={data}", "--set", f"data.out_dir={out}",
                 "--set", "train.peak_flops=1e12", *extra, ranks=ranks, env=env)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if row["type"] == "train"], stdout


def close(a, b, tol):
    return abs(a - b) <= tol * max(abs(a), abs(b), 1e-12)


def assert_same_trajectory(a_rows, b_rows, loss_tol=1e-5, norm_tol=1e-4):
    assert [r["step"] for r in a_rows] == [r["step"] for r in b_rows]
    for a, b in zip(a_rows, b_rows):
        assert close(a["loss"], b["loss"], loss_tol) and close(a["grad_norm"], b["grad_norm"], norm_tol), (a, b)
        assert a["lr"] == b["lr"]


@pytest.mark.slow
def test_train_on_cuda_matches_cpu(build_dir, emu, tiny, tmp_path):  # noqa: F811
    cfg, data = tiny
    # a tenth of the tiny config's learning rate: at 2e-2 the fp32 rounding differences between the
    # backends' kernels (reductions in another order) grow to 2e-3 in the grad norm within 7 steps,
    # an amplification by the training dynamics, not an error of either backend
    gentle = ("--set", "train.steps=8", "--set", "train.lr=2e-3")
    cpu, _ = train(build_dir / "olmoc", cfg, data, tmp_path / "cpu", *gentle)
    cuda, stdout = train(emu, cfg, data, tmp_path / "cuda", *gentle, "--backend", "cuda")
    assert "backend cuda |" in stdout
    assert cuda[-1]["loss"] < cuda[0]["loss"]
    assert_same_trajectory(cpu, cuda)


@pytest.mark.slow
def test_profile_on_cuda(build_dir, emu, tiny, tmp_path):  # noqa: F811
    """OLMOC_PROFILE=1 on the device backend, whose ops run asynchronously on a GPU: the profiler
    waits for the device around each op (backend synchronize) and reports the same ops and
    attention FLOPs as on the CPU."""
    cfg, data = tiny
    reports = {}
    for name, binary, extra in (("cpu", build_dir / "olmoc", ()), ("cuda", emu, ("--backend", "cuda"))):
        _, stdout = train(binary, cfg, data, tmp_path / name, "--set", "train.steps=2", *extra,
                          env={"OLMOC_PROFILE": "1"})
        reports[name] = stdout
    assert profiled_attention(reports["cpu"]) == profiled_attention(reports["cuda"])
    calls = [[(line.split()[1], line.split()[-3]) for line in r.splitlines()
              if line.startswith("profile: ") and "%" in line] for r in (reports["cpu"], reports["cuda"])]
    # 13 op lines: profile.c's names (rmsnorm, SwiGLU and attention each forward and backward apart); the
    # same calls but the optimizer's: the CUDA backend's one multi-tensor AdamW pass per step (adamw_flat)
    # against the CPU's pass per tensor
    assert len(calls[0]) == 13 and [c[0] for c in calls[0]] == [c[0] for c in calls[1]], reports["cuda"]
    assert [c for c in calls[0] if c[0] != "optimizer"] == [c for c in calls[1] if c[0] != "optimizer"], \
        reports["cuda"]
    assert dict(calls[1])["optimizer"] == "2" and int(dict(calls[0])["optimizer"]) > 2, reports["cuda"]
    # fully sharded: the same one pass over the local shard (the clip inside), not a scaling pass and an
    # AdamW call per unit; the losses those of the unsharded run (within 1e-6: other summation orders)
    fsdp_rows, fsdp = train(emu, cfg, data, tmp_path / "fsdp", "--set", "train.steps=2", "--set",
                            "train.sharding=fsdp", "--backend", "cuda", env={"OLMOC_PROFILE": "1"})
    optim = [line.split()[-3] for line in fsdp.splitlines() if line.startswith("profile: optimizer")]
    assert optim == ["2"], fsdp
    unsharded = [json.loads(line) for line in (tmp_path / "cuda" / "metrics.jsonl").read_text().splitlines()]
    assert_same_trajectory([r for r in unsharded if r["type"] == "train"], fsdp_rows, loss_tol=1e-6, norm_tol=1e-5)


@pytest.mark.slow
def test_checkpoint_moves_between_backends(build_dir, emu, tiny, tmp_path):  # noqa: F811
    cfg, data = tiny
    gentle = ("--set", "train.steps=6", "--set", "train.lr=2e-3", "--set", "train.save_every=3")
    full, _ = train(emu, cfg, data, tmp_path / "cuda", *gentle, "--backend", "cuda")
    out = tmp_path / "resumed"
    shutil.copytree(tmp_path / "cuda", out)
    shutil.rmtree(out / "step-000006")
    resumed, stdout = train(build_dir / "olmoc", cfg, data, out, *gentle, "--resume")
    assert "resumed from" in stdout and "backend cpu (" in stdout
    assert_same_trajectory(full, resumed)


def test_eval_and_generate_on_cuda_match_cpu(build_dir, emu, tiny, tmp_path):  # noqa: F811
    cfg, data = tiny
    train(build_dir / "olmoc", cfg, data, tmp_path / "run", "--set", "train.steps=10")
    run_dir = tmp_path / "run"
    evals = [json.loads(run(b, "eval", run_dir, "--val", data, "--batches", "3", "--json", *extra))
             for b, extra in ((build_dir / "olmoc", ()), (emu, ("--backend", "cuda")))]
    assert evals[0]["tokens"] == evals[1]["tokens"] > 0
    assert close(evals[0]["loss"], evals[1]["loss"], 1e-6), evals
    # greedy decoding through the KV cache: prefill chunks, then one token at a time past the
    # sliding window (8), so the ring buffer of the sliding layers wraps
    args = ("generate", run_dir, "--ids", "5,6,7,8,9,10,11", "--max-new-tokens", "24", "--ignore-eos", "--json")
    gens = [json.loads(run(build_dir / "olmoc", *args)), json.loads(run(emu, *args, "--backend", "cuda"))]
    assert len(gens[0]["generated"]) == 24
    assert gens[0]["generated"] == gens[1]["generated"]


@pytest.mark.slow
@pytest.mark.skipif(MPIRUN is None, reason="OpenMPI (mpirun) is not installed")
def test_data_parallel_through_nccl(emu, tiny, tmp_path):  # noqa: F811
    cfg, data = tiny
    gentle = ("--set", "train.steps=6", "--set", "train.lr=2e-3")  # see test_train_on_cuda_matches_cpu
    one, _ = train(emu, cfg, data, tmp_path / "one", *gentle, "--set", "train.grad_accum=2", "--backend", "cuda")
    two, stdout = train(emu, cfg, data, tmp_path / "two", *gentle, "--set", "train.grad_accum=1",
                        "--set", "train.save_every=3", "--backend", "cuda", ranks=2)
    assert "data parallel: 2 ranks" in stdout and "gradients through NCCL" in stdout
    assert_same_trajectory(one, two)
    # the ZeRO-1 shards are gathered into the checkpoint: it resumes on one rank
    out = tmp_path / "resumed"
    shutil.copytree(tmp_path / "two", out)
    shutil.rmtree(out / "step-000006")
    resumed, _ = train(emu, cfg, data, out, *gentle, "--set", "train.grad_accum=2", "--set", "train.save_every=3",
                       "--backend", "cuda", "--resume")
    assert_same_trajectory(two, resumed)


def test_backend_errors(build_dir, tiny, tmp_path):  # noqa: F811
    cfg, data = tiny
    base = [str(build_dir / "olmoc"), "train", str(cfg), "--set", f"data.train_path={data}",
            "--set", f"data.out_dir={tmp_path / 'out'}"]
    r = subprocess.run(base + ["--backend", "tpu"], capture_output=True, text=True)
    assert r.returncode == 1 and "unknown backend 'tpu'" in r.stderr
    r = subprocess.run(base + ["--backend"], capture_output=True, text=True)
    assert r.returncode == 2 and "--backend needs a value" in r.stderr
    if shutil.which("nvidia-smi") is None:  # a CUDA build on a machine without a GPU: a message, no crash
        r = subprocess.run(base + ["--backend", "cuda"], capture_output=True, text=True)
        assert r.returncode == 1 and "cuda" in r.stderr.lower(), r.stderr


def test_unsupported_head_dim_refused_at_model_creation(build_dir, emu, tiny, tmp_path):  # noqa: F811
    """The backend's capability query (backend.h check_attention) runs when the model is created: a
    head_dim the CUDA attention kernels cannot hold (> 128) is an error message and exit status 1
    before any step, not an abort inside the first forward pass.  The CPU backend trains it."""
    cfg, data = tiny
    wide = ("--set", "model.d_model=256", "--set", "model.n_heads=1", "--set", "model.n_kv_heads=1",
            "--set", "train.steps=1")
    rows, _ = train(build_dir / "olmoc", cfg, data, tmp_path / "cpu", *wide)
    assert len(rows) == 1
    out = tmp_path / "cuda"
    cmd = [str(emu), "train", str(cfg), "--set", f"data.train_path={data}", "--set", f"data.out_dir={out}",
           "--set", "train.peak_flops=1e12", *wide, "--backend", "cuda"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="passive"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "backend 'cuda' cannot run this model's attention" in r.stderr, r.stderr
    assert "head_dim 256: the CUDA attention kernels support head_dim 1..128" in r.stderr, r.stderr
    assert not (out / "metrics.jsonl").exists() or not [
        line for line in (out / "metrics.jsonl").read_text().splitlines() if '"train"' in line]


def test_no_copy_back_inside_a_micro_batch(emu, tiny, tmp_path):  # noqa: F811
    """A micro-batch queues its work without waiting for the device: no copy to the host and no
    synchronisation (the embedding backward sorts the host's ids, the loss sums stay on the device until
    the step's last micro-batch).  The emulation counts the copies back and the synchronisations
    (OLMOC_EMU_COUNTS=1); a run of 2 steps of 3 micro-batches must count as many as 2 steps of 1."""
    cfg, data = tiny
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="passive", OLMOC_EMU_COUNTS="1")

    def counts(accum):
        out = tmp_path / f"accum{accum}"
        r = subprocess.run([str(emu), "train", str(cfg), "--set", f"data.train_path={data}",
                            "--set", f"data.out_dir={out}", "--set", "train.peak_flops=1e12",
                            "--set", "train.steps=2", "--set", f"train.grad_accum={accum}",
                            "--backend", "cuda-bf16"], capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        m = re.search(r"cuda_emu: counts: (\d+) D2H copies, (\d+) H2D copies, (\d+) synchronisations", r.stderr)
        assert m, r.stderr
        return int(m.group(1)), int(m.group(3))

    one, three = counts(1), counts(3)
    print(f"2 steps: (D2H copies, synchronisations) with 1 micro-batch {one}, with 3 {three}")
    assert one == three, (one, three)
