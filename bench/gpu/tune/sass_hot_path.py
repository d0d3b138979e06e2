#!/usr/bin/env python3
"""Per-block instruction counts of the split-KV decode kernels in SASS listings (`cuobjdump -sass k.cubin`), for
comparing decode mainloops without a GPU (bench/results/sass-decode-quant-2026-12-01.md):

    bench/gpu/tune/sass_hot_path.py TAG=listing.sass [TAG=listing.sass ...]

For each decode_kernel* function (not the combine): every hot loop (a backward branch spanning > 2 KiB that contains
HMMAs) with its static instruction count, the alternative load block it carries (a conditional forward branch around
a block of LDGSTS that ends in an unconditional forward branch: the per-row page-lookup copies, taken only when a
64-token block can straddle pages) and the hot path = loop − that block, then the opcode counts of the loop.
"""
import collections
import re
import sys

INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[0-9T]\s+)?([A-Z][A-Za-z0-9_.]*)([^;]*);")
COLS = ["HMMA", "LDSM", "LDS", "STS", "LDGSTS", "LDG", "LDL", "SHFL", "MUFU", "BRA", "PRMT", "LOP3", "HFMA2", "HMUL2",
        "HADD2", "FMUL", "FFMA", "IMAD"]


def loops(ins):
    at = {a: i for i, (a, _, _, _) in enumerate(ins)}
    for i, (a, pred, op, args) in enumerate(ins):
        t = re.search(r"0x([0-9a-f]+)", args) if op.startswith("BRA") else None
        if not (t and pred and int(t.group(1), 16) < a and a - int(t.group(1), 16) > 0x800):
            continue
        lo = at[int(t.group(1), 16)]
        body = ins[lo:i + 1]
        if not any(o.startswith("HMMA") for _, _, o, _ in body):
            continue
        alt = 0
        for k in range(lo, i):
            a2, p2, o2, g2 = ins[k]
            if not (o2.startswith("BRA") and p2):
                continue
            x = int(re.search(r"0x([0-9a-f]+)", g2).group(1), 16)
            if x in at and x > a2 and ins[at[x] - 1][2].startswith("BRA") and not ins[at[x] - 1][1]:
                blk = ins[k + 1:at[x]]
                if any(o.startswith("LDGSTS") for _, _, o, _ in blk):
                    alt = len(blk) + 1
                    break
        yield body, alt


def main():
    print("| kernel | function instr | loop instr | alt. load block | hot path | " + " | ".join(COLS) + " |")
    print("|---|---:|---:|---:|---:|" + "---:|" * len(COLS))
    for arg in sys.argv[1:]:
        tag, path = arg.split("=", 1)
        for chunk in open(path).read().split("Function : ")[1:]:
            name = chunk.split("\n")[0]
            if "decode_kernel" not in name:
                continue
            ins = [(int(m.group(1), 16), m.group(2), m.group(3), m.group(4)) for m in INSTR.finditer(chunk)]
            for body, alt in loops(ins):
                c = collections.Counter(o.split(".")[0] for _, _, o, _ in body)
                print(f"| {tag} | {len(ins)} | {len(body)} | {alt} | {len(body) - alt} | " +
                      " | ".join(str(c[k]) for k in COLS) + " |")


if __name__ == "__main__":
    main()
