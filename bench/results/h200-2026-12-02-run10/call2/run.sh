#!/usr/bin/env bash
# run10 call 2 (issue 12): the vector append with hardware fp8 / directed-rounding fp16 conversions on the device
# (src/kvcache/format/traits.hpp, tested against the portable definitions over all 2^32 floats), 32-bit index
# arithmetic, and the 16-bit pages' num_splits rule refitted to call 1's sweep (src/cuda/decode_splits.hpp): every GPU
# test, compute-sanitizer on the append tests, the decode grid with cuDNN and the append rows, and an out-of-sample
# bf16 sweep (batches and a context the fit did not see).
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
source <(sed -n '/^find_cublas() {/,/^}/p' scripts/gpu-run); find_cublas
O=/tmp/o2; mkdir -p $O; date -u > $O/date.txt; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
B=build/cuda/bin/flashkv_bench_decode_quant
T=build/cuda/bin/flashkv_cuda_tests
for i in 0 1 2 3; do GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout 240 $T > $O/tests-shard$i.log 2>&1 & done
OUT=$O timeout 240 scripts/gpu-run pytest > $O/pytests.log 2>&1 &
OUT=$O timeout 240 scripts/gpu-run engine > $O/engine.log 2>&1 &
wait
date -u >> $O/date.txt
FLASHKV_TEST_SEED=1 timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $T \
  --gtest_filter='CudaKVStep.*:CudaQuantKVCache.AppendErrorsChangeNothing' > $O/sanitizer-memcheck.log 2>&1 &
mkdir -p $O/dq
timeout 170 python3 bench/gpu/bench_decode_quant.py --binary $B --out $O/dq > $O/dq.log 2>&1
wait
date -u >> $O/date.txt
timeout 100 $B --formats bf16 --batches 3,5,9,18,36,44,52,60 --contexts 16384 --splits 0,1,2,3,4,6,8 --calls 10 \
  > $O/sweep-bf16-16k.jsonl 2> $O/sweep-bf16-16k.err
date -u >> $O/date.txt
tar -czf $OUT/logs.tgz -C $O .
mkdir -p $OUT/dq; cp $O/dq/*.md $O/dq/*.json $OUT/dq/ 2>/dev/null; cp $O/gpu.txt $O/date.txt $O/sweep-bf16-16k.jsonl $OUT/
grep -h "PASSED\|FAILED \]" $O/tests-*.log | sort | uniq -c; grep -h "passed\|failed" $O/*.log | tail -6
grep -h "kv-traits\]" $O/tests-*.log; grep -h "ERROR SUMMARY\|PASSED\|FAILED" $O/sanitizer-*.log; cat $O/date.txt
grep -A24 "^| format | mode" $O/dq/*.md | head -26; grep -A32 "^| format | batch" $O/dq/*.md | head -34
