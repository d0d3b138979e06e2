#!/usr/bin/env bash
# Builds the tuning harness (tune_main.cu) with only the sm80 backward of head dims 64 and 128, once per variant of
# the compile-time switches in src/cuda/sm80/mainloop_bwd.cuh (FLASHKV_TUNE_BWD_LOAD_AT, FLASHKV_TUNE_BWD_EPI), and
# optionally from a checkout of the previous release (its own harness and kernel), so that one device call times
# them in turn (bench/results/h200-2026-12-02-run8/call3..6/run.sh). sm_90a; ~20 s per variant on 2 cores.
#   bench/gpu/tune/build_bwd_variants.sh OUTDIR [--prev PREV_CHECKOUT] NAME="-DFLASHKV_TUNE_BWD_LOAD_AT=230100 ..." ...
#   e.g. build_bwd_variants.sh build/tune-carry --prev /tmp/prev88 n0="" m3="-DFLASHKV_TUNE_BWD_LOAD_AT=230200"
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
out=$1; shift
prev=""
if [[ ${1:-} == --prev ]]; then prev=$2; shift 2; fi
mkdir -p "$out/obj"
tu() {  # tu SRC_ROOT FILE: the variant translation unit (the two sm80 backward configurations)
  cat > "$2" <<CU
#include <cuda_bf16.h>
#include "cuda/sm80/bwd_launch.cuh"
#include "tune.hpp"
using namespace flashkv::cuda;
using namespace flashkv::cuda::sm80;
static tune::Register r64("sm80 hd64", 64, &run_bwd_cfg<BwdConfig<64, 128, 128, 8, 4, 4, 4>, __nv_bfloat16>);
static tune::Register r128("sm80 hd128", 128, &run_bwd_cfg<BwdConfig<128, 64, 128, 8, 4, 4, 2>, __nv_bfloat16>);
CU
}
build() {  # build SRC_ROOT NAME [flags...]
  local src=$1 name=$2; shift 2
  local f=(-std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -DFLASHKV_CUDA_SM90A=1 -I"$src/src" -I"$src/include"
           -I"$src/bench/gpu/tune")
  local o="$out/obj/$(echo "$src" | md5sum | cut -c1-8)"
  mkdir -p "$o"
  [[ -f $o/main.o ]] || nvcc "${f[@]}" -c "$src/bench/gpu/tune/tune_main.cu" -o "$o/main.o"
  [[ -f $o/util.o ]] || nvcc "${f[@]}" -c "$src/src/cuda/util_kernels.cu" -o "$o/util.o"
  [[ -f $o/error.o ]] || g++ -std=c++20 -O2 -I"$src/include" -c "$src/src/core/error.cpp" -o "$o/error.o"
  tu "$src" "$o/$name.cu"
  nvcc "${f[@]}" "$@" -c "$o/$name.cu" -o "$o/$name.o"
  nvcc "${f[@]}" "$o/$name.o" "$o/main.o" "$o/util.o" "$o/error.o" -o "$out/$name"
  echo "built $out/$name $*"
}
[[ -n $prev ]] && build "$prev" vprev
for spec in "$@"; do
  name=${spec%%=*} flags=${spec#*=}
  # shellcheck disable=SC2086
  build "$root" "$name" $flags
done
