#!/usr/bin/env bash
# run8 call 4 (issue 11): more sm80-backward variants in the tuning harness (as call 3), twice each, in turn.
#   v5 EPI + LATE_LOAD; v6 LATE_LOAD2 (next Q/dO issued before phase 3); v7 EPI + LATE_LOAD2; v8 BYVAL (block info
#   copied into the mainloop); v9 LATE_LOAD3 (issued after the P/dS barrier, before phase 2); v10 EPI + LATE_LOAD3;
#   v11 EPI + BYVAL; v0, v1, v3, vprev as in call 3.
set -u
O=$OUT; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
for pass in 1 2; do for v in vprev v0 v1 v3 v5 v6 v7 v8 v9 v10 v11; do
  echo "== $v pass $pass"; TUNE_REPS=9 timeout 60 build/tune-carry/$v bwd 64,128 4096,16384 2>&1 | grep -v "^device\|^mode"
done; done > $O/tune.txt
python3 - $O/tune.txt <<'PY'
import re, sys, collections
t = collections.defaultdict(list); v = None
for line in open(sys.argv[1]):
    m = re.match(r"== (\S+) pass", line)
    if m: v = m.group(1); continue
    f = line.split()
    if len(f) >= 8 and f[0] == "bwd": t[(v, f[1], f[2], f[3])].append(float(f[-3]))
cells = sorted({k[1:] for k in t}, key=lambda c: (int(c[0]), int(c[1]), c[2]))
vs = list(dict.fromkeys(k[0] for k in t))
print("| variant | " + " | ".join(f"d{c[0]} s{c[1]} c{c[2]}" for c in cells) + " |")
for x in vs:
    print(f"| {x} | " + " | ".join(f"{min(t[(x,) + c]):.3f} ({min(t[('vprev',) + c]) / min(t[(x,) + c]):.3f})" for c in cells) + " |")
PY
