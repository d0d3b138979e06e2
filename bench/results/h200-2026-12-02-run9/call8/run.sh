#!/usr/bin/env bash
# run9 call 8: the same build (warm machine): the engine benchmark's batch-1 / 8k point twice more (bf16 and fp8).
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python; source <(sed -n '/^find_cublas() {/,/^}/p' scripts/gpu-run); find_cublas >/dev/null; for i in 1 2; do mkdir -p $OUT/rep$i; timeout 75 python3 bench/gpu/engine_bench.py --out $OUT/rep$i --flashkv build/cuda/bin/flashkv --models llama3-8b --formats bf16,fp8_e4m3 --contexts 8k --batches 1 --no-hf --budget-8b 20 > $OUT/rep$i/eb.log 2>&1; grep "batch 1, 8k" $OUT/rep$i/eb.log; done
