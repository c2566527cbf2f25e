#!/usr/bin/env bash
# The test suite: C unit tests (Release and ASan+UBSan builds), then the
# PyTorch / transformers fidelity tests.  Run scripts/setup.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."

cmake --build build -j"$(nproc)" >/dev/null
cmake --build build-asan -j"$(nproc)" >/dev/null
echo "== C tests (Release)"
ctest --test-dir build --output-on-failure
echo "== C tests (ASan + UBSan)"
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure
echo "== Fuzzing (libFuzzer, ASan + UBSan; bounded: scripts/fuzz.sh --help)"
bash scripts/fuzz.sh --seconds "${OLMOC_FUZZ_SECONDS:-10}"
echo "== Python fidelity tests"
OLMOC_BUILD=build OLMOC_BUILD_ASAN=build-asan .venv/bin/python -m pytest -q tests/python -rs
