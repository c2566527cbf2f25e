#!/usr/bin/env bash
# Runs every libFuzzer harness (tests/fuzz/fuzz_*.c) for a bounded time from the
# committed corpus (tests/fuzz/corpus/<target>/), with ASan + UBSan.
#   bash scripts/fuzz.sh [--seconds N] [--build-dir DIR] [TARGET ...]
# N seconds per target (default 10).  A crash, a sanitizer report, a leak, a
# timeout (10 s per input) or an input over 2 GiB of memory fails the run; the
# input that caused it is copied into tests/fuzz/corpus/<target>/ as crash-*, so
# it becomes a regression input of the default test suite (ctest fuzz_corpus_*)
# once the bug is fixed.  New coverage found is kept in a scratch directory,
# not in the committed corpus.  Needs clang with libFuzzer (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=10
build=build-fuzz
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --build-dir) build="$2"; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
case "$seconds" in ''|*[!0-9]*) echo "fuzz.sh: --seconds needs a whole number, got '$seconds'" >&2; exit 2 ;; esac
if [ ${#targets[@]} -eq 0 ]; then
  for f in tests/fuzz/fuzz_*.c; do t=$(basename "$f" .c); [ "$t" = fuzz_input ] || targets+=("${t#fuzz_}"); done
fi
command -v clang >/dev/null || { echo "fuzz.sh: clang not found (scripts/setup.sh installs it)" >&2; exit 1; }

CC=clang cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Debug -DOLMOC_SANITIZE=ON -DOLMOC_FUZZ=ON -DOLMOC_CUDA=OFF \
  -DOLMOC_CUDA_EMULATION_TEST=OFF -DOLMOC_ONEDNN=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target $(printf 'fuzz_%s ' "${targets[@]}") >/dev/null

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=0
for t in "${targets[@]}"; do
  seeds=tests/fuzz/corpus/$t
  mkdir -p "$scratch/$t/corpus" "$scratch/$t/artifacts"
  log=$scratch/$t/log
  # -fork would outlive one crash; one process is simpler to bound and to read
  if ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
     OMP_NUM_THREADS=1 "$build/tests/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
     -print_final_stats=1 -artifact_prefix="$scratch/$t/artifacts/" "$scratch/$t/corpus" "$seeds" >"$log" 2>&1; then
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    echo "fuzz $t: ok, ${execs:-?} inputs in ${seconds}s (${cov:-cov: ?})"
  else
    failed=1
    echo "fuzz $t: FAILED"
    grep -E "ERROR|SUMMARY|runtime error|#0 |#1 |#2 |#3 " "$log" | head -20 | sed 's/^/  /'
    for a in "$scratch/$t/artifacts"/*; do
      [ -f "$a" ] || continue
      cp "$a" "$seeds/crash-$(basename "$a" | sed 's/^[a-z-]*-//')"
      echo "  input kept as $seeds/crash-$(basename "$a" | sed 's/^[a-z-]*-//') (fix the bug, then commit it as a regression input)"
    done
  fi
done
exit $failed
