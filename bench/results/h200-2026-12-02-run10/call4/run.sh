#!/usr/bin/env bash
# run10 call 4: the same build as call 3: bf16 decode with the refitted num_splits rule next to cuDNN (torch SDPA) in
# the same run, at the batch sizes where the rule before lost to cuDNN (12, 48) and changed most (40), 8k / 32k.
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python
O=/tmp/o4; mkdir -p $O/dq; date -u > $O/date.txt; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
timeout 200 python3 bench/gpu/bench_decode_quant.py --binary build/cuda/bin/flashkv_bench_decode_quant --formats bf16 \
  --batches 2,6,12,24,40,48 --contexts 8192,32768 --calls 20 --out $O/dq > $O/dq.log 2>&1
date -u >> $O/date.txt
mkdir -p $OUT/dq; cp $O/dq/*.md $O/dq/*.json $OUT/dq/ 2>/dev/null; cp $O/gpu.txt $O/date.txt $O/dq.log $OUT/
cat $O/date.txt; grep -A30 "^| format | batch" $O/dq/*.md | head -32
