#!/usr/bin/env bash
# Builds, on this machine, what scripts/gpu_check.sh runs on a GPU machine that
# has the CUDA toolkit but not our Debian libraries (a machine where nothing can
# be installed):
#   gpu-bundle/           olmoc, tests/test_backend_parity and tests/bench_train built for
#                         sm_90 (H100/H200) in build-gpu/, without MPI or the CUDA emulation,
#                         for any x86-64-v3 processor (no -march=native); the CPU backend
#                         uses OpenBLAS there (oneDNN's 38 MB would not fit the carry limit)
#   gpu-bundle/lib/       the shared libraries they need that a CUDA image may lack
#                         (OpenBLAS, libyaml, cJSON, PCRE2, libgomp, libgfortran, ...);
#                         the C library, libstdc++ and CUDA's own libraries come from there
#   gpu-bundle/olmoc-nccl olmoc again with NCCL (no MPI: one rank), in build-gpu-nccl/: gpu_check.sh
#                         trains fully sharded through one-rank NCCL communicators with it
#                         (OLMOC_FSDP_COMM=1); libnccl itself (~210 MB) is not carried: PyTorch's
#                         wheel on the GPU machine has it (nvidia/nccl/lib)
#   gpu-bundle/env.sh     puts gpu-bundle/lib (and PyTorch's NCCL, when found) on LD_LIBRARY_PATH
#                         (gpu_check.sh sources it)
# Then carry gpu-bundle (and data/demo/validation.npy for the CLI stages) and run
#   bash scripts/gpu_check.sh --skip-build --build-dir gpu-bundle
# usage: scripts/gpu_bundle.sh [--arch 90]
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=90
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) ARCH="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
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

# Libraries the device image provides itself: glibc, the C++ runtime, CUDA's.
provided='^(linux-vdso|ld-linux|libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.'
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
echo "gpu_bundle: $BUILD/ holds $(du -sh "$BUILD" | cut -f1); libraries: $(ls "$BUILD/lib" | tr '\n' ' ')"
