#!/usr/bin/env bash
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
O=/tmp/o; mkdir -p $O; date -u > $O/date.txt; nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
for i in 0 1 2 3; do GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout 150 build/cuda/bin/flashkv_cuda_tests > $O/tests-shard$i.log 2>&1 & done
wait
date -u >> $O/date.txt
tar -czf $OUT/a.tgz -C $O .
timeout 30 python3 bench/gpu/bench_decode_quant.py --binary build/cuda/bin/flashkv_bench_decode_quant --out $O --quick > $O/dq.log 2>&1
OUT=$O FLASHKV_BENCH_SECTIONS=prefill,decode FLASHKV_BENCH_TIMEOUT=105 FLASHKV_PREV_LIBRARY=$PWD/build/carry/prev-libflashkv.so timeout 110 scripts/gpu-run bench-quick > $O/bench-run.log 2>&1
date -u >> $O/date.txt
tar -czf $OUT/b.tgz -C $O .
