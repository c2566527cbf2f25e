#!/usr/bin/env bash
# The CUDA backend's checks that need a GPU, as named steps (step_NAME below):
#   facts          the device: GPU, memory (nvidia-smi), driver, CUDA, cuDNN and NCCL versions and the
#                  libraries' paths (cuDNN and NCCL: the ones PyTorch's wheel ships, found under its
#                  site-packages nvidia/ folders; put on LD_LIBRARY_PATH for the later steps)
#   build          cmake with CUDA (sm_90 = H100/H200 by default; CUDA_ARCH=80 for A100), unless
#                  --skip-build (a build made elsewhere: scripts/gpu_bundle.sh makes gpu-bundle/)
#   parity         every op and a few training steps of two tiny models on the CPU backend vs each
#                  CUDA variant, with the tolerances of tests/c/test_backend_parity.c, plus bitwise
#                  run-to-run reproducibility (OLMOC_CUDA_SYNC=1: a fault is reported at its op)
#   sanitize       (--sanitize) compute-sanitizer memcheck and racecheck on the quick parity test
#   cli            6 steps of configs/olmo3-1m-8k.yaml through `olmoc train` on cpu and on cuda (same
#                  losses within 1e-4) and `olmoc generate` on both (needs data/demo/validation.npy)
#   memplan        the memory plan (olmoc info --ranks 1, device memory from nvidia-smi) against the
#                  counted peak (OLMOC_MEMSTATS=1) and nvidia-smi's memory.used: 3 steps of
#                  configs/olmo3-1b.yaml per activation-checkpointing mode and fully sharded on one
#                  rank, whose losses must be the unsharded run's (needs data/demo/validation.npy)
#   bench          throughput of configs/olmo3-1b.yaml (seq_len 8192, one sequence per step): tokens/s,
#                  model TFLOP/s, MFU, then one step with every op timed (the per-op profile, GEMM and
#                  attention TFLOP/s); with --quick on cuda-bf16 only, and its counted peak is checked
#                  against the memory plan (the memplan step's check on the measured run itself)
#   gemms          PyTorch's cuBLAS on the projection GEMMs of the 1B and 7B widths (8192 tokens):
#                  separate q/k/v and gate/up GEMMs against one GEMM over stacked weights, and their
#                  TFLOP/s, the ceiling of the step's projections (bench/projection_gemms.py)
#   sdpa           PyTorch SDPA (cuDNN, flash, memory-efficient backends) forward + backward at the 1B's
#                  attention shape: the attention ceiling (bench/sdpa_ceiling.py)
#   anchor         OLMo-core 3.0.0 training its Olmo 3 1B on the same GPU, seq_len 8192, micro-batch 1,
#                  bf16 (bench/olmo_core_anchor.py; eager, then torch.compile): tokens/s and MFU counted
#                  as olmoc counts them; its wheels come from BUILD/wheels when it is not installed
#   table          GPU | olmoc tok/s, MFU | OLMo-core tok/s, MFU | ratio | attention TFLOP/s olmoc vs
#                  PyTorch's best | parity | memory plan vs peak
#
# usage: scripts/gpu_check.sh [--quick] [--dry-run] [--steps a,b,...] [--build-dir DIR] [--skip-build]
#                             [--bench-steps N] [--no-bench] [--sanitize]
#   (no flag)      the full check: facts build parity nccl1 sanitize cli memplan bench gemms table
#                  (about 8 minutes on an H200)
#   --quick        facts parity(cuda-bf16) nccl1 bench(cuda-bf16, + memory plan) gemms sdpa anchor table, within
#                  QUICK_BUDGET seconds (default 280): each step has its own time limit, the anchor
#                  (last) gets what is left; implies --skip-build
#   --steps LIST   these steps only, in this order (facts first: the later steps use what it finds)
#   --dry-run      no GPU: the same steps on this machine's CPU build (DIR default build): parity on the
#                  emulated CUDA backend (tests/test_backend_parity_emu), bench/memplan with
#                  configs/olmo3-1m-8k.yaml on cpu-bf16, the anchor and SDPA in their --tiny sizes
#   --skip-build   use the build in DIR (default build-gpu); DIR/env.sh is sourced when present
# environment: CUDA_ARCH (default 90), JOBS (default nproc), PYTHON (default python3, or .venv/bin/python),
#   OUT: summary.txt there gets every result line as it is produced (a stopped run keeps what it
#   measured), steps.log each step's output, table.txt the final table, logs.tar.gz all logs at the end.
# On a GPU machine where nothing can be installed: build machine `bash scripts/gpu_bundle.sh`, then on the
#   GPU machine (gpu-bundle/ carried along) `bash scripts/gpu_check.sh --quick --build-dir gpu-bundle`.
#   The device tool's command is in src/backend/cuda/README.md.
# Exit status: 0 when every step passed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

