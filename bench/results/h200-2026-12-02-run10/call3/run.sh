#!/usr/bin/env bash
# run10 call 3: the final tree of this run — load8 with exact hardware conversions (one dtype branch per row) in the
# vector append, and the num_splits rule's unsplit case (one wave over >= 90% of the SMs at <= 8k tokens): the append /
# decode / trait tests and the engine, compute-sanitizer memcheck on the append tests, the decode grid with cuDNN and
# the append rows, and the heuristic's own choices at the batch sizes of call 1's sweep (8k).
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
source <(sed -n '/^find_cublas() {/,/^}/p' scripts/gpu-run); find_cublas
O=/tmp/o3; mkdir -p $O; date -u > $O/date.txt; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
B=build/cuda/bin/flashkv_bench_decode_quant
T=build/cuda/bin/flashkv_cuda_tests
timeout 240 $T --gtest_filter='CudaKVStep.*:CudaQuantKVCache.*:CudaKVTraits.*' > $O/tests-append.log 2>&1 &
timeout 240 $T --gtest_filter='CudaDecode*:CudaKVCache*:CudaEngine*:CudaEval*' > $O/tests-decode.log 2>&1 &
OUT=$O timeout 240 scripts/gpu-run engine > $O/engine.log 2>&1 &
wait
date -u >> $O/date.txt
FLASHKV_TEST_SEED=1 timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $T \
  --gtest_filter='CudaKVStep.*:CudaQuantKVCache.AppendErrorsChangeNothing' > $O/sanitizer-memcheck.log 2>&1 &
mkdir -p $O/dq
timeout 170 python3 bench/gpu/bench_decode_quant.py --binary $B --out $O/dq > $O/dq.log 2>&1
wait
date -u >> $O/date.txt
timeout 60 $B --formats bf16 --batches 6,10,12,16,20,24,28,40,48 --contexts 8192,32768 --splits 0 --calls 10 \
  > $O/auto-bf16.jsonl 2> $O/auto-bf16.err
date -u >> $O/date.txt
tar -czf $OUT/logs.tgz -C $O .
mkdir -p $OUT/dq; cp $O/dq/*.md $O/dq/*.json $OUT/dq/ 2>/dev/null; cp $O/gpu.txt $O/date.txt $O/auto-bf16.jsonl $OUT/
grep -h "PASSED\|FAILED \]" $O/tests-*.log | sort | uniq -c; grep -h "passed\|failed" $O/*.log | tail -4
grep -h "kv-traits\]" $O/tests-*.log; grep -h "ERROR SUMMARY\|PASSED\|FAILED" $O/sanitizer-*.log; cat $O/date.txt
grep -A24 "^| format | mode" $O/dq/*.md | head -26; grep -A40 "^| format | batch" $O/dq/*.md | head -42
