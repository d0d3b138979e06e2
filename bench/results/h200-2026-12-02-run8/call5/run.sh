#!/usr/bin/env bash
# run8 call 5 (issue 11): the load point of the next query block (kQLoadAt / kDoLoadAt) and the epilogue switch per head dim, in the tuning harness, twice each, in turn. n0 = the parametrized code at its defaults; nK: -DFLASHKV_TUNE_BWD_LOAD_AT=QD64 QD128 QD256 (Q point, dO point per head dim) -DFLASHKV_TUNE_BWD_EPI=mask (bit 0 hd64, bit 1 hd128, bit 2 hd256): n1 331100/5, n2 221200/5, n3 231300/5, n4 322100/5, n5 331100/6, n6 130100/5, n7 310100/5, n8 222200/4, n9 113300/5; v0 the tree before, vprev the previous release.
set -u
O=$OUT; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
for pass in 1 2; do for v in vprev v0 n0 n1 n2 n3 n4 n5 n6 n7 n8 n9; do
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
