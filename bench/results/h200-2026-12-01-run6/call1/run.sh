#!/usr/bin/env bash
# run6 call 1 (main 877015a): every GPU test (4 shards) + pytest + torch pytest + engine, then CudaNonFinite* built at
# the pre-fix commit 6f4069f (tests of 777441b) next to main's with the same seed, then the quantized decode bench.
set -u
tar -xJf build/carry/cuda.tar.xz
xz -dc build/carry/prefix-tests.xz > /tmp/prefix-tests && chmod +x /tmp/prefix-tests
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
O=/tmp/o; mkdir -p $O; date -u > $O/date.txt; nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
for i in 0 1 2 3; do GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout 230 build/cuda/bin/flashkv_cuda_tests > $O/tests-shard$i.log 2>&1 & done
OUT=$O timeout 230 scripts/gpu-run pytest torch > $O/pytests.log 2>&1 &
OUT=$O timeout 230 scripts/gpu-run engine > $O/engine.log 2>&1 &
wait
date -u >> $O/date.txt
FLASHKV_TEST_SEED=12345 timeout 120 /tmp/prefix-tests --gtest_filter='CudaNonFinite*' > $O/nonfinite-prefix-6f4069f.log 2>&1; echo "prefix exit $?" >> $O/date.txt
FLASHKV_TEST_SEED=12345 timeout 120 build/cuda/bin/flashkv_cuda_tests --gtest_filter='CudaNonFinite*' > $O/nonfinite-main.log 2>&1; echo "main exit $?" >> $O/date.txt
timeout 60 python3 bench/gpu/bench_decode_quant.py --binary build/cuda/bin/flashkv_bench_decode_quant --out $O --quick > $O/dq.log 2>&1
date -u >> $O/date.txt
tar -czf $OUT/logs.tgz -C $O .
grep -h "PASSED\|FAILED\|exit" $O/*.log $O/date.txt | tail -40