BUILD="" SKIP_BUILD=0 BENCH_STEPS=4 BENCH=1 SANITIZE=0 QUICK=0 DRY=${GPU_CHECK_DRY_RUN:-0} STEPS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) BUILD="$2"; shift 2 ;;
    --skip-build) SKIP_BUILD=1; shift ;;
    --bench-steps) BENCH_STEPS="$2"; shift 2 ;;
    --no-bench) BENCH=0; shift ;;
    --sanitize) SANITIZE=1; shift ;;
    --quick) QUICK=1; SKIP_BUILD=1; shift ;;
    --dry-run) DRY=1; shift ;;
    --steps) STEPS="$2"; shift 2 ;;
    -h|--help) sed -n '2,51p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown option $1" >&2; exit 2 ;;
  esac
done
[ "$DRY" = 1 ] && SKIP_BUILD=1
[ -n "$BUILD" ] || { [ "$DRY" = 1 ] && BUILD=build || BUILD=build-gpu; }
if [ -z "${PYTHON:-}" ]; then
  if [ "$DRY" = 1 ] && [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
if [ -z "$STEPS" ]; then
  if [ $QUICK -eq 1 ]; then STEPS="facts parity nccl1 bench gemms sdpa anchor table"
  elif [ $SKIP_BUILD -eq 1 ]; then STEPS="facts parity nccl1 sanitize cli memplan bench gemms table"
  else STEPS="facts build parity nccl1 sanitize cli memplan bench gemms table"; fi
fi
STEPS=${STEPS//,/ }

# What the steps run: the real sizes on a GPU, small ones on the CPU for --dry-run.
if [ "$DRY" = 1 ]; then
  PARITY_BIN="$BUILD/tests/test_backend_parity_emu" PARITY_VARIANTS="cuda-bf16" PARITY_ARGS=(--quick)
  BENCH_CFG=configs/olmo3-1m-8k.yaml BENCH_VARIANTS="cpu-bf16" PLAN_BACKEND=cpu-bf16
  ANCHOR_ARGS=(--tiny --device cpu --steps 1 --warmup 1) SDPA_ARGS=(--tiny) GEMMS_ARGS=(--tiny)
else
  PARITY_BIN="$BUILD/tests/test_backend_parity" PARITY_VARIANTS="cuda cuda-tf32 cuda-bf16 cuda-bf16-cublas"
  PARITY_ARGS=() BENCH_CFG=configs/olmo3-1b.yaml BENCH_VARIANTS="cuda-bf16 cuda-bf16-cublas cuda-tf32 cuda"
  PLAN_BACKEND=cuda-bf16 ANCHOR_ARGS=(--device cuda --steps 3 --warmup 1) SDPA_ARGS=() GEMMS_ARGS=()
fi
PARITY_LIMIT=300 BENCH_LIMIT=300
[ $QUICK -eq 1 ] && { PARITY_VARIANTS="cuda-bf16"; BENCH_VARIANTS="${BENCH_VARIANTS%% *}"; BENCH_STEPS=3; PARITY_LIMIT=90
                      BENCH_LIMIT=90; }
# the dry run's emulated parity takes minutes on a busy 2-core machine; its budget is not the device's
[ "$DRY" = 1 ] && { PARITY_LIMIT=600; QUICK_BUDGET=${QUICK_BUDGET:-1200}; }

LOGS=gpu_check_logs
rm -rf "$LOGS"
mkdir -p "$LOGS"
SUMMARY="$LOGS/summary.txt"
: >"$SUMMARY"
# Every result line goes to $OUT/summary.txt as it is produced, every step's output to $OUT/steps.log
# as it is written (the device tool's $OUT takes at most 8 files).
OUTD="${OUT:-}"
if [ -n "$OUTD" ]; then mkdir -p "$OUTD" && : >"$OUTD/summary.txt" && : >"$OUTD/steps.log" || OUTD=""; fi
finish() {
  [ -n "$OUTD" ] && tar -czf "$OUTD/logs.tar.gz" "$LOGS" 2>/dev/null
}
trap finish EXIT
status=0
T_START=$SECONDS
export PYTHONUNBUFFERED=1
STDBUF=()
command -v stdbuf >/dev/null && STDBUF=(stdbuf -oL -eL)
QUICK_BUDGET=${QUICK_BUDGET:-280}

note() {
  echo "$*" | tee -a "$SUMMARY"
  [ -z "$OUTD" ] || echo "$*" >>"$OUTD/summary.txt"
}
# note_lines: note each line of standard input
note_lines() {
  local line
  while read -r line; do note "$line"; done
}
# stage NAME LIMIT_SECONDS COMMAND...: runs with a time limit; output to $LOGS/NAME.log and $OUT/steps.log
stage() {
  local name="$1" limit="$2"; shift 2
  local t0=$SECONDS rc
  if [ "$limit" -le 0 ]; then
    note "SKIP  $name: the ${QUICK_BUDGET}s budget of --quick is spent"; status=1; return 124
  fi
  echo "== $name (limit ${limit}s): $*"
  [ -z "$OUTD" ] || echo "== $name (limit ${limit}s): $*" >>"$OUTD/steps.log"
  if [ -n "$OUTD" ]; then # line-buffered, so that a stopped run keeps each line printed
    timeout -k 10 "$limit" ${STDBUF[@]+"${STDBUF[@]}"} "$@" 2>&1 | tee "$LOGS/$name.log" >>"$OUTD/steps.log"
    rc=${PIPESTATUS[0]}
  else
    timeout -k 10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
    rc=$?
  fi
  tail -n 25 "$LOGS/$name.log"
  if [ $rc -eq 0 ]; then note "PASS  $name ($((SECONDS - t0))s)"
  elif [ $rc -eq 77 ]; then note "SKIP  $name (no usable CUDA device)"; status=1
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then note "FAIL  $name: timed out after ${limit}s"; status=1
  else note "FAIL  $name: exit $rc (log: $LOGS/$name.log)"; status=1
  fi
  return $rc
}
# limit SECONDS: SECONDS, or with --quick no more than what is left of QUICK_BUDGET; 0 (stage skips
# the step) when less than 20 seconds are left
limit() {
  local want=$1 left
  if [ $QUICK -eq 1 ]; then
    left=$((QUICK_BUDGET - (SECONDS - T_START)))
    [ $left -lt "$want" ] && want=$left
    [ "$want" -lt 20 ] && want=0
  fi
  echo "$want"
}

DEVICE_MEMORY="" GPU_NAME=""
step_facts() {
  echo "== facts"
  if nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,compute_cap --format=csv,noheader \
      >"$LOGS/device.txt" 2>&1; then
    IFS=, read -r GPU_NAME mem driver clock cap <"$LOGS/device.txt"
    GPU_NAME=$(echo "$GPU_NAME" | xargs) mem=$(echo "$mem" | tr -dc 0-9)
    DEVICE_MEMORY="${mem}MiB"
    note "INFO  device: $GPU_NAME | memory $mem MiB (nvidia-smi) | driver$driver | max SM clock$clock | sm$cap" \
      "| driver's CUDA $(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n1)"
  else
    note "INFO  device: nvidia-smi found no GPU ($(head -c 200 "$LOGS/device.txt" | tr '\n' ' '))"
    if [ "$DRY" != 1 ]; then note "FAIL  facts: no GPU visible"; status=1; return 1; fi
    GPU_NAME="cpu (dry run)"
    DEVICE_MEMORY="$(awk '/MemTotal/ { print $2 }' /proc/meminfo)KiB"
  fi
  command -v nvcc >/dev/null && note "INFO  nvcc: $(nvcc --version | grep -o 'release [0-9.]*, V[0-9.]*')"
  # PyTorch's view, and the cuDNN / NCCL its wheel ships (site-packages nvidia/*/lib)
  timeout 60 "$PYTHON" - >"$LOGS/facts-python.txt" 2>&1 <<'PY'
import glob, os, site, sys
dirs = [d for d in site.getsitepackages() + [site.getusersitepackages()] + sys.path if d and os.path.isdir(d)]
def find(pattern):
    for d in dict.fromkeys(dirs):
        hits = sorted(glob.glob(os.path.join(d, pattern)))
        if hits:
            return hits[-1]
    return ""
try:
    import torch
    cuda = torch.cuda.is_available()
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if cuda else "-"
    print(f"INFO  torch {torch.__version__} ({torch.__file__.rsplit('/', 2)[0]}) | its CUDA {torch.version.cuda} | "
          f"cuDNN {torch.backends.cudnn.version()} | NCCL {nccl} | GPU {torch.cuda.get_device_name(0) if cuda else '-'}")
except Exception as e:
    print(f"INFO  torch not importable: {e}")
for name, pattern in (("cudnn", "nvidia/cudnn/lib/libcudnn.so*"), ("nccl", "nvidia/nccl/lib/libnccl.so*"),
                      ("cudart", "nvidia/cuda_runtime/lib/libcudart.so*"), ("cublas", "nvidia/cublas/lib/libcublas.so*")):
    path = find(pattern)
    print(f"LIB {name} {path or '-'}")
PY
  grep '^INFO' "$LOGS/facts-python.txt" | note_lines
  local libdirs=""
  while read -r _ name path; do
    [ "$path" = - ] && continue
    note "INFO  $name library of PyTorch's wheel: $path"
    case "$name" in cudnn|nccl) libdirs="$libdirs:$(dirname "$path")" ;; esac
  done < <(grep '^LIB' "$LOGS/facts-python.txt")
  # cuDNN and NCCL for olmoc: the wheel's, found above (the device image's CUDA has neither)
  [ -n "$libdirs" ] && export LD_LIBRARY_PATH="${libdirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local bin="$BUILD/tests/bench_train"
  [ -x "$bin" ] && note "INFO  $bin loads: $(ldd "$bin" 2>/dev/null | grep -E 'cudart|cublas|cudnn|nccl|openblas' |
    awk '{ printf "%s%s => %s", sep, $1, $3; sep = ", " }')"
  return 0
}

