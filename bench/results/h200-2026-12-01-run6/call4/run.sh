#!/usr/bin/env bash
# run6 call 4 (main 86d9266 = + eval-cuda): the engine step (flashkv_engine_cuda_tests incl. CudaEval.*, the engine
# pytest, every documented --device cuda command) and, beside it, compute-sanitizer memcheck / synccheck / racecheck
# on the sm90ws and FP8 varlen suites (FP8's lse check fails there as in call 2; the exit code 9 = sanitizer errors).
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
O=/tmp/o; mkdir -p $O/eng $O/san; date -u > $O/date.txt; nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
ls -la /usr/share/common-licenses/GPL-3 >> $O/date.txt 2>&1
OUT=$O/eng timeout 330 scripts/gpu-run engine > $O/engine.log 2>&1 &
( for tool in memcheck synccheck racecheck; do FLASHKV_TEST_SEED=1 timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 \
  build/cuda/bin/flashkv_cuda_tests --gtest_filter='CudaForwardSm90ws.VarlenWithEmptySequences:CudaFp8Forward.VarlenWithEmptySequences' \
  > $O/san/$tool.log 2>&1; echo "$tool exit $? ($(grep -c 'OK \]' $O/san/$tool.log) OK, $(grep -m1 'ERROR SUMMARY' $O/san/$tool.log))"; done > $O/sanitizer.log 2>&1 ) &
wait
date -u >> $O/date.txt
tar -czf $OUT/logs.tgz -C $O .
tail -25 $O/engine.log; tail -25 $O/sanitizer.log
