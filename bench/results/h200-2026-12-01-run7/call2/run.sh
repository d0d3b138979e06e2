#!/usr/bin/env bash
# run7 call 2 (issue 15): the FP8 variant set of bench/gpu/v3 (branch fp8-speed, prebuilt libv3.so carried in
# build/carry-fp8) checked against float64 and timed next to FA3 FP8 (wheel) on the FA3-paper grid, 2 passes.
set -u
O=/tmp/o; mkdir -p $O; date -u > $O/date.txt
OUT=$O V3_FAMILIES=fp8 V3_TUS="v3_api.cu v3_fp8_*.cu" V3_NCU= V3_TIMEOUT=250 bench/gpu/v3/run.sh build/carry-fp8/libv3.so --passes 2
date -u >> $O/date.txt
tar -czf $OUT/fp8-variants.tgz -C $O .
