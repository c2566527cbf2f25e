"""attn_exp8's polynomial (src/backend/cpu/cpu_simd.h) is the one scripts/fit_exp_poly.py fits:
the script runs here and its float32 coefficients must appear, in Horner order, as the literals of
attn_exp8; the fit's relative error must stay under 1e-7 (the function's 2.01 ulp is checked in
C by test_ops)."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_attn_exp8_coefficients_are_the_fit():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "fit_exp_poly.py")], capture_output=True,
                         text=True, check=True).stdout
    fitted = [float(m) for m in re.findall(r"^c[1-5] = ([0-9.e+-]+)f$", out, re.M)]
    assert len(fitted) == 5, out
    err = float(re.search(r"max relative error of the fit: ([0-9.e+-]+)", out).group(1))
    assert err < 1e-7, out

    src = (ROOT / "src" / "backend" / "cpu" / "cpu_simd.h").read_text()
    body = src[src.index("static inline __m256 attn_exp8(__m256 x)"):]
    body = body[:body.index("\n}\n")]
    # the polynomial's literals in order: its first set1 (c5), then each fmadd's constant down to c0 = 1
    start = body.index("__m256 p = _mm256_set1_ps(")
    used = [float(m) for m in re.findall(r"_mm256_set1_ps\(([0-9.e+-]+)f\)", body[start:])]
    assert used[-1] == 1.0, used
    assert used[:-1] == fitted, (used, fitted)
