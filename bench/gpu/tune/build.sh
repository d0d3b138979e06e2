#!/usr/bin/env bash
# Builds the kernel tuning harness (one translation unit per variant group, compiled in parallel) into $1.
#   bench/gpu/tune/build.sh OUTDIR [nvcc flags...]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../../.."
out="$1"; shift || true
mkdir -p "$out"
flags=(-std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -DFLASHKV_CUDA_SM90A=1 -I"$root/src" -I"$root/include" "$@")
pids=()
for f in "$here"/tune_*.cu "$root/src/cuda/util_kernels.cu"; do
  nvcc "${flags[@]}" -c "$f" -o "$out/$(basename "$f" .cu).o" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
g++ -std=c++20 -O2 -I"$root/include" -c "$root/src/core/error.cpp" -o "$out/error.o"
nvcc "${flags[@]}" "$out"/tune_*.o "$out/util_kernels.o" "$out/error.o" -o "$out/tune_kernels"
echo "built $out/tune_kernels"