step_build() {
  # Build prerequisites (scripts/setup.sh installs them; the device machine may be offline).
  local missing="" t m
  for t in cmake pkg-config nvcc; do command -v $t >/dev/null || missing="$missing $t"; done
  for m in yaml-0.1 libcjson openblas libxxhash; do pkg-config --exists $m 2>/dev/null || missing="$missing $m(pkg-config)"; done
  if [ -n "$missing" ]; then
    note "FAIL  build prerequisites missing:$missing (install them, or build elsewhere and use --skip-build)"
    return 1
  fi
  stage configure 180 cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DOLMOC_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DOLMOC_CUDA_EMULATION_TEST=OFF || return 1
  stage build 600 cmake --build "$BUILD" -j"${JOBS:-$(nproc)}"
}

step_parity() {
  [ -x "$PARITY_BIN" ] || { note "FAIL  parity: $PARITY_BIN is missing"; status=1; return 1; }
  local b
  for b in $PARITY_VARIANTS; do
    stage "parity-$b" "$(limit "$PARITY_LIMIT")" \
      env OLMOC_CUDA_SYNC=1 "$PARITY_BIN" "$b" "${PARITY_ARGS[@]}"
    grep -E "^FAIL" "$LOGS/parity-$b.log" | head -20 | note_lines
  done
  [ $QUICK -eq 1 ] || [ "$DRY" = 1 ] || stage parity-cpu-sanity 300 "$PARITY_BIN" cpu
}

