"""The GPU check's parts that run without a GPU.

* bench/olmo_core_anchor.py builds OLMo-core's own TransformerConfig.olmo3_1B: its parameter count and
  its FLOPs per token counted olmoc's way must be those of `olmoc info configs/olmo3-1b.yaml` (the
  reference: olmoc's own count of the same model), and likewise for the scaled-down model of the dry
  run against the olmoc config of the same shape; the dry run trains it for real (OLMo-core's
  train_batch / optim_step, FSDP on one gloo rank) and writes its result line.
* scripts/gpu_check.sh --quick --dry-run goes through the quick check's steps on this machine (parity
  on the emulated CUDA backend, bench_train and the memory plan on cpu-bf16 with a tiny config, the
  anchor, the projection GEMMs and PyTorch SDPA in their tiny sizes): $OUT/summary.txt must grow while the run goes on (a
  stopped run keeps what it measured) and end with a table that parses.
"""
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
ANCHOR = ROOT / "bench" / "olmo_core_anchor.py"
TINY_OLMOC = ["--set", "model.vocab_size=1024", "--set", "model.d_model=128", "--set", "model.n_layers=2",
              "--set", "model.n_heads=4", "--set", "model.n_kv_heads=4", "--set", "model.mlp_hidden=256",
              "--set", "model.sliding_window=128", "--set", "model.full_attention_every=2",
              "--set", "train.seq_len=256"]


