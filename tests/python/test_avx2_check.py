"""bench/avx2_check.py reads test_attention's and peak_gemm's output: it must find every
benched shape in each round, give a verdict that agrees with its figures, and say clearly
what is missing.  One small shape (OLMOC_BENCH_SHAPE) and no training, so this takes seconds;
the full check is the documented command (bench/avx2_check.py's docstring)."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "avx2_check.py"


sys.path.insert(0, str(ROOT / "bench"))
from bench_train import lscpu  # noqa: E402  (the flags as the script reads them)

FLAGS = set(lscpu().get("Flags", "").split())


def cpu_has(flag):
    return flag in FLAGS


def run(args, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, str(SCRIPT)] + args, capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)


@pytest.mark.skipif(not (cpu_has("avx2") and cpu_has("fma")), reason="the AVX2 kernels need a processor with AVX2+FMA")
def test_rounds_and_verdicts(build_dir):
    for exe in (build_dir / "peak_gemm", build_dir / "tests" / "test_attention"):
        if not exe.exists():
            pytest.fail(f"{exe} is not built (OLMOC_BENCH=ON builds peak_gemm)")
    p = run(["--build", str(build_dir), "--skip-train", "--rounds", "2", "--peak-seconds", "0.2"],
            {"OLMOC_BENCH_SHAPE": "1,256,2,64,0"})
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert len(re.findall(r"^# round \d/2: peak [\d.]+ before, [\d.]+ after; D=64 w=0: fwd \d+% bwd \d+%$",
                          out, re.M)) == 2, out
    forced = cpu_has("avx512f")
    assert ("AVX2 paths FORCED" in out) == forced, out
    rows = re.findall(r"^\| attention (forward|backward) >= 60% of peak, head_dim 64, full \| "
                      r"([\d.]+)(?:-([\d.]+))?% \| (met|not met|met in 1 of 2) \|$", out, re.M)
    assert [r[0] for r in rows] == ["forward", "backward"], out
    for _, lo, hi, verdict in rows:
        lo, hi = float(lo), float(hi or lo)
        assert 0 < lo <= hi < 200, out
        if verdict == "met":
            assert lo >= 59.95, out
        elif verdict == "not met":
            assert hi < 60.05, out
        else:
            assert lo < 60.05 and hi >= 59.95, out


def test_missing_build_is_a_clear_error(tmp_path):
    p = run(["--build", str(tmp_path / "nowhere"), "--skip-train"])
    assert p.returncode != 0
    assert "is missing" in p.stderr and "cmake --build" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr, p.stderr


def test_rounds_must_be_positive():
    p = run(["--rounds", "0"])
    assert p.returncode == 2 and "--rounds must be at least 1" in p.stderr, p.stderr
