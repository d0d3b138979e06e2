#!/usr/bin/env bash
# run13 call 2: the keys-as-M loop in its own kernel (KvQuantSource kKeysMOnly: 4 CTAs per SM where 4 fit, 128 registers;
# launched when every CTA has <= 8 query rows). Tests in concurrent shards (default loop; the 16-row loop via
# FLASHKV_DECODE_KEYS_M=0; the separate combine kernel) + the engine, memcheck on the quantized decode, the decode grid
# with the keys-as-M loop and the 16-row loop back to back (same binary: the A/B of the previous version), Nsight Compute
# on the int4 / int8 decode kernels.
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
source <(sed -n '/^find_cublas() {/,/^}/p' scripts/gpu-run); find_cublas
O=/tmp/o2; mkdir -p $O; date -u > $O/date.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
B=build/cuda/bin/flashkv_bench_decode_quant
T=build/cuda/bin/flashkv_cuda_tests
timeout 280 $T --gtest_filter='CudaQuantKVCache.*' > $O/tests-quant.log 2>&1 &
FLASHKV_DECODE_KEYS_M=0 timeout 280 $T --gtest_filter='CudaQuantKVCache.*:CudaDecode*' > $O/tests-rows-loop.log 2>&1 &
timeout 280 $T --gtest_filter='CudaDecode*:CudaKVCache*:CudaKVAppend.*:CudaKVStep.*:CudaKVTraits.*' > $O/tests-decode.log 2>&1 &
FLASHKV_DECODE_COMBINE=kernel timeout 280 $T --gtest_filter='CudaDecode*:CudaQuantKVCache*' > $O/tests-combine-kernel.log 2>&1 &
OUT=$O timeout 280 scripts/gpu-run engine > $O/engine.log 2>&1 &
wait
date -u >> $O/date.txt
mkdir -p $O/grid $O/grid-rows $O/grid128k $O/grid128k-rows
F=bf16,fp8_e4m3,fp8_e4m3_dynamic,int8,int4,int4_g32
timeout 100 python3 bench/gpu/bench_decode_quant.py --binary $B --out $O/grid --formats $F --batches 1,16,64,128 --contexts 4096,32768 > $O/grid.log 2>&1
FLASHKV_DECODE_KEYS_M=0 timeout 100 python3 bench/gpu/bench_decode_quant.py --binary $B --out $O/grid-rows --no-cudnn --formats $F --batches 1,16,64,128 --contexts 4096,32768 > $O/grid-rows.log 2>&1
timeout 80 python3 bench/gpu/bench_decode_quant.py --binary $B --out $O/grid128k --formats $F --batches 1,16 --contexts 131072 > $O/grid128k.log 2>&1
FLASHKV_DECODE_KEYS_M=0 timeout 80 python3 bench/gpu/bench_decode_quant.py --binary $B --out $O/grid128k-rows --no-cudnn --formats $F --batches 1,16 --contexts 131072 > $O/grid128k-rows.log 2>&1
mkdir -p $O/splits
timeout 80 $B --formats bf16,fp8_e4m3,int8,int4 --batches 1 --contexts 32768,131072 --calls 30 --splits 0,8,16,24,32,48,64 > $O/splits/splits.jsonl 2> $O/splits.log
date -u >> $O/date.txt
NCU="ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats"
timeout 100 $NCU --kernel-name regex:decode_kernel --launch-count 6 $B --formats int4,int8,int4_g32 --batches 64 --contexts 32768 --calls 2 > $O/ncu-decode.txt 2>&1
date -u >> $O/date.txt
FLASHKV_TEST_SEED=1 timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $T \
  --gtest_filter='CudaQuantKVCache.DeviceCodesEqualTheCpuCodec*' > $O/sanitizer-memcheck.log 2>&1
date -u >> $O/date.txt
tar -czf $OUT/logs.tgz -C $O .
cp -r $O/grid $O/grid-rows $O/grid128k $O/grid128k-rows $O/splits $OUT/ 2>/dev/null; cp $O/gpu.txt $O/date.txt $O/ncu-decode.txt $OUT/
grep -h "PASSED\|FAILED \]" $O/tests-*.log | sort | uniq -c; grep -h "passed\|failed" $O/engine.log | tail -3
grep -h "ERROR SUMMARY\|PASSED\|FAILED" $O/sanitizer-*.log | tail -3; cat $O/date.txt
for g in grid grid-rows grid128k grid128k-rows; do echo "== $g"; grep -h "^| int4\|^| int8\|^| bf16 |\|^| fp8" $O/$g/*.md | grep -v "batched\|per_sequence" | awk -F'|' '{print $2,$3,$4,$5,$9,$11}'; done
grep -h "decode_kernel\|Duration\|DRAM Throughput\|Registers Per\|Issued Warp Per\|No Eligible" $O/ncu-decode.txt | head -40
tail -n 3 $O/grid.log $O/grid-rows.log $O/splits.log; grep -h decode $O/splits/splits.jsonl | head -60