step_sanitize() {
  [ $SANITIZE -eq 1 ] || return 0
  if command -v compute-sanitizer >/dev/null; then
    stage memcheck 600 compute-sanitizer --tool memcheck --error-exitcode 1 "$PARITY_BIN" cuda --quick
    stage racecheck 600 compute-sanitizer --tool racecheck --error-exitcode 1 "$PARITY_BIN" cuda --quick
  else
    note "SKIP  compute-sanitizer not found"
  fi
}

# compare_losses A B: the per-step training losses of two metrics.jsonl files agree within 1e-4.
compare_losses() {
  paste <(grep '"type":"train"' "$1" | sed 's/.*"loss":\([^,]*\),.*/\1/') \
        <(grep '"type":"train"' "$2" | sed 's/.*"loss":\([^,]*\),.*/\1/') |
    awk '{ d = $1 - $2; if (d < 0) d = -d; r = d / ($1 > 0 ? $1 : -$1); printf "step %d: %.8f %.8f rel %.2e\n", NR, $1, $2, r;
           if (r > worst) worst = r } END { printf "worst %.2e\n", worst; exit (NR == 0 || worst > 1e-4) }'
}

RUNS="${TMPDIR:-/tmp}/olmoc-gpu-check" # checkpoints stay out of the logs archive
step_cli() {
  [ "$DRY" = 1 ] && { note "SKIP  cli: compares cpu with cuda (no dry run)"; return 0; }
  if [ ! -f data/demo/validation.npy ]; then
    note "SKIP  cli: data/demo/validation.npy is missing (scripts/setup.sh builds it; carry it)"; return 0
  fi
  local b same
  rm -rf "$RUNS"
  for b in cpu cuda; do
    stage "cli-train-$b" 300 "$BUILD/olmoc" train configs/olmo3-1m-8k.yaml --backend "$b" --set train.steps=6 \
      --set train.eval_every=0 --set train.save_every=6 --set train.peak_flops=1e12 --set "data.out_dir=$RUNS/$b" \
      --set data.train_path=data/demo/validation.npy
    cp "$RUNS/$b/metrics.jsonl" "$LOGS/cli-$b-metrics.jsonl" 2>/dev/null
  done
  if compare_losses "$LOGS/cli-cpu-metrics.jsonl" "$LOGS/cli-cuda-metrics.jsonl" >"$LOGS/cli-compare.log" 2>&1; then
    note "PASS  cli-compare ($(tail -n1 "$LOGS/cli-compare.log"))"
  else
    note "FAIL  cli-compare: losses differ (log: $LOGS/cli-compare.log)"; status=1
  fi
  for b in cpu cuda; do
    stage "cli-generate-$b" 120 "$BUILD/olmoc" generate "$RUNS/cpu" --backend "$b" --ids 11,12,13,14,15 \
      --max-new-tokens 250 --ignore-eos # past the sliding window (128): the ring buffer wraps; 5 + 250 within seq_len 256
  done
  # After 6 steps the model's logits are nearly flat, so a rounding difference may flip a near-tie:
  # reported, not judged (the cached attention itself is judged by the parity stages).
  same=$(paste -d'\n' <(grep -m1 -E "^[0-9,]+$" "$LOGS/cli-generate-cpu.log" | tr , '\n') \
         <(grep -m1 -E "^[0-9,]+$" "$LOGS/cli-generate-cuda.log" | tr , '\n') | paste - - |
         awk '$1 != $2 { exit } { n++ } END { print n + 0 }')
  note "INFO  cli-generate: the first $same of 300 greedy tokens are the same on cpu and cuda"
}

