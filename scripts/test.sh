#!/usr/bin/env bash
# The test suite: C unit tests (Release and ASan+UBSan builds), then the
# PyTorch / transformers fidelity tests.  Run scripts/setup.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."
# each step's wall-clock time (and the total so far), printed when it ends; pytest's summary stays the last line
last=$SECONDS
took() { echo "   (took $((SECONDS - last)) s; $SECONDS s so far)"; last=$SECONDS; }
# ctest in BUILD with the given arguments, then each skipped test's reason (ctest shows output only on failure)
run_ctest() {
  local dir=$1 junit rc=0
  shift
  junit=$(mktemp)
  ctest --test-dir "$dir" -j2 --output-on-failure --output-junit "$junit" "$@" || rc=$?
  .venv/bin/python scripts/ctest_skips.py "$junit" || rc=1
  rm -f "$junit"
  return $rc
}

echo "== Layer check (includes only point down: docs/architecture.md)"
.venv/bin/python scripts/check_layers.py
took

cmake --build build -j"$(nproc)" >/dev/null
cmake --build build-asan -j"$(nproc)" >/dev/null
# two tests at a time: the emulated CUDA parity tests (the longest: 31-62 s Release, 56-159 s ASan) run on one thread
echo "== C tests (Release)"
run_ctest build
took
if [ -d build-clang ]; then
  # clang's build (OpenBLAS only, scripts/setup.sh): the op checks, bitwise vector-vs-scalar ones included
  cmake --build build-clang -j"$(nproc)" >/dev/null
  echo "== C op tests (clang, OpenBLAS-only build)"
  build-clang/tests/test_ops
else
  echo "== C op tests (clang): SKIPPED, no build-clang/ (scripts/setup.sh makes it when clang is installed)"
fi
took
echo "== C tests (ASan + UBSan)"
ASAN_OPTIONS=detect_leaks=1 run_ctest build-asan
took
echo "== Fuzzing (libFuzzer, ASan + UBSan; bounded: scripts/fuzz.sh --help)"
# a fixed seed and input count: the same inputs every run (scripts/fuzz.sh --help)
bash scripts/fuzz.sh --seed 1 --runs 20000 --seconds 60
took
echo "== Python fidelity tests"
# one worker per core, each module's tests on one worker (module fixtures built once): 643 -> 462 s on 2 cores
OLMOC_BUILD=build OLMOC_BUILD_ASAN=build-asan .venv/bin/python -m pytest -q tests/python -rs -n "$(nproc)" --dist loadscope
