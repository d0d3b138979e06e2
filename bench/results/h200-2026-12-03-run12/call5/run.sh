#!/usr/bin/env bash
# run12 call 5: joins the SmolLM2 GGUF's three parts (calls 3-5), checks its sha256, runs the SmolLM2 GPU tests and the
# passkey retrieval grid of issue 13 on the GPU at 1k .. 8k (5 depths x 3 keys per cell; every device format against
# the GPU's bf16 cache; heatmaps + JSON).
set -u
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
source <(sed -n '/^find_cublas() {/,/^}/p' scripts/gpu-run); find_cublas
O=/tmp/o5; mkdir -p $O models/smollm2-135m; date -u > $O/date.txt
ls -la build/carry > $O/carry.txt
cat build/carry/sm.part0 build/carry/sm.part1 build/carry/sm.part2 > models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf
echo "$(cat build/carry/sm.sha)  models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c > $O/sha.txt 2>&1
cat $O/sha.txt
timeout 200 build/cuda/bin/flashkv_engine_cuda_tests --gtest_filter='*SmolLM2*' > $O/smollm2-tests.log 2>&1; echo "smollm2 tests rc=$?" >> $O/rc.txt
date -u >> $O/date.txt
mkdir -p $O/pk
CMD="build/cuda/bin/flashkv eval passkey --model smollm2-135m --device cuda --kv-cache fp8_e4m3 fp8_e4m3_dynamic int8 int4 int4_g32 --contexts 1k,2k,4k,8k --depths 0,25,50,75,100 --keys 3 --heatmap-dir $O/pk --json $O/pk/passkey-gpu-8k.json --no-progress"
echo "$CMD" > $O/pk/command.txt
timeout 330 $CMD > $O/pk/passkey-gpu-8k.txt 2>&1; echo "passkey rc=$?" >> $O/rc.txt
date -u >> $O/date.txt
cp -r $O/pk $OUT/; cp $O/rc.txt $O/date.txt $O/sha.txt $OUT/
tar -czf $OUT/logs.tgz -C $O .
cat $O/rc.txt $O/date.txt
grep -v "^\[ RUN\|^\[       OK" $O/smollm2-tests.log | tail -15
cat $O/pk/passkey-gpu-8k.txt | tail -30
