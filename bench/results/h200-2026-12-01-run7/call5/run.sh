#!/usr/bin/env bash
# run7 call 5 (main after the rot-decode revert, the windows-refusal order fix and the L2 prefetch off by default):
# the quantized decode grid, then the decode / KV-cache / engine tests.
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs FLASHKV_MODELS_DIR=$PWD/build/cuda/devmodels
O=/tmp/o5; mkdir -p $O/grid; date -u > $O/date.txt; nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
timeout 40 python3 bench/gpu/bench_decode_quant.py --binary build/cuda/bin/flashkv_bench_decode_quant --out $O/grid --no-cudnn > $O/grid.log 2>&1
timeout 70 build/cuda/bin/flashkv_cuda_tests --gtest_filter='CudaKVCache.*:CudaQuantKVCache.*:CudaDecode*:CudaKVStep.*:CudaKVTraits*' > $O/tests.log 2>&1 &
timeout 70 build/cuda/bin/flashkv_engine_cuda_tests --gtest_filter='CudaEngine.*:CudaEngineGraphs.*' > $O/engine-tests.log 2>&1 &
wait; date -u >> $O/date.txt
tar -czf $OUT/call5.tgz -C $O .
grep -h "PASSED\|FAILED \]\|tests ran" $O/tests.log $O/engine-tests.log; cat $O/date.txt
