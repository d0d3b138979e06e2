#!/usr/bin/env bash
# run11 call 2: call 1's append shard failed once (seed 10139361453714188956: CudaKVStep.BatchedAppends... "step: an
# illegal memory access"); seed 1 under memcheck passed. Reproduce: that seed alone, the shard again with that seed,
# memcheck on that seed, and the test under 6 other seeds.
set -u
[ -d build/cuda/bin ] || tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs
O=/tmp/o2; mkdir -p $O; date -u > $O/date.txt
T=build/cuda/bin/flashkv_cuda_tests
S=10139361453714188956
F='CudaKVStep.BatchedAppendsEqualPerSequenceAppendsByteForByte'
FLASHKV_TEST_SEED=$S timeout 60 $T --gtest_filter=$F > $O/seed-alone.log 2>&1; echo "alone rc=$?" >> $O/rc.txt
FLASHKV_TEST_SEED=$S timeout 100 $T --gtest_filter='CudaKVStep.*:CudaQuantKVCache.*:CudaKVTraits.*' > $O/seed-shard.log 2>&1; echo "shard rc=$?" >> $O/rc.txt
FLASHKV_TEST_SEED=$S timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $T --gtest_filter=$F > $O/seed-memcheck.log 2>&1; echo "memcheck rc=$?" >> $O/rc.txt
for s in 2 3 4 5 6 7; do FLASHKV_TEST_SEED=$s timeout 40 $T --gtest_filter=$F > $O/s$s.log 2>&1; echo "seed $s rc=$?" >> $O/rc.txt; done
date -u >> $O/date.txt
tar -czf $OUT/logs.tgz -C $O .
cat $O/rc.txt $O/date.txt; grep -h "Failure\|illegal\|Invalid\|at 0x\|by thread\|ERROR SUMMARY\|kernel\b" $O/seed-*.log | head -40
grep -h -B2 -A12 "Invalid" $O/seed-memcheck.log | head -60
