#!/usr/bin/env bash
# Set-up + the main job: builds olmoc, makes the demo token data (the Python
# documentation, tokenized with the Olmo 3 tokenizer, dolma2), and trains the
# ~1M-parameter (non-embedding) Olmo 3 config on it, with in-loop evaluation
# every 100 steps: validation loss and OLMo-eval's real arc_easy_rc_0shot task
# (570 questions, 2281 requests, tokenized with dolma2).
#
# Every run writes to a fresh run directory, runs/olmo3-1m-YYYYmmdd-HHMMSS,
# so the demo can be run again and again; the script prints it and, if the
# run stops early, how to continue it (olmoc train ... --resume).
#
# usage: scripts/demo.sh [--no-setup] [--runs-dir DIR] [OLMOC TRAIN ARGS...]
#   --no-setup      skip scripts/setup.sh (packages, venv, builds): build/olmoc must exist
#   --runs-dir DIR  where the run directory is made (default: runs)
#   the rest goes to `olmoc train`, e.g. --set train.steps=50
# environment: OLMOC_BUILD, the build directory with olmoc (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
setup=1
runs_dir=runs
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    --no-setup) setup=0; shift ;;
    --runs-dir) [ $# -ge 2 ] || { echo "demo.sh: --runs-dir needs a directory" >&2; exit 2; }
                runs_dir=$2; shift 2 ;;
    *) break ;;
  esac
done
build=${OLMOC_BUILD:-build}
if [ "$setup" = 1 ]; then
  bash scripts/setup.sh
fi
if [ ! -f data/demo/train.dolma2.npy ]; then
  .venv/bin/python scripts/make_demo_data.py --out data/demo
fi
run_dir="$runs_dir/olmo3-1m-$(date +%Y%m%d-%H%M%S)"
n=1
while [ -e "$run_dir" ]; do  # two runs in the same second
  n=$((n + 1))
  run_dir="$runs_dir/olmo3-1m-$(date +%Y%m%d-%H%M%S)-$n"
done
echo "demo: run directory $run_dir (a fresh one for every run of the demo)"
start=$(date +%s)
status=0
"$build/olmoc" train configs/olmo3-1m.yaml --set "data.out_dir=$run_dir" "$@" || status=$?
echo "demo: $(( $(date +%s) - start )) s in olmoc train; run directory $run_dir"
if [ "$status" -ne 0 ]; then
  echo "demo: olmoc train failed (exit $status); continue it with:" \
    "$build/olmoc train configs/olmo3-1m.yaml --set data.out_dir=$run_dir --resume $*" >&2
fi
exit "$status"
