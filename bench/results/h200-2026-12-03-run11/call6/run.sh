#!/usr/bin/env bash
# run11 call 6: SmolLM2-135M on the GPU for the first time (its tests skipped on every earlier device run: the model was
# never carried). Joins the three parts carried by calls 4-6, checks the sha256, runs the SmolLM2 engine / eval tests
# (GPU vs the CPU engine, passkey retrieval) and scripts/gpu-run engine (which then runs the SmolLM2 CLI lines too).
set -u
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
source <(sed -n '/^find_cublas() {/,/^}/p' scripts/gpu-run); find_cublas
O=/tmp/o6; mkdir -p $O models/smollm2-135m; date -u > $O/date.txt
ls -la build/carry > $O/carry.txt
cat build/carry/sm.part0 build/carry/sm.part1 build/carry/sm.part2 > models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf
echo "$(cat build/carry/sm.sha)  models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c > $O/sha.txt 2>&1
cat $O/sha.txt
timeout 300 build/cuda/bin/flashkv_engine_cuda_tests --gtest_filter='*SmolLM2*' > $O/smollm2-tests.log 2>&1; echo "engine tests rc=$?" >> $O/rc.txt
date -u >> $O/date.txt
OUT=$O timeout 250 scripts/gpu-run engine > $O/engine.log 2>&1; echo "gpu-run engine rc=$?" >> $O/rc.txt
date -u >> $O/date.txt
cat $O/rc.txt $O/date.txt
grep -v "^\[ RUN\|^\[       OK" $O/smollm2-tests.log | tail -40
tail -25 $O/engine.log
tar -czf $OUT/logs.tgz -C $O .
