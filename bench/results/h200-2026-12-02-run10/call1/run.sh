#!/usr/bin/env bash
# run10 call 1 (issue 12: the device append): the tree with the vector append kernels and the value check inside the
# write launch (src/cuda/decode_append_vec.cu): every GPU test (4 shards of flashkv_cuda_tests, pytest + torch pytest,
# the engine), compute-sanitizer memcheck / racecheck on the append tests, the quantized decode grid with cuDNN (now
# with per-sequence and batched append timings and a copy anchor), and a bf16 num_splits sweep for the heuristic.
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
source <(sed -n '/^find_cublas() {/,/^}/p' scripts/gpu-run); find_cublas
O=/tmp/o1; mkdir -p $O; date -u > $O/date.txt; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
B=build/cuda/bin/flashkv_bench_decode_quant
T=build/cuda/bin/flashkv_cuda_tests
for i in 0 1 2 3; do GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout 230 $T > $O/tests-shard$i.log 2>&1 & done
OUT=$O timeout 230 scripts/gpu-run pytest torch > $O/pytests.log 2>&1 &
OUT=$O timeout 230 scripts/gpu-run engine > $O/engine.log 2>&1 &
wait
date -u >> $O/date.txt
for tool in memcheck racecheck; do
  FLASHKV_TEST_SEED=1 timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 $T \
    --gtest_filter='CudaKVStep.*:CudaQuantKVCache.AppendErrorsChangeNothing' > $O/sanitizer-$tool.log 2>&1 &
done
mkdir -p $O/dq
timeout 170 python3 bench/gpu/bench_decode_quant.py --binary $B --out $O/dq > $O/dq.log 2>&1
wait
date -u >> $O/date.txt
timeout 100 $B --formats bf16 --batches 2,4,6,8,10,12,14,16,20,24,28,32,40,48,56,64 --contexts 8192,32768 \
  --splits 0,1,2,3,4,5,6,8 --calls 10 > $O/sweep-bf16.jsonl 2> $O/sweep-bf16.err
date -u >> $O/date.txt
tar -czf $OUT/logs.tgz -C $O .
mkdir -p $OUT/dq; cp $O/dq/*.md $O/dq/*.json $OUT/dq/ 2>/dev/null; cp $O/gpu.txt $O/date.txt $O/sweep-bf16.jsonl $OUT/
grep -h "PASSED\|FAILED \]" $O/tests-*.log | sort | uniq -c; grep -h "passed\|failed" $O/*.log | tail -8
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|PASSED\|FAILED" $O/sanitizer-*.log; cat $O/date.txt
grep -B2 -A14 "^| format | mode" $O/dq/*.md | head -30; wc -l $O/sweep-bf16.jsonl
