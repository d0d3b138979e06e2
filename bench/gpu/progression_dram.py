#!/usr/bin/env python3
"""DRAM traffic of the progression variants (naive -> v1 order -> v2 (sm80) -> sm90 wgmma) from Nsight Compute counters.

    PYTHONPATH=python FLASHKV_LIBRARY=... python3 bench/gpu/progression_dram.py [--out DIR]

For each variant this script re-runs itself under `ncu --profile-from-start off` (only the kernels between
cudaProfilerStart/Stop, i.e. one call of the variant, are measured) and sums dram__bytes_read.sum and
dram__bytes_write.sum over those kernels. Shape: d = 128, 16k tokens (hidden 2048), non-causal, bf16. The minimum
traffic is reading q, k, v once (3 * 16384 * 2048 * 2 bytes = 201 MB) and writing out once (67 MB).
"""
import argparse
import csv
import io
import json
import os
import subprocess
import sys

VARIANTS = ("naive", "v1", "v2", "sm90")
D, S = 128, 2048


def run_variant(name):
    import math

    import torch

    import flashkv
    b, h = 16384 // S, 2048 // D
    q = torch.randn(b, S, h, D, dtype=torch.bfloat16, device="cuda")
    k, v = torch.randn_like(q), torch.randn_like(q)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    fn = {"naive": lambda: torch.softmax((qt @ kt.transpose(-1, -2)) * (1 / math.sqrt(D)), dim=-1) @ vt,
          "v1": lambda: flashkv.attention(q, k, v, algorithm="v1"),
          "v2": lambda: flashkv.attention(q, k, v, kernel="sm80"),  # the sm80 (mma.sync) kernels even on Hopper
          "sm90": lambda: flashkv.attention(q, k, v)}[name]
    fn()  # warm-up (module load, workspace pools)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def measure(name):
    cmd = ["ncu", "--profile-from-start", "off", "--clock-control", "none", "--csv", "--metrics",
           "dram__bytes_read.sum,dram__bytes_write.sum", sys.executable, os.path.abspath(__file__), "--variant", name]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    text = p.stdout[p.stdout.find('"ID"'):] if '"ID"' in p.stdout else ""
    total = {"dram__bytes_read.sum": 0.0, "dram__bytes_write.sum": 0.0}
    kernels = set()
    scale = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}
    for row in csv.DictReader(io.StringIO(text)):
        m = row.get("Metric Name")
        if m in total:
            total[m] += float(row["Metric Value"].replace(",", "")) * scale.get(row.get("Metric Unit", "byte"), 1)
            kernels.add(row.get("Kernel Name", "")[:60])
    return dict(variant=name, read_MB=total["dram__bytes_read.sum"] / 1e6,
                write_MB=total["dram__bytes_write.sum"] / 1e6, kernels=sorted(kernels),
                ok=p.returncode == 0 and bool(kernels), stderr=p.stderr[-300:] if p.returncode else "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", choices=VARIANTS)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    if a.variant:
        run_variant(a.variant)
        return
    rows = [measure(v) for v in VARIANTS]
    print(f"DRAM traffic (ncu), d={D}, seqlen {S}, 16k tokens, non-causal; minimum = 201 MB read + 67 MB write")
    print("| variant | DRAM read MB | DRAM write MB | kernels |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['read_MB']:.0f} | {r['write_MB']:.0f} | {', '.join(r['kernels'])} |"
              + ("" if r["ok"] else f" (ncu failed: {r['stderr']})"))
    with open(os.path.join(a.out, "progression-dram.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
