#!/usr/bin/env bash
# run12 call 6: the vector append's loop without integer divisions (the metadata word by a division once per thread,
# the group's first lane by a mask, token formats' metadata unit = the slot) and without the packed-min emulation (8-bit
# codes: the conversion's saturation; 4-bit: min(q, 15) in float). The append / cache tests in concurrent shards, then
# the append rows of the bench (batch 128 x 4k / 32k, batch 16 x 128k) against calls 1-3.
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
source <(sed -n '/^find_cublas() {/,/^}/p' scripts/gpu-run); find_cublas
O=/tmp/o6; mkdir -p $O; date -u > $O/date.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
B=build/cuda/bin/flashkv_bench_decode_quant
T=build/cuda/bin/flashkv_cuda_tests
timeout 240 $T --gtest_filter='CudaKVAppend.*:CudaKVStep.*:CudaKVTraits.*' > $O/tests-append.log 2>&1 &
timeout 240 $T --gtest_filter='CudaQuantKVCache.*' > $O/tests-quant.log 2>&1 &
timeout 240 $T --gtest_filter='CudaDecode*:CudaKVCache*' > $O/tests-decode.log 2>&1 &
OUT=$O timeout 240 scripts/gpu-run engine > $O/engine.log 2>&1 &
wait
date -u >> $O/date.txt
FLASHKV_TEST_SEED=1 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $T \
  --gtest_filter='CudaKVAppend.*' > $O/sanitizer-memcheck.log 2>&1
date -u >> $O/date.txt
mkdir -p $O/append $O/append128k
timeout 120 python3 bench/gpu/bench_decode_quant.py --binary $B --out $O/append --no-cudnn --calls 5 \
  --formats bf16,fp8_e4m3,fp8_e4m3_dynamic,int8,int4,int4_g32 --batches 128 --contexts 4096,32768 > $O/append.log 2>&1
timeout 120 python3 bench/gpu/bench_decode_quant.py --binary $B --out $O/append128k --no-cudnn --calls 5 \
  --formats bf16,fp8_e4m3,fp8_e4m3_dynamic,int8,int4,int4_g32 --batches 16 --contexts 131072 > $O/append128k.log 2>&1
NCU="ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats"
timeout 90 $NCU --kernel-name regex:quant_append --launch-count 2 $B --formats int8 --batches 64 --contexts 32768 --calls 2 > $O/ncu-append.txt 2>&1
date -u >> $O/date.txt
tar -czf $OUT/logs.tgz -C $O .
cp -r $O/append $O/append128k $OUT/; cp $O/gpu.txt $O/date.txt $O/ncu-append.txt $OUT/
grep -h "PASSED\|FAILED \]\|append-vec" $O/tests-*.log | sort | uniq -c; grep -h "passed\|failed" $O/engine.log | tail -3
grep -h "ERROR SUMMARY" $O/sanitizer-*.log; cat $O/date.txt
grep -h "| batched" $O/append/*.md $O/append128k/*.md
grep -h "Duration\|DRAM Throughput\|Issued Warp Per\|No Eligible" $O/ncu-append.txt | head -8
