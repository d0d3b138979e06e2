#!/usr/bin/env bash
# run6 call 5 (same build as call 4, main 86d9266): the quantized decode bench on its default grid (batch 1/16/64 x
# context 4k/32k) and the 128k column (batch 1/16), our bf16 decode and cuDNN bf16 in the same run.
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
O=/tmp/o; mkdir -p $O/grid $O/128k; date -u > $O/date.txt; nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
timeout 200 python3 bench/gpu/bench_decode_quant.py --binary build/cuda/bin/flashkv_bench_decode_quant --out $O/grid > $O/grid.log 2>&1
date -u >> $O/date.txt
timeout 200 python3 bench/gpu/bench_decode_quant.py --binary build/cuda/bin/flashkv_bench_decode_quant --out $O/128k --batches 1,16 --contexts 131072 --calls 10 > $O/128k.log 2>&1
date -u >> $O/date.txt
tar -czf $OUT/logs.tgz -C $O .
grep -A22 "^| format | batch" $O/grid/*.md | head -24; grep -A12 "^| format | batch" $O/128k/*.md | head -14
