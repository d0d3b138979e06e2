"""The report tables of bench/gpu/bench_attention.py: markdown from its result rows (prefill and FP8 TFLOP/s with the
ratios to the other backends, decode bandwidth vs the HBM read ceiling) with footnotes for the kernel paths
(flashkv.last_kernel_path()) of the flashkv rows. No GPU or torch needed: the rows are plain dicts (the JSON the
benchmark writes)."""


class Paths:
    """Footnote numbers for the kernel paths (flashkv.last_kernel_path()) of the table rows."""

    def __init__(self):
        self.ids = {}

    def ref(self, *rows):
        out = []
        for r in rows:
            p = (r or {}).get("path")
            if p:
                out.append(str(self.ids.setdefault(p, len(self.ids) + 1)))
        return ",".join(dict.fromkeys(out)) or "-"

    def notes(self):
        return [f"[{n}] `{p}`" for p, n in sorted(self.ids.items(), key=lambda x: x[1])]


FLASHKV_ROWS = ("flashkv", "flashkv_det", "flashkv_sm80", "flashkv_sm90", "flashkv_sm90ws", "flashkv_cabi",
                "flashkv_cabi_sm80")


def prefill_table(rows, paths):
    get = {(r["d"], r["s"], r["causal"], r["backend"], r["mode"]): r for r in rows if "mode" in r}
    lines = ["| mode | d | seqlen | causal | flashkv | flashkv det | flashkv sm80 | flashkv sm90 | flashkv sm90ws | prev | "
             "prev sm80 | SDPA flash | cuDNN | FA3 | mem-eff | flashkv/prev | sm80/prev sm80 | flashkv/flash | sm80/flash | "
             "flashkv/cuDNN | flashkv/FA3 | flashkv/max(FA3,cuDNN) | sm90ws/sm90 | C ABI | C ABI sm80 | C ABI/prev | "
             "C ABI sm80/prev sm80 | paths |",
             "|" + "---|" * 28]
    keys = sorted({(r["mode"], r["d"], r["s"], r["causal"]) for r in rows if "mode" in r and r["backend"] != "check"})
    for mode, d, s, c in keys:
        row = lambda b: get.get((d, s, c, b, mode))  # noqa: E731
        f = lambda b: (row(b) or {}).get("tflops")  # noqa: E731
        fk, fl, cu, sm, pv, ps = f("flashkv"), f("flash"), f("cudnn"), f("flashkv_sm80"), f("prev"), f("prev_sm80")
        fmt = lambda x: f"{x:.0f}" if x else "-"  # noqa: E731
        ratio = lambda a, b: f"{a / b:.2f}" if a and b else "-"  # noqa: E731
        s90, s90ws = f("flashkv_sm90"), f("flashkv_sm90ws")
        ca, cs = f("flashkv_cabi"), f("flashkv_cabi_sm80")  # this library through prev's call path (C ABI, ctypes)
        lines.append(f"| {mode} | {d} | {s} | {int(c)} | {fmt(fk)} | {fmt(f('flashkv_det'))} | {fmt(sm)} | "
                     f"{fmt(s90)} | {fmt(s90ws)} | "
                     f"{fmt(pv)} | {fmt(ps)} | {fmt(fl)} | {fmt(cu)} | {fmt(f('fa3'))} | {fmt(f('mem_eff'))} | "
                     f"{ratio(fk, pv)} | {ratio(sm, ps)} | {ratio(fk, fl)} | {ratio(sm, fl)} | {ratio(fk, cu)} | "
                     f"{ratio(fk, f('fa3'))} | {ratio(fk, max(f('fa3') or 0, cu or 0))} | {ratio(s90ws, s90)} | "
                     f"{fmt(ca)} | {fmt(cs)} | {ratio(ca, pv)} | {ratio(cs, ps)} | "
                     f"{paths.ref(*(row(b) for b in FLASHKV_ROWS))} |")
    return "\n".join(lines)


def decode_table(rows, read_tbps, paths):
    get = {(r["b"], r["L"], r["backend"]): r for r in rows}
    lines = [f"| batch | context | flashkv TB/s | flashkv C ABI TB/s | no-split TB/s | prev TB/s | cuDNN TB/s | "
             f"SDPA flash TB/s | flashkv / HBM read ({read_tbps:.2f} TB/s) | C ABI / prev | flashkv / cuDNN | "
             f"C ABI / cuDNN | paths |", "|" + "---|" * 13]
    for b, ctx in sorted({(r["b"], r["L"]) for r in rows}):
        f = lambda n: (get.get((b, ctx, n)) or {}).get("TBps")  # noqa: E731
        fmt = lambda x: f"{x:.2f}" if x else "-"  # noqa: E731
        fk, cu, pv, ca = f("flashkv"), f("cudnn"), f("prev"), f("flashkv_cabi")
        lines.append(f"| {b} | {ctx} | {fmt(fk)} | {fmt(ca)} | {fmt(f('flashkv_nosplit'))} | {fmt(pv)} | {fmt(cu)} | "
                     f"{fmt(f('flash'))} | {(fk or 0) / read_tbps:.0%} | {(ca / pv if ca and pv else 0):.2f} | "
                     f"{(fk / cu if fk and cu else 0):.2f} | {(ca / cu if ca and cu else 0):.2f} | "
                     f"{paths.ref(get.get((b, ctx, 'flashkv')), get.get((b, ctx, 'flashkv_nosplit')))} |")
    return "\n".join(lines)


def fp8_table(rows, paths):
    get = {(r["d"], r["s"], r["causal"], r["backend"]): r for r in rows if "mode" in r}
    lines = ["| d | seqlen | causal | flashkv fp8 | FA3 fp8 | flashkv fp8/FA3 fp8 | flashkv bf16 sm90ws | fp8/bf16 | "
             "max abs(flashkv - FA3) | paths |", "|" + "---|" * 10]
    for d, s, c in sorted({(r["d"], r["s"], r["causal"]) for r in rows}):
        f = lambda b: (get.get((d, s, c, b)) or {}).get("tflops")  # noqa: E731
        fmt = lambda x: f"{x:.0f}" if x else "-"  # noqa: E731
        ratio = lambda a, b: f"{a / b:.2f}" if a and b else "-"  # noqa: E731
        fk, fa, bf = f("flashkv_fp8"), f("fa3_fp8"), f("flashkv_bf16_sm90ws")
        chk = (get.get((d, s, c, "check")) or {}).get("max_abs_diff")
        lines.append(f"| {d} | {s} | {int(c)} | {fmt(fk)} | {fmt(fa)} | {ratio(fk, fa)} | {fmt(bf)} | "
                     f"{ratio(fk, bf)} | {f'{chk:.3g}' if chk is not None else '-'} | "
                     f"{paths.ref(get.get((d, s, c, 'flashkv_fp8')), get.get((d, s, c, 'flashkv_bf16_sm90ws')))} |")
    return "\n".join(lines)
