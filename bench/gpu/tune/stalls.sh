#!/usr/bin/env bash
# Warp-stall breakdown (ncu, per issued instruction) of our backward kernels vs SDPA-flash's for one head dim.
#   OUT=... bench/gpu/tune/stalls.sh D SEQLEN [variant-substring]
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
d=$1 s=$2 filt=${3:-}
m='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio|smsp__issue_active.avg.pct_of_peak_sustained_active|l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum|l1tex__data_pipe_lsu_wavefronts_mem_shared.sum|smsp__inst_executed.sum'
TUNE_REPS=1 TUNE_WARMUP=0 TUNE_CAUSAL=0 TUNE_FILTER="$filt" timeout 150 ncu --clock-control none --metrics "$m" \
  -k regex:'bwd_kernel' -c 3 /tmp/tune-bin/tune_kernels bwd "$d" "$s" > "$OUT/stalls-ours-$d.txt" 2>&1
timeout 120 ncu --clock-control none --metrics "$m" -k regex:'flash_bwd_dq_dk_dv' -c 1 \
  python3 "$here/sdpa_once.py" "$d" "$s" 0 > "$OUT/stalls-sdpa-$d.txt" 2>&1
python3 - "$OUT/stalls-ours-$d.txt" "$OUT/stalls-sdpa-$d.txt" <<'PY'
import re, sys
for f in sys.argv[1:]:
    name = None
    for line in open(f):
        if re.match(r"^  \S.*\(\d+, \d+, \d+\)x", line):
            name = line.strip()[:90]
            print("==", name)
        m = re.match(r"^\s+(\S+)\s+(\S*)\s+([\d.,]+)\s*$", line)
        if m and name:
            k, v = m.group(1), float(m.group(3).replace(",", ""))
            k = k.replace("smsp__average_warps_issue_stalled_", "stall_").replace("_per_issue_active.ratio", "")
            if not k.startswith("stall_") or v >= 0.05:
                print(f"   {k:60s} {v:,.2f}")
PY
