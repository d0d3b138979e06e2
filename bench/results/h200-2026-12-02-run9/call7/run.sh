#!/usr/bin/env bash
# run9 call 7 (issue 14, for the next session): where the batch-1 / 8k decode step of the 8B-shaped model goes. The
# engine benchmark writes the seeded 8B GGUF (bf16 point only, no transformers), then ncu times every kernel of a few
# decode steps (per-kernel summary; CUDA graphs profiled per node).
set -u
[[ -x build/cuda/bin/flashkv ]] || tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
source <(sed -n '/^find_cublas() {/,/^}/p' scripts/gpu-run); find_cublas
O=$OUT; mkdir -p $O/eb /dev/shm/eb; date -u > $O/date.txt
timeout 110 python3 bench/gpu/engine_bench.py --out $O/eb --flashkv build/cuda/bin/flashkv --models llama3-8b --formats bf16 \
  --contexts 8k --batches 1 --no-hf --keep-gguf --work-dir /dev/shm/eb --budget-8b 20 > $O/eb.log 2>&1
date -u >> $O/date.txt
G=$(ls /dev/shm/eb/*.gguf | head -1); echo "gguf: $G" >> $O/eb.log
timeout 130 ncu --clock-control none --print-summary per-kernel --metrics gpu__time_duration.sum -c 900 \
  build/cuda/bin/flashkv bench engine --model "$G" --device cuda --kv-cache bf16 --contexts 8k --batch 1 --fill synthetic \
  --warmup 1 --n-gen 2 --point-seconds 0.05 > $O/ncu.txt 2>&1
date -u >> $O/date.txt
true
tail -5 $O/eb.log; grep -E "^  [a-zA-Z_].*\(|gpu__time_duration" $O/ncu.txt | head -80; cat $O/date.txt
