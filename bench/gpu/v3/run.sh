#!/usr/bin/env bash
# On the H200 (device tool), from a copy of the repository root: FA3 wheel install, libv3.so (prebuilt, or built
# here with nvcc if it does not load), then `harness.py drive` (check, bench, tables) with logs and JSON in $OUT.
#   OUT=... bench/gpu/v3/run.sh [prebuilt libv3.so] [--seqlens 512,2048,8192,16384]
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../../.."
OUT=${OUT:-/tmp/v3-out}
mkdir -p "$OUT"
lib="${1:-$here/prebuilt/libv3.so}"; shift || true
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,power.limit \
  --format=csv,noheader | tee "$OUT/gpu.txt"
whl=$(ls "$root"/.whl/fa3_fwd-*.whl "$root"/../.whl/fa3_fwd-*.whl 2>/dev/null | head -1)
if [[ -n "$whl" ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$whl" && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  cp /tmp/site/fa3_fwd_config.py /tmp/site/flash_attn_config.py 2>/dev/null || true
fi
if ! python3 -c "import ctypes, sys; ctypes.CDLL(sys.argv[1])" "$lib" 2> /tmp/v3-load.txt; then
  echo "prebuilt library does not load ($(head -c 300 /tmp/v3-load.txt)); building with nvcc"
  "$here/build.sh" /tmp/v3lib -Xptxas -v > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  lib=/tmp/v3lib/libv3.so
fi
echo "setup $(( $(date +%s) - t0 )) s"
PYTHONUNBUFFERED=1 timeout "${V3_TIMEOUT:-500}" python3 "$here/harness.py" drive "$lib" "$OUT" "$@" > "$OUT/harness.log" 2>&1
rc=$?
grep -E "^(check|fp8 baseline|FP8 baseline|DONE .*FAIL|HANG|stage exited|bench skips|FA3|Traceback|RuntimeError)" "$OUT/harness.log" | cut -c1-300 | tail -30
echo "harness rc $rc, total $(( $(date +%s) - t0 )) s"
# ncu on one cell (ours vs FA3), when there is time left: V3_NCU="d seqlen causal", empty to skip; V3_NCU_WHO =
# the kernels to profile (default "ws/hd<d>/full fa3"; FP8: "fp8/hd<d>/full fa3_fp8").
if [[ -n "${V3_NCU-128 8192 0}" ]] && command -v ncu > /dev/null && (( $(date +%s) - t0 < ${V3_NCU_UNTIL:-240} )); then
  read -r nd ns nc <<< "${V3_NCU-128 8192 0}"
  m=$(ncu --query-metrics --chip gh100 2>/dev/null | awk '{print $1}' |
      grep -E '^sm__(pipe_tensor_op_gmma_cycles_active|inst_executed_pipe_xu|pipe_fma_cycles_active|pipe_alu_cycles_active|pipe_fmaheavy_cycles_active|inst_executed_pipe_fma|inst_executed_pipe_alu)$' |
      sed 's/$/.avg.pct_of_peak_sustained_active/' | paste -sd, -)
  for who in ${V3_NCU_WHO:-ws/hd$nd/full fa3}; do
    timeout 90 ncu --clock-control none --profile-from-start off -c 2 --section SpeedOfLight \
      --section ComputeWorkloadAnalysis --section WarpStateStats --section InstructionStats ${m:+--metrics $m} \
      python3 "$here/harness.py" once "$lib" "$who" $nd $ns $nc >> "$OUT/ncu.txt" 2>&1
  done
  grep -E "^  [a-zA-Z_].*\(|Duration|Issue Slots Busy|Executed Ipc A|SM Busy|Compute \(SM\) Th|Memory Th|Registers Per|Stall|Warp Cycles Per Issued|sm__|pct" "$OUT/ncu.txt" | cut -c1-130 | head -70
fi
python3 "$here/harness.py" table "$OUT" 2>/dev/null | grep -v "^ws/\|^sm90v1/\|^fp8/"
