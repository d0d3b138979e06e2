#!/usr/bin/env bash
# run11 call 3: call 2 did not reproduce call 1's failure (same seed alone / in its shard / under memcheck, 6 other
# seeds: all pass). Call 1 ran three test processes at once on the GPU: repeat that — the step test in 3 concurrent
# loops (random seeds, 15 rounds each), then the call-1 shards concurrently, 3 times.
set -u
[ -d build/cuda/bin ] || tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
O=/tmp/o3; mkdir -p $O; date -u > $O/date.txt
T=build/cuda/bin/flashkv_cuda_tests
F='CudaKVStep.*'
loop() { for r in $(seq 1 15); do timeout 40 $T --gtest_filter=$F > $O/loop$1-$r.log 2>&1; echo "loop $1 round $r rc=$?" >> $O/rc$1.txt; done; }
loop 1 & loop 2 & loop 3 & wait
date -u >> $O/date.txt
for r in 1 2 3; do
  timeout 100 $T --gtest_filter='CudaKVStep.*:CudaQuantKVCache.*:CudaKVTraits.*' > $O/shardA-$r.log 2>&1; echo "shardA $r rc=$?" >> $O/rcS.txt &
  timeout 100 $T --gtest_filter='CudaDecode*:CudaKVCache*' > $O/shardB-$r.log 2>&1; echo "shardB $r rc=$?" >> $O/rcS.txt &
  wait
done
date -u >> $O/date.txt
cat $O/rc*.txt | grep -v "rc=0" ; cat $O/rc*.txt | grep -c "rc=0"; cat $O/date.txt
for f in $(grep -l "Failure\|illegal" $O/*.log); do echo "== $f"; head -1 $f; grep -B3 -A3 "Failure\|illegal" $f | head -20; done 2>/dev/null | head -80
tar -czf $OUT/logs.tgz -C $O .
