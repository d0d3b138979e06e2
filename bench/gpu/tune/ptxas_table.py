#!/usr/bin/env python3
"""Registers, stack and spills per kernel from `nvcc -Xptxas -v` output (stderr), one line per kernel with a short,
demangled name: the before/after check of a kernel change without a GPU (with sass_mix.py for the instruction mix).

    nvcc ... -Xptxas -v -cubin k.cu -o k.cubin 2> ptxas.log && bench/gpu/tune/ptxas_table.py ptxas.log
"""
import re
import subprocess
import sys

ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
REGS = re.compile(r"Used (\d+) registers")


def short(name):
    d = subprocess.run(["c++filt", name], capture_output=True, text=True).stdout.strip()
    d = d.replace("flashkv::cuda::", "").replace("__nv_bfloat16", "bf16").replace("attn::", "")
    d = re.sub(r"\(.*Params\)$", "", d).replace("void ", "")
    return d


def main():
    rows, cur = [], None
    for line in open(sys.argv[1]):
        m = ENTRY.search(line)
        if m:
            cur = {"name": short(m.group(1)), "arch": m.group(2)}
            continue
        if cur is None:
            continue
        m = STACK.search(line)
        if m:
            cur["stack"], cur["st"], cur["ld"] = m.groups()
        m = REGS.search(line)
        if m:
            cur["regs"] = m.group(1)
            rows.append(cur)
            cur = None
    for r in sorted(rows, key=lambda r: r["name"]):
        print(f"{r['regs']:>4} regs  stack {r.get('stack', '?'):>4}  spill st/ld {r.get('st', '?')}/{r.get('ld', '?')}  "
              f"{r['name']}")


if __name__ == "__main__":
    main()
