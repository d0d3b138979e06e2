#!/usr/bin/env bash
# run12 call 1: the new vector quantize-on-write append (src/cuda/decode_append_quant_vec.cu: 8 / 16 / 32 channels per
# lane, multiply-high row split, packed value check). Tests in three concurrent shards (run11's lesson: concurrency
# finds stream races) + the engine, compute-sanitizer memcheck on the new append tests, Nsight Compute on the append
# kernel, then the decode / append grid of issue 12 (bench_decode_quant.py: JSON + markdown).
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
source <(sed -n '/^find_cublas() {/,/^}/p' scripts/gpu-run); find_cublas
O=/tmp/o1; mkdir -p $O; date -u > $O/date.txt
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
NCU="ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats"
timeout 90 $NCU --kernel-name regex:quant_append --launch-count 6 $B --formats int8,int4,fp8_e4m3_dynamic --batches 64 --contexts 32768 --calls 2 > $O/ncu-append.txt 2>&1
date -u >> $O/date.txt
mkdir -p $O/grid
timeout 200 python3 bench/gpu/bench_decode_quant.py --binary $B --out $O/grid \
  --formats bf16,fp8_e4m3,fp8_e4m3_dynamic,int8,int4,int4_g32 --batches 1,16,64,128 --contexts 4096,32768 > $O/grid.log 2>&1
date -u >> $O/date.txt
tar -czf $OUT/logs.tgz -C $O .
cp -r $O/grid $OUT/ 2>/dev/null; cp $O/gpu.txt $O/date.txt $O/ncu-append.txt $OUT/
grep -h "PASSED\|FAILED \]" $O/tests-*.log | sort | uniq -c; grep -h "passed\|failed" $O/engine.log | tail -3
grep -h "ERROR SUMMARY\|PASSED\|FAILED" $O/sanitizer-*.log; cat $O/date.txt
grep -h "append_vec\|Duration\|DRAM Throughput\|Registers Per\|Eligible Warps\|No Eligible\|Grid Size\|Issued Warp Per" $O/ncu-append.txt | head -60
grep -h "^| .*append\|^| fp8\|^| int\|^| bf16\|^| cudnn" $O/grid/*.md | head -80; tail -5 $O/grid.log
