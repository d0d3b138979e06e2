#!/usr/bin/env bash
# run10 call 6: the final tree (the 16-bit append kernels' slot lookup shared in decode_append.hpp, append16_slot):
# the append, decode, device-cache and CUDA engine tests.
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs
source <(sed -n '/^find_cublas() {/,/^}/p' scripts/gpu-run); find_cublas
O=/tmp/o6; mkdir -p $O; date -u > $O/date.txt; nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
T=build/cuda/bin/flashkv_cuda_tests
timeout 200 $T --gtest_filter='CudaKVStep.*:CudaQuantKVCache.*:CudaKVTraits.DeviceEncode*' > $O/tests-append.log 2>&1 &
timeout 200 $T --gtest_filter='CudaDecode*:CudaKVCache*:CudaEngine*' > $O/tests-decode.log 2>&1 &
wait
date -u >> $O/date.txt
cp $O/* $OUT/
grep -h "PASSED\|FAILED" $O/tests-*.log; cat $O/date.txt
