#!/usr/bin/env bash
# run12 call 2: the vector append after call 1 — lane extremes by min / max instructions (the scan only for a zero
# extreme), codes by cvt.rni.sat.u8 + a packed min, an L2 prefetch of the next iteration's input rows — and the test
# that asserts which append kernel ran. Tests in concurrent shards + the engine; then the append A/B in one run:
# FLASHKV_APPEND_PREFETCH=1 / 0 / 1 (the bench at batch 128 x 32k, every format), Nsight Compute on the new kernel.
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
source <(sed -n '/^find_cublas() {/,/^}/p' scripts/gpu-run); find_cublas
O=/tmp/o2; mkdir -p $O; date -u > $O/date.txt
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
  --gtest_filter='CudaKVAppend.VectorKernelValueCheck*:CudaKVStep.Float32AndStrided*' > $O/sanitizer-memcheck.log 2>&1
date -u >> $O/date.txt
for v in 1 0 1; do
  mkdir -p $O/ab-pf$v
  FLASHKV_APPEND_PREFETCH=$v timeout 100 python3 bench/gpu/bench_decode_quant.py --binary $B --out $O/ab-pf$v --no-cudnn \
    --formats bf16,fp8_e4m3,fp8_e4m3_dynamic,int8,int4,int4_g32 --batches 128 --contexts 32768 --calls 5 > $O/ab-pf$v.log 2>&1
  grep -h "| batched" $O/ab-pf$v/*.md | sed "s/^/pf$v /" >> $O/ab.txt
done
date -u >> $O/date.txt
NCU="ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats"
timeout 90 $NCU --kernel-name regex:quant_append --launch-count 4 $B --formats int8,int4 --batches 64 --contexts 32768 --calls 2 > $O/ncu-append.txt 2>&1
date -u >> $O/date.txt
tar -czf $OUT/logs.tgz -C $O .
cp $O/gpu.txt $O/date.txt $O/ab.txt $O/ncu-append.txt $OUT/
grep -h "PASSED\|FAILED \]\|append-vec" $O/tests-*.log | sort | uniq -c; grep -h "passed\|failed" $O/engine.log | tail -3
grep -h "ERROR SUMMARY\|PASSED\|FAILED" $O/sanitizer-*.log; cat $O/date.txt $O/ab.txt
grep -h "append_vec\|Duration\|DRAM Throughput\|Registers Per\|Eligible Warps\|No Eligible\|Issued Warp Per" $O/ncu-append.txt | head -40
