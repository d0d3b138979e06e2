#!/usr/bin/env bash
# run9 call 4 (issue 14): the same build as call 3; the generation benchmark (scripts/gpu-run engine-bench: the
# Llama-3-8B-shaped and SmolLM2-shaped models, transformers anchor in the same run).
set -u
[[ -x build/cuda/bin/flashkv ]] || tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
O=/tmp/o4; mkdir -p $O; date -u > $O/date.txt; nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
OUT=$O/eb FLASHKV_ENGINE_BENCH_TIMEOUT=320 timeout 330 scripts/gpu-run engine-bench > $O/engine-bench-run.log 2>&1
date -u >> $O/date.txt
tar -czf $OUT/all.tgz -C $O .
cp -r $O/eb $OUT/ 2>/dev/null; cp $O/gpu.txt $O/date.txt $OUT/
cat $O/date.txt; tail -30 $O/engine-bench-run.log
