#!/usr/bin/env bash
# run8 call 1 (issue 11): where the sm80 family's backward loses 3-4% to the previous release (run7 call 3).
# In one process, interleaved (bench/gpu/tune/ab_bwd.py): this build vs the previous release, kernel family sm80;
# then ncu on the main backward kernel of each (one call each) and per-kernel durations of the whole backward.
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
O=$OUT; date -u > $O/date.txt; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
A=$PWD/build/cuda/devlibs/libflashkv.so B=$PWD/build/carry/prev-libflashkv.so
timeout 150 python3 bench/gpu/tune/ab_bwd.py --a $A --b $B --kernel sm80 --head-dims 64,128,256 --seqlens 2048,16384 \
  --causal 0,1 > $O/ab.md 2>&1; cat $O/ab.md
sec=(--section SpeedOfLight --section WarpStateStats --section InstructionStats --section LaunchStats --section Occupancy
     --section MemoryWorkloadAnalysis --section SchedulerStats)
for d in 64 128; do for w in A B; do
  timeout 100 ncu --clock-control none "${sec[@]}" -k regex:'bwd_kernel' -c 1 python3 bench/gpu/tune/ab_bwd.py --a $A --b $B \
    --kernel sm80 --head-dims $d --seqlens 4096 --causal 0 --only $w --calls 1 > $O/ncu-$d-$w.txt 2>&1
  timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum -c 12 python3 bench/gpu/tune/ab_bwd.py --a $A --b $B \
    --kernel sm80 --head-dims $d --seqlens 4096 --causal 0 --only $w --calls 2 > $O/dur-$d-$w.txt 2>&1
done; done
for f in $O/ncu-*.txt; do echo "== $f"; grep -E "Duration|Issue Slots Busy|Executed Instructions  |Warp Cycles Per Issued|Stall|Registers Per|Achieved Occupancy|L2 Hit|DRAM Throughput|Mem Busy|Eligible Warps|No Eligible" $f | head -40; done
for f in $O/dur-*.txt; do echo "== $f"; grep -E "^  [a-zA-Z_].*\(|gpu__time_duration" $f | sed 's/(BwdParams).*//;s/(FwdParams).*//' | cut -c1-140 | paste - - | head -14; done
date -u >> $O/date.txt
