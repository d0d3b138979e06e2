#!/usr/bin/env bash
# run8 call 2 (issue 11): warp-stall breakdown and shared-memory wavefronts / bank conflicts of the sm80 backward
# (hd64, hd128; seqlen 4096, non-causal), this build (A) vs the previous release (B), one ncu pass each.
set -u
[[ -d build/cuda/devlibs ]] || tar -xJf build/carry/cuda.tar.xz
export LD_LIBRARY_PATH=$PWD/build/cuda/devlibs PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so
O=$OUT; date -u > $O/date.txt
A=$PWD/build/cuda/devlibs/libflashkv.so B=$PWD/build/carry/prev-libflashkv.so
m='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio|smsp__issue_active.avg.pct_of_peak_sustained_active|l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_(ld|st).sum|l1tex__data_pipe_lsu_wavefronts_mem_shared_op_(ld|st).sum|smsp__inst_executed.sum|smsp__inst_executed_op_ldsm.sum|l1tex__t_sectors_pipe_lsu_mem_global_op_red.sum|l1tex__t_requests_pipe_lsu_mem_global_op_red.sum|smsp__cycles_active.avg|sm__cycles_elapsed.avg'
for d in 64 128; do for w in A B; do
  timeout 100 ncu --clock-control none --metrics "$m" -k regex:'bwd_kernel' -c 1 python3 bench/gpu/tune/ab_bwd.py --a $A --b $B \
    --kernel sm80 --head-dims $d --seqlens 4096 --causal 0 --only $w --calls 1 > $O/m-$d-$w.txt 2>&1
done; done
python3 - $O/m-*.txt > $O/stalls.md <<'PY'
import re, sys, collections
cols = collections.OrderedDict()
keys = []
for f in sys.argv[1:]:
    vals = {}
    for line in open(f):
        m = re.match(r"^\s+(\S+)\s+(\S*)\s+([\d.,]+)\s*$", line)
        if m:
            k = m.group(1).replace("smsp__average_warps_issue_stalled_", "stall_").replace("_per_issue_active.ratio", "")
            vals[k] = float(m.group(3).replace(",", ""))
            if k not in keys: keys.append(k)
    cols[f.rsplit("/", 1)[1][2:-4]] = vals
print("| metric | " + " | ".join(cols) + " |")
print("|---|" + "---|" * len(cols))
for k in keys:
    v = [cols[c].get(k, 0) for c in cols]
    if k.startswith("stall_") and max(v) < 0.02: continue
    print(f"| {k} | " + " | ".join(f"{x:,.3f}" if x < 100 else f"{x:,.0f}" for x in v) + " |")
PY
cat $O/stalls.md; date -u >> $O/date.txt
