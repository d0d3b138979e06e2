#!/usr/bin/env bash
# run13 call 5 (same build as calls 3-4): call 2's one failure, CudaEval.PasskeyAnswersMatchTheCpu, at call 2's seed
# (8281288849897869929; call 4 re-ran call 1's seed by mistake): twice alone, then four times concurrently.
set -u
[[ -x build/cuda/bin/flashkv_cuda_tests ]] || tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
source <(sed -n '/^find_cublas() {/,/^}/p' scripts/gpu-run); find_cublas
O=/tmp/o5; mkdir -p $O; date -u > $O/date.txt
run() { FLASHKV_MODELS_DIR=$PWD/build/cuda/devmodels FLASHKV_TEST_SEED=8281288849897869929 timeout 150 \
  build/cuda/bin/flashkv_engine_cuda_tests --gtest_filter=CudaEval.PasskeyAnswersMatchTheCpu > $O/passkey-$1.log 2>&1; }
run alone1; run alone2
for i in 1 2 3 4; do run conc$i & done; wait
date -u >> $O/date.txt
tar -czf $OUT/logs.tgz -C $O .
grep -h "PASSED\|FAILED \]" $O/passkey-*.log | sort | uniq -c
grep -h "bf16 trial\|fp16 trial" $O/passkey-*.log | cut -c1-190 | sort | uniq -c
