#!/usr/bin/env bash
# run7 call 3 (issue 11's one run): every GPU test (4 shards of flashkv_cuda_tests incl. the FP8 suite with its
# cuBLASLt baseline, pytest + torch pytest, the engine step incl. its pytest), the FP8 suite on two more seeds, then the
# full FA3-paper grid (prefill), the decode section and the FP8 section with FA3 (wheel), cuDNN, SDPA and the previous
# release, in one call.
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
source <(sed -n '/^find_cublas() {/,/^}/p' scripts/gpu-run); find_cublas  # cuBLASLt 13 sits next to cuBLAS 13
O=/tmp/o; mkdir -p $O; date -u > $O/date.txt; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
for i in 0 1 2 3; do GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout 280 build/cuda/bin/flashkv_cuda_tests > $O/tests-shard$i.log 2>&1 & done
OUT=$O timeout 280 scripts/gpu-run pytest torch > $O/pytests.log 2>&1 &
OUT=$O timeout 280 scripts/gpu-run engine > $O/engine.log 2>&1 &
( for s in 1 2; do FLASHKV_TEST_SEED=$s timeout 130 build/cuda/bin/flashkv_cuda_tests --gtest_filter='CudaFp8Forward.*' 2>&1; done > $O/fp8-seeds.log ) &
wait
date -u >> $O/date.txt
tar -czf $OUT/tests.tgz -C $O .
OUT=$O FLASHKV_BENCH_SECTIONS=prefill,decode,fp8 FLASHKV_BENCH_TIMEOUT=300 FLASHKV_PREV_LIBRARY=$PWD/build/carry/prev-libflashkv.so \
  timeout 300 scripts/gpu-run bench > $O/bench-run.log 2>&1
date -u >> $O/date.txt
tar -czf $OUT/bench.tgz -C $O .
grep -h "PASSED\|FAILED \]" $O/tests-shard*.log | sort | uniq -c; grep -h "FAILED \]\|PASSED" $O/fp8-seeds.log; grep -h "passed\|failed" $O/*.log | tail -8; cat $O/date.txt
