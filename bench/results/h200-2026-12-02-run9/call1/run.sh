#!/usr/bin/env bash
# run9 call 1 (issues 12 / 14: the decode at batch 1): every GPU test of the tree with the fused split-KV combine
# (default) and the decode tests with the two other combines, then the decode step per combine mode x num_splits
# (batch 1, 4k / 32k / 128k) and ncu kernel durations (separate-kernel and fused modes).
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
source <(sed -n '/^find_cublas() {/,/^}/p' scripts/gpu-run); find_cublas
O=/tmp/o; mkdir -p $O; date -u > $O/date.txt; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
B=build/cuda/bin/flashkv_bench_decode_quant
# 1. sweeps first (quiet GPU): combine mode x splits at batch 1
for mode in fused kernel pdl; do
  FLASHKV_DECODE_COMBINE=$mode timeout 70 $B --formats bf16,fp8_e4m3,int4 --batches 1 --contexts 4096,32768,131072 \
    --splits 0,8,16,24,32,33,48,64,66,99,128 --calls 20 > $O/sweep-$mode.jsonl 2> $O/sweep-$mode.err
done
FLASHKV_DECODE_COMBINE=kernel timeout 45 ncu --clock-control none --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
  -k regex:decode $B --formats bf16,int4 --batches 1 --contexts 4096,32768 --calls 2 > $O/ncu-kernel.txt 2>&1
FLASHKV_DECODE_COMBINE=fused timeout 45 ncu --clock-control none --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
  -k regex:decode $B --formats bf16,int4 --batches 1 --contexts 4096,32768 --calls 2 > $O/ncu-fused.txt 2>&1
date -u >> $O/date.txt
# 2. tests (fused combine = default), the two other combines, engine, python
for i in 0 1 2 3; do GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout 230 build/cuda/bin/flashkv_cuda_tests > $O/tests-shard$i.log 2>&1 & done
for mode in kernel pdl; do FLASHKV_DECODE_COMBINE=$mode timeout 230 build/cuda/bin/flashkv_cuda_tests \
  --gtest_filter='CudaDecode*:CudaQuantKVCache*' > $O/tests-combine-$mode.log 2>&1 & done
OUT=$O timeout 230 scripts/gpu-run pytest torch > $O/pytests.log 2>&1 &
OUT=$O timeout 230 scripts/gpu-run engine > $O/engine.log 2>&1 &
wait
date -u >> $O/date.txt
tar -czf $OUT/logs.tgz -C $O .
cp $O/*.jsonl $O/ncu-*.txt $O/gpu.txt $O/date.txt $OUT/ 2>/dev/null
grep -h "PASSED\|FAILED \]" $O/tests-*.log | sort | uniq -c; grep -h "passed\|failed" $O/*.log | tail -8; cat $O/date.txt
grep -h "gpu__time_duration\|decode_kernel\|combine" $O/ncu-kernel.txt | head -30