# plan_check NAME LOG SETS...: the counted peak in LOG (an `olmoc memstats` line) against the plan of
# `olmoc info` for the same settings, and nvidia-smi's highest memory.used ($LOGS/NAME-smi.txt)
plan_check() {
  local name="$1" log="$2" measured planned need smi_mib; shift 2
  "$BUILD/olmoc" info "$BENCH_CFG" --ranks 1 --backend "$PLAN_BACKEND" --device-memory "$DEVICE_MEMORY" "$@" \
    >"$LOGS/$name-plan.txt" 2>&1
  measured=$(sed -n 's/.*olmoc memstats: .*| peak \([0-9]*\) bytes.*/\1/p' "$log" | head -n1)
  read -r _ _ _ _ _ planned _ need < <(grep -m1 "# plan bytes:" "$LOGS/$name-plan.txt" | tr -d '#')
  smi_mib=$(sort -n "$LOGS/$name-smi.txt" 2>/dev/null | tail -n1)
  if [ -n "$measured" ] && [ -n "$planned" ]; then
    note "INFO  $name: counted peak $measured B, plan $planned B ($(awk -v m="$measured" -v p="$planned" \
      'BEGIN { printf "%+.2f%%", 100 * (p - m) / m }')); nvidia-smi max ${smi_mib:-?} MiB used, plan need $need B" \
      "(device memory $DEVICE_MEMORY)"
  else
    note "FAIL  $name: no memstats line or no plan (logs: $log, $LOGS/$name-plan.txt)"; status=1
  fi
}
smi_start() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$LOGS/$1-smi.txt" 2>/dev/null & SMI=$!; }
smi_stop() { kill "$SMI" 2>/dev/null; wait "$SMI" 2>/dev/null; }

