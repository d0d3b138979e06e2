#!/usr/bin/env bash
# run10 call 5: the quantized vector append with two rows per lane loaded before either is encoded (more bytes in
# flight): the append tests (codes vs the CPU codec byte for byte, errors, the engine step's appends), then the append
# and decode grid (same command as calls 1-3).
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python
O=/tmp/o5; mkdir -p $O/dq; date -u > $O/date.txt; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
timeout 200 build/cuda/bin/flashkv_cuda_tests --gtest_filter='CudaKVStep.*:CudaQuantKVCache.*:CudaKVTraits.DeviceEncode*' > $O/tests-append.log 2>&1
date -u >> $O/date.txt
timeout 170 python3 bench/gpu/bench_decode_quant.py --binary build/cuda/bin/flashkv_bench_decode_quant --out $O/dq > $O/dq.log 2>&1
date -u >> $O/date.txt
mkdir -p $OUT/dq; cp $O/dq/*.md $O/dq/*.json $OUT/dq/ 2>/dev/null; cp $O/gpu.txt $O/date.txt $O/tests-append.log $OUT/
grep -h "PASSED\|FAILED" $O/tests-append.log; cat $O/date.txt; grep -A24 "^| format | mode" $O/dq/*.md | head -26
