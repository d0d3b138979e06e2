#!/usr/bin/env bash
# run8 call 7 (issues 11 + 12), main f4b898c (the sm80 backward load points + the register-direct quantized decode):
# every GPU test (4 shards of flashkv_cuda_tests, pytest + torch pytest, the engine step), then the prefill grid
# (fwd, fwd+bwd, every family) with the previous release and FA3 / cuDNN / SDPA in the same table, then the quantized
# decode grid (bench_decode_quant.py, same grid and columns as run7 call 4/5).
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
source <(sed -n '/^find_cublas() {/,/^}/p' scripts/gpu-run); find_cublas  # cuBLASLt 13 sits next to cuBLAS 13
O=/tmp/o; mkdir -p $O; date -u > $O/date.txt; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
for i in 0 1 2 3; do GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout 230 build/cuda/bin/flashkv_cuda_tests > $O/tests-shard$i.log 2>&1 & done
OUT=$O timeout 230 scripts/gpu-run pytest torch > $O/pytests.log 2>&1 &
OUT=$O timeout 230 scripts/gpu-run engine > $O/engine.log 2>&1 &
wait
date -u >> $O/date.txt
tar -czf $OUT/tests.tgz -C $O .
OUT=$O FLASHKV_BENCH_SECTIONS=prefill FLASHKV_BENCH_TIMEOUT=140 FLASHKV_PREV_LIBRARY=$PWD/build/carry/prev-libflashkv.so \
  timeout 145 scripts/gpu-run bench > $O/bench-run.log 2>&1
date -u >> $O/date.txt
mkdir -p $O/dq; timeout 140 python3 bench/gpu/bench_decode_quant.py --binary build/cuda/bin/flashkv_bench_decode_quant \
  --out $O/dq > $O/dq.log 2>&1
date -u >> $O/date.txt
tar -czf $OUT/bench.tgz -C $O .
cp $O/*.md $O/*.json $OUT/ 2>/dev/null; cp $O/dq/*.md $O/dq/*.json $OUT/ 2>/dev/null
grep -h "PASSED\|FAILED \]" $O/tests-shard*.log | sort | uniq -c; grep -h "passed\|failed" $O/*.log | tail -8; cat $O/date.txt
grep -A40 "^| format | batch" $O/dq/*.md | head -42
