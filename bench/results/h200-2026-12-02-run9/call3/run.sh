#!/usr/bin/env bash
# run9 call 3 (issues 12 / 14): the tree with the fused split-KV combine and the retuned num_splits heuristic: every
# GPU test (4 shards of flashkv_cuda_tests, the decode tests again with FLASHKV_DECODE_COMBINE=kernel, pytest + torch
# pytest, the engine), then the quantized decode grid with cuDNN in the same run (run8 call 7's grid, plus 128k).
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
source <(sed -n '/^find_cublas() {/,/^}/p' scripts/gpu-run); find_cublas
O=/tmp/o3; mkdir -p $O; date -u > $O/date.txt; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
B=build/cuda/bin/flashkv_bench_decode_quant
for i in 0 1 2 3; do GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout 230 build/cuda/bin/flashkv_cuda_tests > $O/tests-shard$i.log 2>&1 & done
FLASHKV_DECODE_COMBINE=kernel timeout 230 build/cuda/bin/flashkv_cuda_tests --gtest_filter='CudaDecode*:CudaQuantKVCache*' \
  > $O/tests-combine-kernel.log 2>&1 &
OUT=$O timeout 230 scripts/gpu-run pytest torch > $O/pytests.log 2>&1 &
OUT=$O timeout 230 scripts/gpu-run engine > $O/engine.log 2>&1 &
wait
date -u >> $O/date.txt
mkdir -p $O/dq $O/dq128k
timeout 150 python3 bench/gpu/bench_decode_quant.py --binary $B --out $O/dq > $O/dq.log 2>&1
date -u >> $O/date.txt
timeout 120 python3 bench/gpu/bench_decode_quant.py --binary $B --out $O/dq128k --batches 1,16 --contexts 131072 \
  --calls 10 > $O/dq128k.log 2>&1
date -u >> $O/date.txt
tar -czf $OUT/logs.tgz -C $O .
mkdir -p $OUT/dq $OUT/dq128k; cp $O/dq/*.md $O/dq/*.json $OUT/dq/ 2>/dev/null; cp $O/dq128k/*.md $O/dq128k/*.json $OUT/dq128k/ 2>/dev/null
cp $O/gpu.txt $O/date.txt $OUT/
grep -h "PASSED\|FAILED \]" $O/tests-*.log | sort | uniq -c; grep -h "passed\|failed" $O/*.log | tail -8; cat $O/date.txt
grep -A40 "^| format | batch" $O/dq/*.md | head -42
