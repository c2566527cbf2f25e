import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# On a shared, oversubscribed machine OpenMP threads that spin while waiting
# make tiny runs 10-50x slower; sleeping waits change no result, only timing.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")
sys.path.insert(0, str(pathlib.Path(__file__).parent))


@pytest.fixture(scope="session")
def build_dir():
    d = pathlib.Path(os.environ.get("OLMOC_BUILD", ROOT / "build"))
    if not (d / "olmoc").exists():
        pytest.fail(f"olmoc is not built in {d} (set OLMOC_BUILD or run cmake --build build)")
    return d