def olmoc_count(build_dir, config, *sets):
    out = subprocess.run([str(build_dir / "olmoc"), "info", config, *sets], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    total, non_embedding = map(int, re.search(r"# parameters: (\d+) total, (\d+) without", out).groups())
    flops = float(re.search(r"# training FLOPs per token at seq_len \d+: (\S+)", out).group(1))
    return total, non_embedding, flops


def kv(line):
    return dict(re.findall(r"(\w+)=(\S+)", line))


def anchor(*args, timeout=600):
    p = subprocess.run([sys.executable, str(ANCHOR), *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


@pytest.mark.parametrize("tiny", [False, True], ids=["olmo3-1b", "tiny"])
def test_anchor_counts_as_olmoc(build_dir, tiny):
    out = anchor("--count-only", *(["--tiny"] if tiny else []))
    a = kv(next(l for l in out.splitlines() if l.startswith("ANCHOR_COUNT")))
    if tiny:
        total, non_embedding, flops = olmoc_count(build_dir, "configs/olmo3-1m-8k.yaml", *TINY_OLMOC)
    else:
        total, non_embedding, flops = olmoc_count(build_dir, "configs/olmo3-1b.yaml")
    assert int(a["params"]) == total and int(a["non_embedding"]) == non_embedding
    # olmoc info prints 4 significant digits
    assert abs(float(a["flops_per_token"]) - flops) <= 5e-4 * flops, (a, flops)


def test_anchor_dry_run(tmp_path):
    out_file = tmp_path / "out.txt"
    out = anchor("--tiny", "--steps", "1", "--warmup", "1", "--out", str(out_file))
    written = out_file.read_text().splitlines()
    # every line printed is in the file, in order
    printed = [l for l in out.splitlines() if l.startswith(("anchor:", "ANCHOR "))]
    assert written == printed
    result = kv(next(l for l in written if l.startswith("ANCHOR ")))
    assert result["mode"] == "eager" and result["attention"] == "torch" and result["seq_len"] == "256"
    assert float(result["tokens_per_s"]) > 0
    assert float(result["flops_per_token"]) == 3104640  # olmoc info's count of this shape: test above
    steps = [l for l in written if re.match(r"anchor: eager step \d", l)]
    assert len(steps) == 2 and all(re.search(r"loss \d+\.\d+", l) for l in steps), steps


@pytest.mark.slow
def test_gpu_check_quick_dry_run(build_dir, tmp_path):
    emu = build_dir / "tests" / "test_backend_parity_emu"
    if not emu.exists():
        pytest.skip(f"{emu} is not built (OLMOC_CUDA_EMULATION_TEST off)")
    out_dir = tmp_path / "out"
    env = dict(os.environ, OUT=str(out_dir), OMP_NUM_THREADS="1")
    if (ROOT / ".venv" / "bin" / "python").exists():
        env.setdefault("PYTHON", str(ROOT / ".venv" / "bin" / "python"))
    else:
        env.setdefault("PYTHON", sys.executable)
    p = subprocess.Popen(["bash", "scripts/gpu_check.sh", "--quick", "--dry-run", "--build-dir", str(build_dir)],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # $OUT/summary.txt while the run goes on: it must hold result lines before the run ends
    seen_while_running = []
    deadline = time.monotonic() + 1500
    while p.poll() is None and time.monotonic() < deadline:
        f = out_dir / "summary.txt"
        if f.exists():
            seen_while_running.append(len(f.read_text().splitlines()))
        time.sleep(2)
    if p.poll() is None:
        p.kill()
        pytest.fail("gpu_check.sh --quick --dry-run did not finish in 25 minutes")
    log = p.stdout.read()
    summary = (out_dir / "summary.txt").read_text().splitlines()
    assert max(seen_while_running, default=0) >= 3, seen_while_running
    assert len(set(seen_while_running)) >= 3, seen_while_running  # it grew step by step
    assert not any(l.startswith("INFO  gpu_check: done") for l in summary[: min(seen_while_running)])
    for step in ("parity-cuda-bf16", "bench-cpu-bf16", "gemms", "sdpa", "anchor"):
        assert f"PASS  {step} (" in "\n".join(summary), (step, log[-4000:])
    assert any(l.startswith("ANCHOR mode=eager") for l in summary)
    assert any(l.startswith("SDPA best=math") for l in summary)
    # the projection GEMMs: six cases (q|k|v and gate|up, three passes) and the total, each timed
    gemms = [kv(l) for l in summary if l.startswith("GEMMS width=64:256 ")]
    assert len(gemms) == 6 and all(float(g["separate_ms"]) > 0 and float(g["fused_ms"]) > 0 for g in gemms), gemms
    assert any(l.startswith("GEMMS total width=64:256 ") for l in summary)
    assert (out_dir / "steps.log").stat().st_size > 0 and (out_dir / "logs.tar.gz").exists()
    # the table: header, separator, one row of 7 cells
    table = [l[len("TABLE "):] for l in summary if l.startswith("TABLE ")]
    assert table == (out_dir / "table.txt").read_text().splitlines()
    assert len(table) == 3
    cells = [[c.strip() for c in l.strip().strip("|").split("|")] for l in table]
    assert cells[0] == ["GPU", "olmoc tok/s, MFU", "OLMo-core tok/s, MFU", "ratio",
                        "attention TFLOP/s olmoc vs PyTorch best", "parity", "memory plan vs peak"]
    assert all(c == "---" for c in cells[1]) and len(cells[2]) == 7
    gpu, olmoc, core, ratio, attention, parity, memory = cells[2]
    assert gpu.startswith("cpu (dry run)")
    assert re.fullmatch(r"\d+, \d+\.\d%", olmoc), olmoc
    assert re.fullmatch(r"\d+, \d+\.\d% \(eager, torch\)", core), core
    assert abs(float(ratio.rstrip("x")) - float(olmoc.split(",")[0]) / float(core.split(",")[0])) < 0.01 + \
        0.01 * float(ratio.rstrip("x"))
    assert re.fullmatch(r"\S+ \(fwd \S+, bwd \S+\) vs math \S+ \(fwd \S+, bwd \S+\)", attention), attention
    assert parity == "parity-cuda-bf16 PASS"
    # bench_train's counted peak is what the plan says for that run (cpu-bf16: exact)
    assert re.fullmatch(r"\+0\.00% \(\S+ vs \S+ GiB\)", memory), memory
    assert p.returncode == 0, log[-4000:]
