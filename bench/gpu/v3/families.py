#!/usr/bin/env python3
"""Same-run timing of the library's Hopper forward families through the Python API: kernel="sm90" (wgmma, cp.async),
kernel="sm90ws" (TMA, warp-specialized) and kernel="auto" (which of the two `auto` takes, from its path report), on the
FA3-paper grid (16k tokens per batch, hidden 2048, bf16; FLOPs = 4 * B * H * S^2 * d, halved when causal). Also
checks each family's output against SDPA (flash) on the timing inputs (a sanity check; the tests are tests/cuda).

    PYTHONPATH=python FLASHKV_LIBRARY=build/cuda/lib/libflashkv.so python3 bench/gpu/v3/families.py \
        [--dims 64,128,256] [--seqlens 512,2048,8192] [--out DIR]

Timing: triton.testing.do_bench (CUDA events, L2 flushed between calls, median).
"""
import argparse
import json
import os

import torch
import torch.nn.functional as F
import triton.testing as tt
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashkv

FAMILIES = ("sm90", "sm90ws", "auto")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--seqlens", default="512,2048,8192")
    ap.add_argument("--rep", type=int, default=60, help="do_bench rep (ms)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    rows = []
    for d in (int(x) for x in a.dims.split(",")):
        for s in (int(x) for x in a.seqlens.split(",")):
            b, h = max(1, 16384 // s), 2048 // d
            q = torch.randn(b, s, h, d, dtype=torch.bfloat16, device="cuda")
            k, v = torch.randn_like(q), torch.randn_like(q)
            for causal in (False, True):
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    ref = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)),
                                                         is_causal=causal).transpose(1, 2).float()
                flops = 4 * b * h * s * s * d / (2 if causal else 1)
                row = dict(d=d, s=s, causal=causal)
                for fam in FAMILIES:
                    def fn(fam=fam):
                        return flashkv.attention(q, k, v, causal=causal, kernel=fam)
                    try:
                        err = (fn().float() - ref).abs().max().item()
                        ms = tt.do_bench(fn, warmup=10, rep=a.rep, return_mode="median")
                        row[fam] = flops / ms / 1e9
                        row[fam + "_err"] = err
                        row[fam + "_path"] = flashkv.last_kernel_path()
                    except Exception as e:  # noqa: BLE001 — a family may not run a shape
                        row[fam + "_error"] = str(e)[:200]
                rows.append(row)
                print(json.dumps(row), flush=True)
            del q, k, v
            torch.cuda.empty_cache()
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "families.jsonl"), "w") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")
    fmt = lambda x: f"{x:.0f}" if isinstance(x, float) else "-"  # noqa: E731
    print(f"\n## sm90 vs sm90ws forward, TFLOP/s ({torch.cuda.get_device_name()})\n")
    print("| hd | seqlen | causal | sm90 | sm90ws | sm90ws/sm90 | auto | auto took | max err vs SDPA (sm90 / sm90ws) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = f"{r['sm90ws'] / r['sm90']:.2f}" if "sm90" in r and "sm90ws" in r else "-"
        took = " ".join(w for w in r.get("auto_path", "").split() if w in ("sm90", "sm90ws", "sm80")) or "-"
        print(f"| {r['d']} | {r['s']} | {int(r['causal'])} | {fmt(r.get('sm90'))} | {fmt(r.get('sm90ws'))} | {ratio} | "
              f"{fmt(r.get('auto'))} | {took} | {r.get('sm90_err', float('nan')):.3g} / "
              f"{r.get('sm90ws_err', float('nan')):.3g} |")


if __name__ == "__main__":
    main()
