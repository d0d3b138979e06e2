#!/usr/bin/env python3
"""Instruction mix of the kernels in a SASS listing (`cuobjdump -sass kernel.cubin > k.sass`), for reading where a
kernel's issue slots go without a GPU: per function, the hot loops (backward branches spanning > 2 KiB) with their
opcode counts, and the instruction count between consecutive BAR.SYNCs with the number of HMMAs in each segment.
Static counts: code in branches that are not taken at run time (e.g. partial-tile paths) is included.

    scripts/setup --sass && export PATH=$PWD/third_party/cuda-tools/bin:$PATH
    nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude -cubin k.cu -o k.cubin
    cuobjdump -sass k.cubin > k.sass && bench/gpu/tune/sass_mix.py k.sass [--segment FUNC_INDEX SEGMENT_INDEX]
"""
import argparse
import collections
import re

INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[0-9T]\s+)?([A-Z][A-Za-z0-9_.]*)([^;]*);")


def functions(text):
    for chunk in text.split("Function : ")[1:]:
        name = chunk.split("\n")[0].strip()
        yield name, [(int(m.group(1), 16), m.group(3), m.group(4)) for m in INSTR.finditer(chunk)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sass")
    ap.add_argument("--segment", nargs=2, type=int, metavar=("FUNC", "SEG"), help="list one segment's opcodes")
    a = ap.parse_args()
    funcs = list(functions(open(a.sass).read()))
    for fi, (name, ins) in enumerate(funcs):
        print(f"[{fi}] {name[:110]}: {len(ins)} instructions")
        for addr, op, args in ins:
            t = re.search(r"0x([0-9a-f]+)", args) if op.startswith("BRA") else None
            if t and int(t.group(1), 16) < addr and addr - int(t.group(1), 16) > 0x800:
                lo = int(t.group(1), 16)
                c = collections.Counter(o.split(".")[0] for x, o, _ in ins if lo <= x <= addr)
                top = ", ".join(f"{k} {v}" for k, v in c.most_common(12) if k != "HMMA")
                print(f"    loop {lo:#x}-{addr:#x}: {sum(c.values())} instr, HMMA {c['HMMA']}: {top}")
        bars = [i for i, (_, op, _) in enumerate(ins) if op.startswith("BAR.SYNC")]
        segs = [ins[x:y] for x, y in zip(bars, bars[1:])]
        print("    segments (instr(HMMA)): " + " ".join(
            f"{len(s)}({sum(op.startswith('HMMA') for _, op, _ in s)})" for s in segs))
        if a.segment and a.segment[0] == fi:
            c = collections.Counter(op for _, op, _ in segs[a.segment[1]])
            print("    segment", a.segment[1], ": " + ", ".join(f"{k} {v}" for k, v in c.most_common()))


if __name__ == "__main__":
    main()
