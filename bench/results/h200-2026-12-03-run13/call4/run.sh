#!/usr/bin/env bash
# run13 call 4 (same build as call 3): run-to-run noise of the decode grid at 32k (keys-as-M / 16-row / keys-as-M
# again, back to back), and call 2's one failure — CudaEval.PasskeyAnswersMatchTheCpu at its seed, which passed twice
# alone in call 3 — four times concurrently with two decode test shards (does the GPU answer change under load?).
set -u
[[ -x build/cuda/bin/flashkv_cuda_tests ]] || tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
source <(sed -n '/^find_cublas() {/,/^}/p' scripts/gpu-run); find_cublas
O=/tmp/o4; mkdir -p $O; date -u > $O/date.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
B=build/cuda/bin/flashkv_bench_decode_quant
T=build/cuda/bin/flashkv_cuda_tests
F=bf16,fp8_e4m3,fp8_e4m3_dynamic,int8,int4,int4_g32
for g in a b c; do
  mkdir -p $O/grid-$g
  if [[ $g == b ]]; then export FLASHKV_DECODE_KEYS_M=0; else unset FLASHKV_DECODE_KEYS_M; fi
  timeout 50 python3 bench/gpu/bench_decode_quant.py --binary $B --out $O/grid-$g --no-cudnn --formats $F --batches 16,64,128 --contexts 32768 > $O/grid-$g.log 2>&1
done
unset FLASHKV_DECODE_KEYS_M
date -u >> $O/date.txt
timeout 150 $T --gtest_filter='CudaQuantKVCache.*' > $O/tests-quant.log 2>&1 &
timeout 150 $T --gtest_filter='CudaDecode*:CudaKVCache*' > $O/tests-decode.log 2>&1 &
for i in 1 2 3 4; do FLASHKV_MODELS_DIR=$PWD/build/cuda/devmodels FLASHKV_TEST_SEED=16786043397378931546 timeout 150 \
  build/cuda/bin/flashkv_engine_cuda_tests --gtest_filter=CudaEval.PasskeyAnswersMatchTheCpu > $O/passkey-seed-$i.log 2>&1 & done
wait
date -u >> $O/date.txt
tar -czf $OUT/logs.tgz -C $O .
cp $O/gpu.txt $O/date.txt $OUT/
cat $O/date.txt; grep -h "PASSED\|FAILED \]" $O/tests-*.log $O/passkey-seed-*.log | sort | uniq -c
grep -h "bf16 trial\|fp16 trial" $O/passkey-seed-*.log | cut -c1-170 | sort | uniq -c
for g in a b c; do echo "== $g"; grep -h "^| int4\|^| int8\|^| bf16 |\|^| fp8" $O/grid-$g/*.md | grep -v "batched\|per_sequence" | awk -F'|' '{print $2,$3,$5}' | grep -v " 1 $" | paste -sd' '; done
