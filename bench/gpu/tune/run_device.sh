#!/usr/bin/env bash
# On the GPU machine: build the tuning harness, time all variants, and profile ours vs SDPA-flash with ncu.
#   OUT=... bench/gpu/tune/run_device.sh [tune args...]
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
OUT=${OUT:-/tmp/tune-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$(date +%s)
"$here/build.sh" /tmp/tune-bin > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
/tmp/tune-bin/tune_kernels "$@" 2>&1 | tee "$OUT/tune.txt"
if [[ "${TUNE_NCU:-1}" == 1 ]] && command -v ncu >/dev/null; then
  sec=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats --section WarpStateStats
       --section LaunchStats --section Occupancy)
  TUNE_REPS=1 TUNE_WARMUP=0 TUNE_CAUSAL=0 timeout 150 ncu --clock-control none "${sec[@]}" -k regex:'fwd_kernel|bwd_kernel' -c 12 \
    /tmp/tune-bin/tune_kernels "${NCU_MODE:-all}" "${NCU_D:-128}" "${NCU_S:-4096}" > "$OUT/ncu-ours.txt" 2>&1
  timeout 120 ncu --clock-control none "${sec[@]}" -k regex:'flash_fwd|flash_bwd' -c 3 \
    python3 "$here/sdpa_once.py" "${NCU_D:-128}" "${NCU_S:-4096}" 0 > "$OUT/ncu-sdpa.txt" 2>&1
  for f in "$OUT"/ncu-*.txt; do
    echo "== $f"
    grep -E "^  [a-z_].*\(|Duration|Issue Slots Busy|L1/TEX Cache Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Executed Instructions  " "$f" | sed 's/(Flash_.*//; s/(FwdParams).*//; s/(BwdParams).*//' | cut -c1-110 | head -80
  done
fi
