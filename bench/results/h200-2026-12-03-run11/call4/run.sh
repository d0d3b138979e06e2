#!/usr/bin/env bash
# run11 call 4: the fix (the KV cache copy / fill hooks synchronize; cudaMemcpy D2D / pageable H2D and cudaMemset return
# before the copy is done, unordered with a cudaStreamNonBlocking stream) and the 2x split-vs-unsplit bound: call 3 again,
# plus the engine (gpu-run engine).
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
source <(sed -n '/^find_cublas() {/,/^}/p' scripts/gpu-run); find_cublas
O=/tmp/o4; mkdir -p $O; date -u > $O/date.txt
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
OUT=$O timeout 200 scripts/gpu-run engine > $O/engine.log 2>&1; echo "engine rc=$?" >> $O/rcE.txt
date -u >> $O/date.txt
cat $O/rc*.txt | grep -v "rc=0" ; cat $O/rc*.txt | grep -c "rc=0"; cat $O/date.txt
for f in $(grep -l "Failure\|illegal" $O/*.log); do echo "== $f"; head -1 $f; grep -B3 -A3 "Failure\|illegal" $f | head -20; done 2>/dev/null | head -80
tail -3 $O/engine.log
tar -czf $OUT/logs.tgz -C $O .
