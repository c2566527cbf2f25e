#!/usr/bin/env bash
# The test suite.  Run scripts/setup.sh first (it builds build/ and build-asan/).
#   scripts/test.sh           the full suite, what CI runs (.ci/run): the layer check, the C tests on the
#                             Release, clang and ASan+UBSan builds, bounded fuzzing, every Python test
#   scripts/test.sh --quick   before a commit (a few minutes on 2 cores): the layer check, the C tests
#                             labelled quick on the Release build (ctest -L quick), the Python tests not
#                             marked slow (pytest -m "not slow"); no sanitizer build, clang build or fuzzing
#   scripts/test.sh --help    this text
# Every skipped test prints why: pytest's -rs, and for ctest each skipped test's "SKIP:" line
# (scripts/ctest_skips.py).  One test: docs/testing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
case "${1:-}" in
  "") ;;
  --quick) quick=1 ;;
  -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "test.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac
[ $# -le 1 ] || { echo "test.sh: one argument at most (see --help)" >&2; exit 2; }
[ -d build ] || { echo "test.sh: no build/ here: run scripts/setup.sh first" >&2; exit 1; }
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

if [ $quick = 1 ]; then
  cmake --build build -j"$(nproc)" >/dev/null
  echo "== C tests (Release, label quick; ctest -L slow lists the others)"
  run_ctest build -L quick
  took
  echo "== Python tests (not marked slow)"
  OLMOC_BUILD=build .venv/bin/python -m pytest -q tests/python -rs -m "not slow" -n "$(nproc)" --dist loadscope
  exit 0
fi

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
