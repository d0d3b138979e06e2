#!/usr/bin/env bash
# run11 call 1: the tree at 2cc932b (a rejected append refills the pages it gives back with 0xFF; its test had not run
# on a GPU): the append / decode / trait tests and the engine, compute-sanitizer memcheck on the append tests, then
# Nsight Compute on the vector append kernel and the decode kernels (kernel time against the bench's wall time).
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
source <(sed -n '/^find_cublas() {/,/^}/p' scripts/gpu-run); find_cublas
O=/tmp/o1; mkdir -p $O; date -u > $O/date.txt; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
B=build/cuda/bin/flashkv_bench_decode_quant
T=build/cuda/bin/flashkv_cuda_tests
timeout 200 $T --gtest_filter='CudaKVStep.*:CudaQuantKVCache.*:CudaKVTraits.*' > $O/tests-append.log 2>&1 &
timeout 200 $T --gtest_filter='CudaDecode*:CudaKVCache*:CudaEngine*:CudaEval*' > $O/tests-decode.log 2>&1 &
OUT=$O timeout 200 scripts/gpu-run engine > $O/engine.log 2>&1 &
wait
date -u >> $O/date.txt
FLASHKV_TEST_SEED=1 timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $T \
  --gtest_filter='CudaKVStep.*:CudaQuantKVCache.AppendErrorsChangeNothing' > $O/sanitizer-memcheck.log 2>&1
date -u >> $O/date.txt
NCU="ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats --section MemoryWorkloadAnalysis"
timeout 120 $NCU --kernel-name regex:append --launch-count 6 $B --formats int8,int4,fp8_e4m3 --batches 64 --contexts 32768 --calls 3 > $O/ncu-append.txt 2>&1
timeout 120 $NCU --kernel-name regex:decode --launch-count 6 $B --formats bf16,int8,int4 --batches 64 --contexts 32768 --calls 2 > $O/ncu-decode.txt 2>&1
timeout 60 $B --formats bf16,int8,int4,fp8_e4m3 --batches 1,64 --contexts 32768 --calls 10 > $O/dq.jsonl 2> $O/dq.err
date -u >> $O/date.txt
tar -czf $OUT/logs.tgz -C $O .
cp $O/gpu.txt $O/date.txt $O/dq.jsonl $O/ncu-append.txt $O/ncu-decode.txt $OUT/
grep -h "PASSED\|FAILED \]" $O/tests-*.log | sort | uniq -c; grep -h "passed\|failed" $O/*.log | tail -4
grep -h "ERROR SUMMARY\|PASSED\|FAILED" $O/sanitizer-*.log; cat $O/date.txt
grep -h "append\|decode\|Duration\|Memory Throughput\|DRAM Throughput\|Achieved Occupancy\|Registers Per\|Eligible Warps\|No Eligible\|Block Size\|Grid Size\|Warp Cycles Per Issued" $O/ncu-*.txt | head -150
