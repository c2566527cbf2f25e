#!/usr/bin/env bash
# Builds, on this machine, what scripts/gpu_check.sh runs on a GPU machine that
# has the CUDA toolkit and PyTorch but not our Debian libraries, and no package
# registry (a machine where nothing can be installed):
#   gpu-bundle/           olmoc, tests/test_backend_parity and tests/bench_train built for
#                         sm_90 (H100/H200) in build-gpu/, without MPI or the CUDA emulation,
#                         for any x86-64-v3 processor (no -march=native); the CPU backend
#                         uses OpenBLAS there (oneDNN's 38 MB would not fit the carry limit)
#   gpu-bundle/lib/       the shared libraries they need that a CUDA image may lack
#                         (OpenBLAS, libyaml, cJSON, PCRE2, libgomp, libgfortran, ...);
#                         the C library, libstdc++ and CUDA's own libraries come from there
#                         (cuDNN and NCCL from PyTorch's wheel: gpu_check.sh finds them)
#   gpu-bundle/olmoc-nccl olmoc again with NCCL (no MPI: one rank), in build-gpu-nccl/: gpu_check.sh
#                         trains fully sharded through one-rank NCCL communicators with it
#                         (OLMOC_FSDP_COMM=1); libnccl itself (~210 MB) is not carried: PyTorch's
#                         wheel on the GPU machine has it (nvidia/nccl/lib)
#   gpu-bundle/wheels/    the anchor's Python packages that the device's PyTorch image lacks:
#                         ai2-olmo-core 3.0.0 and the small pure-Python packages it imports
#                         (dataclass-extensions, bettermap, dill); gpu_check.sh installs them
#                         there with pip --no-index (bench/olmo_core_anchor.py stands in for
#                         cached_path, which pulls in cloud clients and is only used for remote files)
#   gpu-bundle/env.sh     puts gpu-bundle/lib (and PyTorch's NCCL, when found) on LD_LIBRARY_PATH
#                         (gpu_check.sh sources it)
# The wheels are downloaded once (pip download, into build-gpu/wheels) and reused.
# Everything the device tool sends along (the working tree and the bundle) must stay
# within 64 MiB: the script prints both sizes and fails above 63 MiB.
# Then carry gpu-bundle and run
#   bash scripts/gpu_check.sh --quick --build-dir gpu-bundle
# usage: scripts/gpu_bundle.sh [--arch 90] [--no-wheels]
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=90
WHEELS=1
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) ARCH="$2"; shift 2 ;;
    --no-wheels) WHEELS=0; shift ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "gpu_bundle: unknown option $1" >&2; exit 2 ;;
  esac
done
command -v nvcc >/dev/null || { echo "gpu_bundle: nvcc not found" >&2; exit 1; }

cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DOLMOC_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
  -DOLMOC_CUDA_EMULATION_TEST=OFF -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON -DOLMOC_BENCH=OFF -DOLMOC_MARCH=x86-64-v3 \
  -DOLMOC_ONEDNN=OFF \
  >/dev/null
cmake --build build-gpu -j"$(nproc)" --target olmoc test_backend_parity bench_train
# the one-rank NCCL build (olmoc-nccl): the same with NCCL linked, so one GPU runs the collectives
cmake -S . -B build-gpu-nccl -DCMAKE_BUILD_TYPE=Release -DOLMOC_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
  -DOLMOC_CUDA_EMULATION_TEST=OFF -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON -DOLMOC_BENCH=OFF -DOLMOC_MARCH=x86-64-v3 \
  -DOLMOC_ONEDNN=OFF -DOLMOC_NCCL_WITHOUT_MPI=ON \
  >/dev/null
cmake --build build-gpu-nccl -j"$(nproc)" --target olmoc
BUILD=gpu-bundle
rm -rf "$BUILD"
mkdir -p "$BUILD/tests" "$BUILD/lib"
cp build-gpu/olmoc "$BUILD/"
cp build-gpu-nccl/olmoc "$BUILD/olmoc-nccl"
cp build-gpu/tests/test_backend_parity build-gpu/tests/bench_train "$BUILD/tests/"
BINS="$BUILD/olmoc $BUILD/olmoc-nccl $BUILD/tests/test_backend_parity $BUILD/tests/bench_train"

# Libraries the device image provides itself: glibc, the C++ runtime, CUDA's; cuDNN and NCCL come from
# PyTorch's wheel there (gpu_check.sh's facts step puts them on LD_LIBRARY_PATH).
provided='^(linux-vdso|ld-linux|libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl|libcudnn(_[a-z_]+)?)\.'
for bin in $BINS; do
  ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
  if ! echo "$name" | grep -Eq "$provided"; then cp -L "$path" "$BUILD/lib/$name"; fi
done
cat >"$BUILD/env.sh" <<'EOF'
# Sourced by scripts/gpu_check.sh: the bundled libraries first, then CUDA's.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
# olmoc-nccl's libnccl.so.2: PyTorch's (the nvidia-nccl wheel), where python3 finds it
nccl_lib=$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null) &&
  [ -d "$nccl_lib" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$nccl_lib"
EOF

# The anchor's wheels (pure Python: one wheel serves any Python 3).
if [ $WHEELS -eq 1 ]; then
  PY=python3
  [ -x .venv/bin/python ] && PY=.venv/bin/python
  mkdir -p build-gpu/wheels "$BUILD/wheels"
  for w in ai2-olmo-core==3.0.0 dataclass-extensions==0.5.0 bettermap==1.3.1 dill==0.3.8; do
    file=$(echo "${w%%==*}" | tr - _)-"${w##*==}"-py3-none-any.whl
    if [ ! -f "build-gpu/wheels/$file" ]; then
      "$PY" -m pip download -q --no-deps --only-binary=:all: -d build-gpu/wheels "$w" ||
        { echo "gpu_bundle: pip could not download $w (or run with --no-wheels: no OLMo-core anchor)" >&2; exit 1; }
    fi
    [ -f "build-gpu/wheels/$file" ] || { echo "gpu_bundle: expected build-gpu/wheels/$file" >&2; exit 1; }
    cp "build-gpu/wheels/$file" "$BUILD/wheels/"
  done
fi
kib=$(du -sk "$BUILD" | cut -f1)
echo "gpu_bundle: $BUILD/ holds $((kib / 1024)) MiB ($kib KiB); libraries: $(ls "$BUILD/lib" | tr '\n' ' ')"
[ $WHEELS -eq 1 ] && echo "gpu_bundle: wheels ($(du -sk "$BUILD/wheels" | cut -f1) KiB): $(ls "$BUILD/wheels" | tr '\n' ' ')"
# What the device tool sends: the working tree (tracked and untracked-not-ignored files) and the carried
# bundle, at most 64 MiB; 1 MiB is kept for data/demo/validation.npy (the full check's CLI steps).
tree_kib=$({ git ls-files -z; git ls-files -z -o --exclude-standard; } | du -ck --files0-from=- 2>/dev/null |
  tail -n1 | cut -f1)
echo "gpu_bundle: with the working tree ($tree_kib KiB) $(((kib + tree_kib) / 1024)) MiB are sent, of at most 64"
if [ $((kib + tree_kib)) -gt $((63 * 1024)) ]; then
  echo "gpu_bundle: over 63 MiB: the device tool would refuse it" >&2
  exit 1
fi
