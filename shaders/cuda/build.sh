#!/usr/bin/env bash
# Compiles the CUDA kernels (shaders/cuda/infer.cu) into one fatbin that lib/cuda loads at run
# time: SASS for sm_90 (H100/H200) plus compute_90 PTX. Needs nvcc (CUDA 12.4+).
#   shaders/cuda/build.sh [OUT]      default OUT: zig-out/lib/infer.fatbin (beside libinfer.so)
# CUDA_ARCHS adds targets, e.g. CUDA_ARCHS="80 89 90" for A100, L4/RTX 40xx and H100/H200.
# The library finds the file through INFER_CUDA_KERNELS or beside libinfer.so.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$root/zig-out/lib/infer.fatbin}"
mkdir -p "$(dirname "$out")"
gencode=()
for arch in ${CUDA_ARCHS:-90}; do
  gencode+=(-gencode "arch=compute_${arch},code=[sm_${arch},compute_${arch}]")
done
# -fmad=false: a*b+c rounds twice, as the Zig CPU kernels do (explicit __fmaf_rn where they fuse).
nvcc -O3 -std=c++17 -fmad=false ${NVCC_FLAGS:-} "${gencode[@]}" -fatbin -o "$out" "$here/infer.cu"
echo "$out"
