#!/usr/bin/env bash
# run9 call 5: main + the mixed pair k=int8 / v=int4 compiled in the device build (ALL_INSTANTIATIONS), the wave-model
# num_splits heuristic (src/cuda/decode_splits.hpp) and the PDL guard: the decode and quantized-cache tests (the mixed
# pair now decodes instead of reporting "not compiled"), both combines; compute-sanitizer memcheck + racecheck on decode
# tests (the fused combine: arrival counter, shared-memory merge); the decode grid at more batch sizes with cuDNN.
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs
O=/tmp/o5; mkdir -p $O; date -u > $O/date.txt; nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
T=build/cuda/bin/flashkv_cuda_tests
timeout 150 $T --gtest_filter='CudaDecode*:CudaQuantKVCache*:CudaKVCache*' > $O/tests-fused.log 2>&1 &
FLASHKV_DECODE_COMBINE=kernel timeout 150 $T --gtest_filter='CudaQuantKVCache*' > $O/tests-kernel.log 2>&1 &
wait
date -u >> $O/date.txt
for tool in memcheck racecheck; do
  FLASHKV_TEST_SEED=1 timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $T \
    --gtest_filter='CudaDecode.VariantsVsReference:CudaDecode.EmptyRowsAndAllNegativeInfinityScores:CudaDecode.BrokenMaxSeqlenPromiseGivesNaNForThatSequenceOnly' \
    > $O/sanitizer-$tool.log 2>&1 &
done
wait
date -u >> $O/date.txt
export PYTHONPATH=$PWD/python
mkdir -p $O/dq; timeout 150 python3 bench/gpu/bench_decode_quant.py --binary build/cuda/bin/flashkv_bench_decode_quant \
  --formats bf16,fp8_e4m3,int8,int4 --batches 1,2,8,12,24,32,48,64 --contexts 8192,32768 --calls 15 --out $O/dq > $O/dq.log 2>&1
date -u >> $O/date.txt
cp -r $O/* $OUT/
grep -h "PASSED\|FAILED\|int8,v:int4\|not compiled" $O/tests-*.log | sort | uniq -c | head -20
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|PASSED\|FAILED" $O/sanitizer-*.log; cat $O/date.txt
grep "^| " $O/dq/*.md | head -75
