#!/usr/bin/env bash
# run9 call 6: the same build as call 5 (warm machine), bf16 num_splits forced at batch 6 / 12 / 48 (auto first).
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs; timeout 100 build/cuda/bin/flashkv_bench_decode_quant --formats bf16 --batches 6,12,48 --contexts 8192,32768 --splits 0,1,2,3,4 --calls 15 > $OUT/sweep-bf16.jsonl 2>&1
