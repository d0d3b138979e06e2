#!/usr/bin/env python3
"""Renders a `flashkv bench attention --json` result as the markdown report committed next to it.

usage: cpu-attention-report.py RESULT.json [--lscpu FILE] [--uptime-before FILE] [--uptime-after FILE]
                               [--commit SHA] [--notes FILE] > RESULT.md
"""
import argparse
import json
from pathlib import Path


def human(b):
    if b is None or b < 0:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if b < 1024 or unit == "TiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json")
    ap.add_argument("--lscpu")
    ap.add_argument("--uptime-before")
    ap.add_argument("--uptime-after")
    ap.add_argument("--commit", default="")
    ap.add_argument("--notes")
    a = ap.parse_args()
    d = json.loads(Path(a.json).read_text())
    m, c = d["machine"], d["config"]
    out = []
    p = out.append
    p(f"# CPU attention forward: naive vs v1 vs v2 (tiled) — {d['date'][:10]}\n")
    p(f"- **command**: `{d['command']}`" + (f" (flashkv {d['flashkv_version']}, commit {a.commit})" if a.commit else ""))
    p(f"- **date**: {d['date']}")
    p(f"- **machine**: {m['cpu_model']}, {m['hardware_threads']} hardware threads, {m['threads']} OpenMP threads used")
    if a.lscpu:
        keep = ("Model name", "CPU(s)", "Thread(s) per core", "L1d cache", "L2 cache", "L3 cache", "Hypervisor vendor")
        lines = [l.strip() for l in Path(a.lscpu).read_text().splitlines() if l.split(":")[0].strip() in keep]
        p("- **lscpu**: " + "; ".join(" ".join(l.split()) for l in lines))
    p(f"- **peak float32 FMA rate**: {m['peak_gflops_fp32']:.1f} GFLOP/s wall-clock, {m['peak_method']}"
      + (f"; the loop held {100 * m['peak_cpu_share']:.0f}% of the cores (cpu%), i.e. "
         f"{m['peak_gflops_fp32_per_cpu']:.1f} GFLOP/s per held core-set" if "peak_cpu_share" in m else ""))
    if a.uptime_before or a.uptime_after:
        ub = Path(a.uptime_before).read_text().strip() if a.uptime_before else "?"
        ua = Path(a.uptime_after).read_text().strip() if a.uptime_after else "?"
        p(f"- **load** (`uptime`; the machine is shared with other builds, so timings are noisy): before: `{ub}`; "
          f"after: `{ua}`")
    p(f"- **shape**: batch {c['batch']}, heads {c['heads']} (= heads_kv), seqlen_q = seqlen_k, dtype {c['dtype']}, "
      f"{'causal' if c['causal'] else 'no mask'}, best of {c['repeats']} runs; FLOPs = {c['flops_formula']}")
    p(f"- naive runs only where its S/P scratch (model: workers × seqlen² × 4 B) fits in "
      f"{c['max_naive_memory_gib']} GiB; otherwise it is listed as skipped")
    p("- cpu% = process CPU time / (wall time × threads) of the best call: below 100% other processes held cores "
      "during the call and its time is pessimistic; 'per cpu' columns divide by it (GFLOP/s while the threads held "
      "the cores), compared with the FMA loop's rate measured the same way\n")
    res = d["results"]
    for hd in sorted({r["head_dim"] for r in res}):
        p(f"## head_dim {hd}\n")
        p("| seqlen | variant | best ms | median ms | cpu% | GFLOP/s | % of peak | GFLOP/s per cpu | % of peak per cpu "
          "| extra memory (measured) | extra memory (model) | bytes moved (model) |")
        p("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in sorted((r for r in res if r["head_dim"] == hd), key=lambda r: (r["seqlen"], r["variant"])):
            if r["skipped"]:
                p(f"| {r['seqlen']} | {r['variant']} | skipped: {r['skip_reason']} | | | | | | | | "
                  f"{human(r['extra_memory_bytes_model'])} | {human(r['bytes_moved'])} |")
                continue
            share = f"{100 * r['cpu_share_best']:.0f}%" if "cpu_share_best" in r else "n/a"
            p(f"| {r['seqlen']} | {r['variant']} | {r['time_ms_best']:.1f} | {r['time_ms_median']:.1f} | {share} | "
              f"{r['gflops']:.1f} | {r['pct_of_peak']:.1f}% | {r.get('gflops_per_cpu', float('nan')):.1f} | "
              f"{r.get('pct_of_peak_per_cpu', float('nan')):.1f}% | {human(r['extra_memory_bytes_measured'])} | "
              f"{human(r['extra_memory_bytes_model'])} | {human(r['bytes_moved'])} |")
        p("")
        # speed of v2 relative to naive per seqlen
        by = {(r["variant"], r["seqlen"]): r for r in res if r["head_dim"] == hd and not r["skipped"]}
        ratios = []
        for s in sorted({r["seqlen"] for r in res if r["head_dim"] == hd}):
            if ("naive", s) in by and ("v2", s) in by:
                ratios.append(f"{s}: {by[('naive', s)]['time_ms_best'] / by[('v2', s)]['time_ms_best']:.2f}x")
        if ratios:
            p("v2 speed-up over naive (best times): " + ", ".join(ratios) + "\n")
    if a.notes:
        p(Path(a.notes).read_text())
    print("\n".join(out))


if __name__ == "__main__":
    main()
