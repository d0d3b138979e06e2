#!/usr/bin/env bash
# one device call: every GPU test (sharded), engine, pytest, then torch_bench and a sanitizer subset; logs in /tmp/o
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
O=/tmp/o; mkdir -p $O; date -u > $O/date.txt; nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
for i in 0 1 2 3; do GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout 230 build/cuda/bin/flashkv_cuda_tests > $O/tests-shard$i.log 2>&1 & done
OUT=$O timeout 230 scripts/gpu-run pytest torch > $O/pytests.log 2>&1 &
OUT=$O timeout 230 scripts/gpu-run engine > $O/engine.log 2>&1 &
wait
date -u >> $O/date.txt
timeout 170 python3 bench/gpu/torch_bench.py --out $O --reps 3 > $O/torch_bench.log 2>&1
date -u >> $O/date.txt
FLASHKV_TEST_SEED=1 timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 build/cuda/bin/flashkv_cuda_tests \
  --gtest_filter='CudaForwardSm90ws.VarlenWithEmptySequences:CudaForwardSm90ws.PersistentTilesAndEmptyKeys' > $O/sanitizer-sm90ws-memcheck.log 2>&1; echo "sanitizer sm90ws memcheck exit $?" >> $O/date.txt
date -u >> $O/date.txt
