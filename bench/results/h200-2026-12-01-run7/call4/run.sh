#!/usr/bin/env bash
# run7 call 4 (same build as call 3): the quantized decode grid (issue 12: branch quant-decode's loop) with the L2
# prefetch on (default) and off, the 128k column, the rotated-pages decode tests, the FP8 variant set re-checked with
# the harness's hardware-accumulation lse rule (issue 15), then the engine benchmark (issue 14: with CUDA graphs).
set -u
[[ -x build/cuda/bin/flashkv ]] || tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
source <(sed -n '/^find_cublas() {/,/^}/p' scripts/gpu-run); find_cublas
O=/tmp/o4; mkdir -p $O/grid $O/grid-nopf $O/128k $O/v3; date -u > $O/date.txt; nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
B="python3 bench/gpu/bench_decode_quant.py --binary build/cuda/bin/flashkv_bench_decode_quant"
timeout 100 $B --out $O/grid > $O/grid.log 2>&1
FLASHKV_DECODE_L2_PREFETCH=0 timeout 100 $B --out $O/grid-nopf --no-cudnn > $O/grid-nopf.log 2>&1
timeout 60 $B --out $O/128k --batches 1,16 --contexts 131072 --calls 10 > $O/128k.log 2>&1
timeout 60 build/cuda/bin/flashkv_cuda_tests --gtest_filter='*Rotat*:*Hadamard*:CudaQuantKVCache.*Unsupported*' > $O/rot-tests.log 2>&1
date -u >> $O/date.txt
OUT=$O/v3 V3_FAMILIES=fp8 V3_TUS="v3_api.cu v3_fp8_*.cu" V3_NCU= V3_TIMEOUT=150 timeout 170 bench/gpu/v3/run.sh build/carry-fp8/libv3.so --passes 2 > $O/v3.log 2>&1
date -u >> $O/date.txt
tar -czf $OUT/part1.tgz -C $O .
OUT=$O/eb FLASHKV_ENGINE_BENCH_TIMEOUT=300 timeout 310 scripts/gpu-run engine-bench > $O/engine-bench-run.log 2>&1
date -u >> $O/date.txt
tar -czf $OUT/all.tgz -C $O .
grep -h "PASSED\|FAILED \]" $O/rot-tests.log; grep -E "^correctness|^FAIL" $O/v3/harness.log | cut -c1-200 | head; cat $O/date.txt
