#!/usr/bin/env bash
# run6 call 3: the FP8 lse probe (flashkv vs FA3 vs float64 vs the hardware's e4m3 matmul), then issue 14's engine
# benchmark (scripts/gpu-run engine-bench: 8B-shaped + SmolLM2-shaped models, transformers anchor, same run).
set -u
tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
O=/tmp/o; mkdir -p $O; date -u > $O/date.txt; nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fa3-site .whl/fa3_fwd-*.whl > $O/fa3-install.log 2>&1
PYTHONPATH=/tmp/fa3-site:$PYTHONPATH timeout 60 python3 bench/gpu/fp8_lse_probe.py --out $O > $O/fp8-lse-probe.log 2>&1
date -u >> $O/date.txt
tar -czf $OUT/probe.tgz -C $O .
OUT=$O FLASHKV_ENGINE_BENCH_TIMEOUT=480 timeout 490 scripts/gpu-run engine-bench > $O/engine-bench-run.log 2>&1
date -u >> $O/date.txt
tar -czf $OUT/engine.tgz -C $O .
cat $O/fp8-lse-probe.log | tail -8; tail -40 $O/engine-bench-run.log