step_memplan() {
  if [ ! -f data/demo/validation.npy ]; then
    note "SKIP  memplan: data/demo/validation.npy is missing (scripts/setup.sh builds it; carry it)"; return 0
  fi
  local mode name ckpt rc
  for mode in none feed_forward block fsdp; do
    name="memplan-$mode"
    # fsdp: one rank fully sharded, no checkpointing: the block gathers run on the side stream (the
    # next block's gather overlaps this one's compute); its losses must be those of "none"
    ckpt=$mode
    local extra=()
    [ "$mode" = fsdp ] && ckpt=none extra=(--set train.sharding=fsdp)
    local sets=(--set train.steps=3 --set train.eval_every=0 --set train.save_every=0 --set train.peak_flops=1e15
          --set train.saved_activations=bf16 --set "train.activation_checkpointing=$ckpt" "${extra[@]}"
          --set data.train_path=data/demo/validation.npy --set "data.out_dir=$RUNS/memplan-$mode")
    rm -rf "$RUNS/memplan-$mode"
    smi_start "$name"
    stage "$name" 300 env OLMOC_MEMSTATS=1 "$BUILD/olmoc" train "$BENCH_CFG" --backend "$PLAN_BACKEND" "${sets[@]}"
    rc=$?
    smi_stop
    if [ $rc -ne 0 ] && grep -q "in this build" "$LOGS/$name.log"; then
      note "SKIP  $name: $(grep -m1 'in this build' "$LOGS/$name.log")"
      continue
    fi
    plan_check "$name" "$LOGS/$name.log" "${sets[@]}"
  done
  # the side stream's gathers give the same weights as gathering in place: same losses (1e-5 relative)
  if [ -f "$RUNS/memplan-none/metrics.jsonl" ] && [ -f "$RUNS/memplan-fsdp/metrics.jsonl" ]; then
    if "$PYTHON" - "$RUNS/memplan-none/metrics.jsonl" "$RUNS/memplan-fsdp/metrics.jsonl" <<'PY' | note_lines
import json, sys
def losses(p):
    return [r["loss"] for r in map(json.loads, open(p)) if r.get("type") == "train"]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
worst = max(abs(x - y) / max(abs(x), 1e-30) for x, y in zip(a, b)) if a and len(a) == len(b) else float("inf")
print(f"INFO  fsdp (side-stream gathers) vs unsharded, 3 steps of olmo3-1b: worst loss difference {worst:.2e}")
sys.exit(0 if worst <= 1e-5 else 1)
PY
    then note "PASS  memplan-fsdp losses match memplan-none"
    else note "FAIL  memplan-fsdp losses differ from memplan-none"; status=1
    fi
  fi
}

# one-rank NCCL (gpu_bundle.sh's olmoc-nccl):
# Fully sharded training on this one GPU with its all-gathers (main and side stream) and reduce-scatters
# (gradient stream) through one-rank NCCL communicators (OLMOC_FSDP_COMM=1) instead of skipped; the
# weights must be those of the run that skips the collectives, byte for byte.
step_nccl1() {
  local c
  if [ -x "$BUILD/olmoc-nccl" ]; then
    mkdir -p "$RUNS"
    # 64k tokens of the 8192-id vocabulary (data/ is not carried to the GPU machine)
    "$PYTHON" -c "import sys, numpy as np; np.save(sys.argv[1], (np.arange(65536) * 7919 % 8190 + 2).astype(np.uint16))" \
      "$RUNS/nccl1-tokens.npy" || { note "FAIL  nccl-one-rank: cannot write its token file"; status=1; return 0; }
    for c in 0 1; do
      rm -rf "$RUNS/nccl1-$c"
      stage "nccl-one-rank-$c" "$(limit 120)" env OLMOC_FSDP_COMM=$c "$BUILD/olmoc-nccl" train configs/olmo3-1m-8k.yaml \
        --backend cuda-bf16 --set train.sharding=fsdp --set train.steps=3 --set train.grad_accum=2 \
        --set train.eval_every=0 --set train.save_every=0 --set train.peak_flops=1e12 \
        --set "data.out_dir=$RUNS/nccl1-$c" --set "data.train_path=$RUNS/nccl1-tokens.npy" --set data.val_paths= \
        --set data.eval_tasks=
    done
    if grep -q "its collectives through NCCL" "$LOGS/nccl-one-rank-1.log" &&
      cmp -s "$RUNS/nccl1-0/model.safetensors" "$RUNS/nccl1-1/model.safetensors"; then
      note "PASS  nccl-one-rank: fsdp weights through one-rank NCCL equal the run without collectives"
    else note "FAIL  nccl-one-rank: no NCCL line or the weights differ (logs: $LOGS/nccl-one-rank-*.log)"; status=1
    fi
  else
    note "SKIP  nccl-one-rank: no $BUILD/olmoc-nccl (scripts/gpu_bundle.sh builds it)"
  fi
}

