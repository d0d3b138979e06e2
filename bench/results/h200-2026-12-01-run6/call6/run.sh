#!/usr/bin/env bash
# run6 call 6: branch engine-graphs (a84d674, NOT on main; its cuda-preset build with the default instantiations, carried
# as build/carry/eg.tar.xz; devlibs/models from main's carry): its new GPU tests (CudaKVStep.*, CudaEngineGraphs.*, the
# engine tests) and generate on the 260K model with --cuda-graphs on / off.
set -u
tar -xJf build/carry/cuda.tar.xz; tar -xJf build/carry/eg.tar.xz -C /tmp
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs FLASHKV_MODELS_DIR=$PWD/build/cuda/devmodels
source <(sed -n '/^find_cublas() {/,/^}/p' scripts/gpu-run); find_cublas
O=/tmp/o; mkdir -p $O; date -u > $O/date.txt; nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
timeout 150 /tmp/eg/flashkv_cuda_tests --gtest_filter='CudaKVStep.*:CudaDecode.*:CudaKVCache.*:CudaQuantKVCache.*' > $O/eg-cuda-tests.log 2>&1 &
timeout 150 /tmp/eg/flashkv_engine_cuda_tests > $O/eg-engine-tests.log 2>&1 &
wait
M=build/cuda/devmodels
for g in on off; do timeout 60 /tmp/eg/flashkv generate --model $M/aidreams260K.bin --tokenizer $M/aidreams260K.tok512.bin \
  --prompt "The machine" --steps 120 --temperature 0 --device cuda --cuda-graphs $g --json $O/generate-cuda-$g.json > $O/generate-cuda-$g.log 2>&1; done
timeout 60 /tmp/eg/flashkv generate --model $M/aidreams260K.bin --tokenizer $M/aidreams260K.tok512.bin \
  --prompt "The machine" --steps 120 --temperature 0 --device cpu --json $O/generate-cpu.json > $O/generate-cpu.log 2>&1
date -u >> $O/date.txt
tar -czf $OUT/logs.tgz -C $O .
grep -h "PASSED\|FAILED \]" $O/eg-*.log; grep -h "decode" $O/generate-*.log | head -6
