#!/usr/bin/env bash
# run12 call 3: the affine decode loop compiled for 32-channel groups (int4_g32 / int8_g32; the one-row-half variant
# for GQA <= 8) next to the whole-head one, and the append without its L2 prefetch (no effect in call 2's A/B).
# Tests in concurrent shards + the engine; the decode / append grid of issue 12 (4k / 32k at batch 1 .. 128, 128k at
# batch 1 / 16); the first of three parts of the SmolLM2 GGUF travels with this call.
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
source <(sed -n '/^find_cublas() {/,/^}/p' scripts/gpu-run); find_cublas
O=/tmp/o3; mkdir -p $O; date -u > $O/date.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
B=build/cuda/bin/flashkv_bench_decode_quant
T=build/cuda/bin/flashkv_cuda_tests
timeout 240 $T --gtest_filter='CudaKVAppend.*:CudaKVStep.*:CudaKVTraits.*' > $O/tests-append.log 2>&1 &
timeout 240 $T --gtest_filter='CudaQuantKVCache.*' > $O/tests-quant.log 2>&1 &
timeout 240 $T --gtest_filter='CudaDecode*:CudaKVCache*' > $O/tests-decode.log 2>&1 &
FLASHKV_DECODE_COMBINE=kernel timeout 240 $T --gtest_filter='CudaDecode*:CudaQuantKVCache*' > $O/tests-combine-kernel.log 2>&1 &
OUT=$O timeout 240 scripts/gpu-run engine > $O/engine.log 2>&1 &
wait
date -u >> $O/date.txt
mkdir -p $O/grid $O/grid128k
timeout 200 python3 bench/gpu/bench_decode_quant.py --binary $B --out $O/grid \
  --formats bf16,fp8_e4m3,fp8_e4m3_dynamic,int8,int4,int4_g32 --batches 1,16,64,128 --contexts 4096,32768 > $O/grid.log 2>&1
date -u >> $O/date.txt
timeout 150 python3 bench/gpu/bench_decode_quant.py --binary $B --out $O/grid128k \
  --formats bf16,fp8_e4m3,fp8_e4m3_dynamic,int8,int4,int4_g32 --batches 1,16 --contexts 131072 > $O/grid128k.log 2>&1
date -u >> $O/date.txt
tar -czf $OUT/logs.tgz -C $O .
cp -r $O/grid $O/grid128k $OUT/ 2>/dev/null; cp $O/gpu.txt $O/date.txt $OUT/
grep -h "PASSED\|FAILED \]\|append-vec" $O/tests-*.log | sort | uniq -c; grep -h "passed\|failed" $O/engine.log | tail -3
cat $O/date.txt
grep -h "^| int4\|^| int8\|^| bf16 |\|^| fp8" $O/grid/*.md $O/grid128k/*.md | grep -v "batched\|per_sequence" | awk -F'|' '{print $2,$3,$4,$5,$9,$11}'
grep -h "| batched" $O/grid/*.md $O/grid128k/*.md; tail -3 $O/grid.log $O/grid128k.log