step_bench() {
  [ $BENCH -eq 1 ] || return 0
  local b steps
  for b in $BENCH_VARIANTS; do
    steps=$BENCH_STEPS
    [ "$b" = cuda ] && steps=2 # fp32 CUDA-core GEMMs: a few seconds per step
    smi_start "bench-$b"
    # OLMOC_MEMSTATS: the run's counted peak, checked against the plan below
    stage "bench-$b" "$(limit "$BENCH_LIMIT")" env OLMOC_MEMSTATS=1 \
      "$BUILD/tests/bench_train" "$BENCH_CFG" "$b" --quick-init --warmup 1 --steps "$steps" --profile-steps 1
    smi_stop
    # the per-op table and the GEMM / attention rates; the per-shape lines stay in the log
    grep -E "^(throughput|device|RESULT|profile: [a-z].*%|profile: (gemm|attention [bf]wd) [0-9])" "$LOGS/bench-$b.log" |
      note_lines
    # bench_train sets train.peak_flops itself (no start-up GEMM): the plan of that run
    [ "$b" = "$PLAN_BACKEND" ] && plan_check "memplan-bench-$b" "$LOGS/bench-$b.log" --set train.peak_flops=1e15
  done
}

step_gemms() {
  stage gemms "$(limit 40)" "$PYTHON" bench/projection_gemms.py ${GEMMS_ARGS[@]+"${GEMMS_ARGS[@]}"}
  grep -E "^(gemms:|GEMMS )" "$LOGS/gemms.log" | note_lines
}

step_sdpa() {
  stage sdpa "$(limit 40)" "$PYTHON" bench/sdpa_ceiling.py "${SDPA_ARGS[@]}"
  grep -E "^(sdpa:|SDPA )" "$LOGS/sdpa.log" | note_lines
}

