#!/usr/bin/env python3
"""Compares the hottest loop (the largest backward branch span with HMMA/HGMMA) of matching kernels in two SASS
listings (`cuobjdump -sass`): per kernel pair, the loop's instruction count and the opcodes whose counts differ, and
the local-memory traffic (STL/LDL) inside the loop. Kernels are matched by a key made from their demangled name
(family, kind, config numbers, softcap flag), so a restructured kernel (new template names) meets its old self.

    bench/gpu/tune/sass_compare.py before.sass after.sass
"""
import collections
import re
import subprocess
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from sass_mix import functions  # noqa: E402


def key(mangled):
    d = subprocess.run(["c++filt", mangled], capture_output=True, text=True).stdout
    fam = "sm90" if "sm90::" in d else "sm80"
    kind = "bwd" if "bwd_kernel" in d else ("fwd_v1" if "fwd_v1" in d else ("fwd" if "fwd_kernel" in d else None))
    if kind is None:
        return None
    m = re.search(r"(?:Fwd|Bwd|FwdV1)Config<([0-9, a-z]+)>", d)
    cfg = re.sub(r",? ?(true|false)$", "", m.group(1)) if m else "?"
    soft = "softcap" if re.search(r"(bf16|__half), true>", d.replace("__nv_bfloat16", "bf16")) else ""
    return f"{fam} {kind} <{cfg}> {soft}".strip()


def hot_loop(ins):
    best = None
    for addr, op, args in ins:
        t = re.search(r"0x([0-9a-f]+)", args) if op.startswith("BRA") else None
        if t and int(t.group(1), 16) < addr:
            lo = int(t.group(1), 16)
            body = [o for x, o, _ in ins if lo <= x <= addr]
            mma = sum(o.startswith(("HMMA", "HGMMA")) for o in body)
            if mma and (best is None or len(body) > len(best)):
                best = body
    return collections.Counter(o.split(".")[0] for o in best or [])


def load(path):
    out = {}
    for name, ins in functions(open(path).read()):
        k = key(name)
        if k:
            out[k] = hot_loop(ins)
    return out


def main():
    a, b = load(sys.argv[1]), load(sys.argv[2])
    for k in sorted(set(a) & set(b)):
        ca, cb = a[k], b[k]
        diff = {op: cb[op] - ca[op] for op in set(ca) | set(cb) if cb[op] != ca[op]}
        d = ", ".join(f"{op} {v:+d}" for op, v in sorted(diff.items(), key=lambda x: -abs(x[1])))
        print(f"{k}: hot loop {sum(ca.values())} -> {sum(cb.values())} instr, STL/LDL {ca['STL']}/{ca['LDL']} -> "
              f"{cb['STL']}/{cb['LDL']}" + (f"; {d}" if d else "; identical mix"))
    for k in sorted(set(a) ^ set(b)):
        print(f"{k}: only in {'before' if k in a else 'after'}")


if __name__ == "__main__":
    main()
