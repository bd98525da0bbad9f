#!/usr/bin/env bash
# Regenerates mneme/data/compare.ptx (the GPU compare kernels, shipped as package data) from
# native/core/compare.cu with clang++-22; run it after editing compare.cu (`make ptx`).
# PTX ISA 7.8 for sm_70, so that any CUDA 12 driver JITs it for any Volta-or-newer GPU; no FMA
# contraction, so that every bound and sum rounds as in mn_compare_ex on the host.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
CLANG="${CLANG:-clang++-22}"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
ARCH="${PTX_ARCH:-sm_70}"
ISA="${PTX_ISA:-78}"
shim="$(mktemp -d)"
trap 'rm -rf "$shim"' EXIT
touch "$shim/curand_mtgp32_kernel.h"   # clang's CUDA wrapper includes it; this CUDA root lacks curand
mkdir -p "$root/mneme/data"
"$CLANG" -x cuda --cuda-device-only -S --cuda-gpu-arch="$ARCH" -O3 -ffp-contract=off \
  --cuda-path="$CUDA_HOME" -Wno-unknown-cuda-version -I"$shim" -Wall -Wextra -Werror \
  -Xclang -target-feature -Xclang "-ptx88" -Xclang -target-feature -Xclang "+ptx$ISA" \
  -o "$root/mneme/data/compare.ptx" "$here/compare.cu"
echo "wrote $root/mneme/data/compare.ptx"
