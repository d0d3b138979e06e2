#!/usr/bin/env bash
# run12 call 4: carries the second part of the SmolLM2 GGUF (the machine stays warm between calls); meanwhile Nsight
# Compute on the int4_g32 / int4 / int8 decode kernels at batch 64 x 32k (the new 32-channel-group loop).
set -u
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs
O=/tmp/o4; mkdir -p $O; date -u > $O/date.txt; ls -la build/carry > $O/carry.txt
B=build/cuda/bin/flashkv_bench_decode_quant
NCU="ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats"
timeout 120 $NCU --kernel-name regex:decode_kernel --launch-count 6 $B --formats int4_g32,int4,int8 --batches 64 --contexts 32768 --calls 2 > $O/ncu-decode.txt 2>&1
date -u >> $O/date.txt
cp $O/* $OUT/
cat $O/carry.txt $O/date.txt
grep -h "decode_kernel\|Duration\|DRAM Throughput\|Registers Per\|Eligible Warps\|No Eligible\|Issued Warp Per\|Local" $O/ncu-decode.txt | head -60
