#!/usr/bin/env bash
# run12 call 7: after a review — the vector append's 64-bit capacity check and its 2^30-row bound (the grid-stride
# loop's 32-bit index), FastDivmod's divisor range, the value-check test with both bad values in one row and the
# first values past each limit, page sizes 16 .. 256 in the byte-for-byte test, int8_g64 in the decode test (the
# run-time-group mainloop). Every CUDA test shard concurrently + the engine; memcheck on every CudaKVAppend case.
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
source <(sed -n '/^find_cublas() {/,/^}/p' scripts/gpu-run); find_cublas
O=/tmp/o7; mkdir -p $O; date -u > $O/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
T=build/cuda/bin/flashkv_cuda_tests
timeout 300 $T --gtest_filter='CudaKVAppend.*:CudaKVStep.*:CudaKVTraits.*' > $O/tests-append.log 2>&1 &
timeout 300 $T --gtest_filter='CudaQuantKVCache.*' > $O/tests-quant.log 2>&1 &
timeout 300 $T --gtest_filter='CudaDecode*:CudaKVCache*' > $O/tests-decode.log 2>&1 &
timeout 300 $T --gtest_filter='-CudaKVAppend.*:CudaKVStep.*:CudaKVTraits.*:CudaQuantKVCache.*:CudaDecode*:CudaKVCache*' > $O/tests-attention.log 2>&1 &
OUT=$O timeout 300 scripts/gpu-run engine > $O/engine.log 2>&1 &
wait
date -u >> $O/date.txt
FLASHKV_TEST_SEED=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $T \
  --gtest_filter='CudaKVAppend.*' > $O/sanitizer-memcheck.log 2>&1
date -u >> $O/date.txt
tar -czf $OUT/logs.tgz -C $O .
cp $O/gpu.txt $O/date.txt $OUT/
grep -h "tests ran\|PASSED\|FAILED\|append-vec" $O/tests-*.log | sort | uniq -c; grep -h "passed\|failed" $O/engine.log | tail -3
grep -h "ERROR SUMMARY" $O/sanitizer-*.log; cat $O/date.txt
grep -h -B3 -A12 "Failure\|FAILED  \]" $O/tests-*.log | head -60
