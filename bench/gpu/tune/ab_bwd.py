#!/usr/bin/env python3
"""A/B of one attention backward between two flashkv libraries in ONE process (both loaded through their C ABI with
ctypes, bench_attention.PrevLib), interleaved, so that clocks and thermals are shared: per round, `--calls` backward
calls of A then of B, each timed with CUDA events (no L2 flush: the backward reads ~100 MB), median over rounds.
Also the run mode for a profiler: `--only A|B` makes exactly `--calls` backward calls of one library (for ncu -k).

    python3 bench/gpu/tune/ab_bwd.py --a build/cuda/devlibs/libflashkv.so --b build/carry/prev-libflashkv.so \
        --kernel sm80 --head-dims 64,128,256 --seqlens 4096,16384 [--causal 0,1] [--only A --calls 2]

A and B must agree on dq, dk, dv (2e-2 relative to the largest value; the run stops otherwise).
Library B is taken as a release without kernel families: its sm80 rows run with FLASHKV_CUDA_SM80_ONLY=1 set around
each call (as bench_attention.py's "prev sm80"); library A gets the kernel family in its options.
"""
import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench_attention import PrevLib  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--kernel", default="sm80", choices=["auto", "sm80", "sm90"])
    ap.add_argument("--head-dims", default="64,128,256")
    ap.add_argument("--seqlens", default="4096,16384")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--only", choices=["A", "B"])
    a = ap.parse_args()
    libs = {"A": PrevLib(a.a), "B": PrevLib(a.b)}

    def call(name, g, q, k, v, out, lse, causal):
        if name == "B" and a.kernel == "sm80":
            os.environ["FLASHKV_CUDA_SM80_ONLY"] = "1"
        try:
            return libs[name].backward(g, q, k, v, out, lse, causal, kernel=a.kernel if name == "A" else "auto")
        finally:
            os.environ.pop("FLASHKV_CUDA_SM80_ONLY", None)

    torch.manual_seed(0)
    print("| d | seqlen | causal | A ms | B ms | A/B time | max abs dq A-B |")  # dq/dk/dv checked to 2e-2 relative
    print("|---|---|---|---|---|---|---|")
    for d in map(int, a.head_dims.split(",")):
        for s in map(int, a.seqlens.split(",")):
            for causal in map(int, a.causal.split(",")):
                b, h = 16384 // s, 2048 // d
                q, k, v = (torch.randn(b, s, h, d, dtype=torch.bfloat16, device="cuda") for _ in range(3))
                g = torch.randn_like(q)
                out, lse = libs["A"].forward(q, k, v, causal, a.kernel)
                if a.only:
                    for _ in range(a.calls):
                        call(a.only, g, q, k, v, out, lse, causal)
                    torch.cuda.synchronize()
                    continue
                ref = call("A", g, q, k, v, out, lse, causal)
                other = call("B", g, q, k, v, out, lse, causal)
                # dq, dk, dv of A vs B: the float32 dq_accum's atomic order differs between calls (~1e-3 relative);
                # a step that read a stale buffer (a load never issued) is off by O(1): refuse to time it.
                rel = [((x.float() - y.float()).abs().max() / y.float().abs().max().clamp_min(1e-30)).item()
                       for x, y in zip(ref, other)]
                if max(rel) > 2e-2:
                    sys.exit(f"d={d} seqlen={s} causal={causal}: A and B disagree (relative max |dq|,|dk|,|dv| "
                             f"differences {rel}): not timed")
                diff = (ref[0].float() - other[0].float()).abs().max().item()
                ts = {"A": [], "B": []}
                for _ in range(a.rounds):
                    for name in ("A", "B"):
                        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        e0.record()
                        for _ in range(a.calls):
                            call(name, g, q, k, v, out, lse, causal)
                        e1.record()
                        torch.cuda.synchronize()
                        ts[name].append(e0.elapsed_time(e1) / a.calls)
                ta, tb = statistics.median(ts["A"]), statistics.median(ts["B"])
                print(f"| {d} | {s} | {causal} | {ta:.3f} | {tb:.3f} | {ta / tb:.3f} | {diff:.2e} |", flush=True)
                del q, k, v, g, out, lse


if __name__ == "__main__":
    main()
