#!/usr/bin/env python3
"""Static report of the FP8 forward kernels in a SASS listing (`cuobjdump -sass v3_fp8_hd128.o > k.sass`), the
numbers of bench/results/fp8-speed-2026-12-01.md: per kernel (tile D x N, stages, options struct), local-memory
traffic (STL/LDL) of the consumer and producer parts (split at the producer's USETMAXREG.DEALLOC), the steady-state
K/V loop of the consumers (the backward branch spanning both wgmma shapes: S = Q K^T and O += P V) with its
instruction count and mix, and the longest dependent FMNMX/SHFL chain in it (the row-max latency before the first
exponential; static, both the masked and the unmasked softmax copies are in the loop).

    export PATH=$PWD/third_party/cuda-tools/bin:$PATH; cuobjdump -sass k.o > k.sass
    bench/gpu/v3/fp8_sass.py k.sass [bench/gpu/v3/v3_fp8_hd128.cu]   (the TU names the variants' options structs)
"""
import collections
import re
import sys

INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[0-9T]\s+)?([A-Z][A-Za-z0-9_.]*)([^;]*);")
REG = re.compile(r"\bR(\d+)\b")
MIX = ["QGMMA", "HGMMA", "MUFU.EX2", "FFMA", "FMUL", "FADD", "FMNMX", "FSEL", "F2FP", "SHFL", "ISETP", "IMAD", "IADD3",
       "LOP3", "SEL", "PRMT", "BAR", "SYNCS", "STL", "LDL"]


def functions(text):
    for chunk in text.split("Function : ")[1:]:
        name = chunk.split("\n")[0].strip()
        yield name, [(int(m.group(1), 16), m.group(2), m.group(3)) for m in INSTR.finditer(chunk)]


def label(name):
    m = re.search(r"FwdMainloopTmaWs(Fp8)?ILi(\d+)ELi(\d+)ELi(\d+)E(\w*?)Lb(\d)E(?:\d+(\w+?)E)?", name)
    if not m:
        return name[:50]
    kind = "fp8" if m.group(1) else "16-bit"
    return f"{kind} D{m.group(2)} N{m.group(3)} S{m.group(4)} {m.group(7) or 'default'}"


def chain(body):
    """Longest dependent chain of FMNMX / SHFL (register data flow in program order)."""
    depth, best = {}, 0
    for _, op, args in body:
        regs = [int(r) for r in REG.findall(args)]
        if not regs:
            continue
        dst, srcs = regs[0], regs[1:]
        if op.startswith(("FMNMX", "SHFL")):
            d = 1 + max([depth.get(r, 0) for r in srcs] or [0])
            best = max(best, d)
        else:
            d = 0
        depth[dst] = d
    return best


def main():
    # optional: the variant TU, to name the options structs (V3_FP8_VARIANT defines fp8opts_<line>)
    tags = {}
    if len(sys.argv) > 2:
        for i, line in enumerate(open(sys.argv[2]), 1):
            m = re.match(r'V3_FP8_VARIANT\("([^"]+)"', line)
            if m:
                tags[f"fp8opts_{i}"] = m.group(1)
    for name, ins in functions(open(sys.argv[1]).read()):
        if "fwd_ws_kernel" not in name:  # the 16-bit mainloop's kernels too (HGMMA), for the comparison
            continue
        cut = next((i for i, (_, op, _) in enumerate(ins) if op.startswith("USETMAXREG.DEALLOC")), len(ins))
        cons, prod = ins[:cut], ins[cut:]
        cnt = lambda part, k: sum(1 for _, op, _ in part if op == k)  # noqa: E731
        loops = []
        for i, (a, op, args) in enumerate(cons):
            t = re.search(r"0x([0-9a-f]+)", args)
            if op == "BRA" and t and int(t.group(1), 16) < a:
                body = [x for x in cons if int(t.group(1), 16) <= x[0] <= a]
                kinds = {"rs" if re.match(r"\s*R\d+, R\d+, gdesc", x[2]) else "ss"
                         for x in body if x[1].startswith(("QGMMA", "HGMMA"))}
                if len(kinds) == 2:  # S = Q K^T (both operands in shared memory) and O += P V (P in registers)
                    loops.append(body)
        lab = label(name)
        for k, v in tags.items():
            lab = re.sub(rf"\b{k}\b", v, lab)
        print(f"{lab}: consumer STL/LDL {cnt(cons, 'STL')}/{cnt(cons, 'LDL')}, producer STL/LDL "
              f"{cnt(prod, 'STL')}/{cnt(prod, 'LDL')}, producer LDSM (static) "
              f"{sum(1 for _, op, _ in prod if op.startswith('LDSM'))}")
        if loops:
            body = min(loops, key=len)  # the innermost loop with both GEMMs: the steady-state K/V iteration
            mix = collections.Counter()
            for _, op, _ in body:
                for k in MIX:
                    if op.startswith(k):
                        mix[k] += 1
            print(f"   K/V loop: {len(body)} instructions (static), max FMNMX/SHFL chain {chain(body)}; " +
                  " ".join(f"{k} {mix[k]}" for k in MIX if mix[k]))


if __name__ == "__main__":
    main()
