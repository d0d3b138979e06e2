#!/usr/bin/env bash
# run8 call 3 (issue 11): the sm80 backward (hd64, hd128, non-causal + causal) in the tuning harness, built here
# (bench/gpu/tune/tune_main.cu + the two configurations; the committed bench/gpu/tune/build_bwd_variants.sh builds the same) from this tree with variant switches,
# and from the previous release's tree (vprev); run in turn, twice, on the same GPU.
#   v0 this tree; v1 -DFLASHKV_TUNE_EPI (epilogue rebuilds its block info at every head dim); v2 -DFLASHKV_TUNE_LB
#   (__launch_bounds__ without min blocks); v3 -DFLASHKV_TUNE_LATE_LOAD (next Q/dO block issued after phase 1's MMAs);
#   v4 = v1 + v2; vprev the previous release 88b7f60's kernel and harness.
set -u
O=$OUT; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
for pass in 1 2; do for v in vprev v0 v1 v2 v3 v4; do
  echo "== $v pass $pass"; TUNE_REPS=11 timeout 60 build/tune-carry/$v bwd 64,128 4096,16384 2>&1 | grep -v "^device"
done; done | tee $O/tune.txt
