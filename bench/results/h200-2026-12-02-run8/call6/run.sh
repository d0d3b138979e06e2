#!/usr/bin/env bash
# run8 call 6 (issue 11): as call 5, load points (Q, dO per head dim 64 / 128 / 256) and epilogue mask: m1 330100/6, m2 321000/6, m3 230200/4, m4 310300/4, m5 132000/4, m6 303000/4, m7 330100/4, m8 331000/4; n5, n6 of call 5 again; v0 the tree before, vprev the previous release.
set -u
O=$OUT; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
for pass in 1 2; do for v in vprev v0 n5 n6 m1 m2 m3 m4 m5 m6 m7 m8; do
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
