#!/usr/bin/env bash
# run8 call 8 (issue 11): call 7's prefill grid again, complete (call 7's ran past its 140 s limit in the previous
# release's worker at hd256): same build (main f4b898c), the previous release and FA3 / cuDNN / SDPA in the same table.
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
O=/tmp/o; mkdir -p $O; date -u > $O/date.txt; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
OUT=$O FLASHKV_BENCH_SECTIONS=prefill FLASHKV_BENCH_TIMEOUT=290 FLASHKV_PREV_LIBRARY=$PWD/build/carry/prev-libflashkv.so \
  timeout 295 scripts/gpu-run bench > $O/bench-run.log 2>&1
date -u >> $O/date.txt
tar -czf $OUT/bench.tgz -C $O .
cp $O/*.md $O/*.json $OUT/ 2>/dev/null; ls $O; cat $O/date.txt
