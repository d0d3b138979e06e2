#!/usr/bin/env bash
# run9 call 2 (issue 12): the same build as call 1; num_splits sweep at batch 16 / 64 (fused combine), for the
# heuristic's choice once batch x kv heads nearly fills the GPU.
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs
O=/tmp/o2; mkdir -p $O; date -u > $O/date.txt; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
B=build/cuda/bin/flashkv_bench_decode_quant
timeout 200 $B --formats bf16,fp8_e4m3,int8,int4 --batches 4,16,64 --contexts 4096,32768 --splits 0,1,2,3,4,6,8 --calls 15 \
  > $O/sweep-fused.jsonl 2> $O/sweep-fused.err
date -u >> $O/date.txt
cp $O/* $OUT/ 2>/dev/null; cat $O/date.txt; tail -3 $O/sweep-fused.err