step_anchor() {
  # OLMo-core from BUILD/wheels (gpu_bundle.sh) when this Python lacks it
  if ! "$PYTHON" -c "import olmo_core" 2>/dev/null; then
    if ls "$BUILD"/wheels/*.whl >/dev/null 2>&1; then
      local site="${TMPDIR:-/tmp}/olmoc-gpu-check-site"
      rm -rf "$site"
      if "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
          "$BUILD"/wheels/*.whl >"$LOGS/anchor-pip.log" 2>&1; then
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
        note "INFO  anchor: installed $(cd "$BUILD/wheels" && ls *.whl | tr '\n' ' ')into $site"
      else
        note "FAIL  anchor: pip could not install $BUILD/wheels (log: $LOGS/anchor-pip.log)"; status=1; return 1
      fi
    else
      note "FAIL  anchor: olmo_core is not importable and $BUILD/wheels has no wheels (scripts/gpu_bundle.sh)"
      status=1; return 1
    fi
  fi
  # each result line lands in $OUT/summary.txt as the anchor prints it (--out), a stopped run keeps them
  local out_args=()
  [ -n "$OUTD" ] && out_args=(--out "$OUTD/summary.txt")
  stage anchor "$(limit 240)" "$PYTHON" bench/olmo_core_anchor.py "${ANCHOR_ARGS[@]}" \
    "${out_args[@]}"
  grep -E "^(anchor:|ANCHOR )" "$LOGS/anchor.log" | while read -r line; do echo "$line" >>"$SUMMARY"; done
}

step_table() {
  "$PYTHON" - "$LOGS" "$GPU_NAME" "$DEVICE_MEMORY" "$PLAN_BACKEND" >"$LOGS/table.txt" <<'PY'
import pathlib, re, sys
logs, gpu, mem, plan_backend = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
def read(name):
    p = logs / name
    return p.read_text(errors="replace") if p.exists() else ""
def kv(text, prefix):
    lines = [l for l in text.splitlines() if l.startswith(prefix)]
    return dict(re.findall(r"(\w+)=(\S+)", lines[-1])) if lines else {}
summary = read("summary.txt")
bench = read(f"bench-{plan_backend}.log")
r = kv(bench, "RESULT")
olmoc = f"{float(r['tokens_per_s']):.0f}, {100 * float(r['mfu_bf16_peak']):.1f}%" if r else "-"
anchor_text = read("anchor.log")
a = kv(anchor_text, "ANCHOR mode=compiled") or kv(anchor_text, "ANCHOR mode=eager")
core = f"{float(a['tokens_per_s']):.0f}, {100 * float(a['mfu']):.1f}% ({a['mode']}, {a['attention']})" if a else "-"
ratio = f"{float(r['tokens_per_s']) / float(a['tokens_per_s']):.2f}x" if r and a else "-"
# olmoc's attention: the profile's fwd and bwd rates over their model FLOPs, combined
att = {m[0]: (float(m[1]), float(m[2])) for m in re.findall(r"profile: attention (fwd|bwd) ([0-9.]+) GFLOP/s over ([0-9.e+]+)", bench)}
olmoc_att = "-"
if "fwd" in att and "bwd" in att:
    (rf, ff), (rb, fb) = att["fwd"], att["bwd"]
    olmoc_att = f"{(ff + fb) / (ff / rf + fb / rb) / 1e3:.1f} (fwd {rf / 1e3:.1f}, bwd {rb / 1e3:.1f})"
s = kv(read("sdpa.log"), "SDPA best=")
torch_att = f"{s['best']} {float(s['fwd_bwd_tflops']):.1f} (fwd {float(s['fwd_tflops']):.1f}, bwd {float(s['bwd_tflops']):.1f})" if s else "-"
par = re.findall(r"^(PASS|FAIL|SKIP)  (parity-[\w-]+)", summary, re.M)
parity = ", ".join(f"{n} {v}" for v, n in par) or "-"
m = re.findall(r"INFO  memplan-bench-\S+: counted peak (\d+) B, plan (\d+) B \(([-+0-9.]+%)\)", summary) or \
    re.findall(r"INFO  memplan-none: counted peak (\d+) B, plan (\d+) B \(([-+0-9.]+%)\)", summary)
memory = f"{m[-1][2]} ({int(m[-1][1]) / 2**30:.2f} vs {int(m[-1][0]) / 2**30:.2f} GiB)" if m else "-"
head = ["GPU", "olmoc tok/s, MFU", "OLMo-core tok/s, MFU", "ratio", "attention TFLOP/s olmoc vs PyTorch best",
        "parity", "memory plan vs peak"]
row = [f"{gpu} ({mem})", olmoc, core, ratio, f"{olmoc_att} vs {torch_att}", parity, memory]
print("| " + " | ".join(head) + " |")
print("|" + "|".join(" --- " for _ in head) + "|")
print("| " + " | ".join(c.replace("|", "/") for c in row) + " |")
PY
  local rc=$?
  echo "== table"
  cat "$LOGS/table.txt"
  [ -z "$OUTD" ] || cp "$LOGS/table.txt" "$OUTD/table.txt"
  sed 's/^/TABLE /' "$LOGS/table.txt" | note_lines
  return $rc
}

if [ -f "$BUILD/env.sh" ]; then
  # shellcheck disable=SC1091
  source "$BUILD/env.sh"
fi
note "INFO  gpu_check: steps $STEPS | build $BUILD$([ $QUICK -eq 1 ] && echo " | quick, ${QUICK_BUDGET}s budget")$([ "$DRY" = 1 ] && echo " | dry run")"
for s in $STEPS; do
  if ! declare -F "step_$s" >/dev/null; then note "FAIL  unknown step $s"; status=1; continue; fi
  "step_$s"
  rc=$?
  # without a device or a build, the later steps have nothing to run on
  if [ $rc -ne 0 ] && { [ "$s" = facts ] || [ "$s" = build ]; }; then status=1; break; fi
done
note "INFO  gpu_check: done in $((SECONDS - T_START))s, status $status"
exit $status
