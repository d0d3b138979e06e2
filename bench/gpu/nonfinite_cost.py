#!/usr/bin/env python3
"""What the non-finite fix-up (src/cuda/common/nonfinite_fixup.cuh, docs/gpu.md "Non-finite inputs") costs, per call,
on the GPU: the device time of every kernel and memset of one flashkv call, from the CUDA profiler (torch.profiler,
CUPTI), with the fix-up kernel's and the flag memset's share, next to the call's median time (triton do_bench).

    PYTHONPATH=python FLASHKV_LIBRARY=build/cuda/lib/libflashkv.so python3 bench/gpu/nonfinite_cost.py [--out DIR]

Calls: the sm80 forward at head dims 64, 96, 128 and 256 (every sm80 forward runs the fix-up) and the backward (auto
family, and sm80) at head dims 64 and 128, on the FA3 grid's shapes (B*S = 16k tokens, H*d = 2048) at seqlen 512 and 4k, causal;
the normal path (finite inputs: the fix-up launch returns at once) and, once per call kind, the rare path (one NaN
in k on the causal diagonal of head 0, batch 0: every row that sees it is NaN, the rest is recomputed exactly).
Writes nonfinite_cost.md (and prints it).
"""
import argparse
import os

import torch
import triton.testing as tt
from torch.profiler import ProfilerActivity, profile

import flashkv

DT = torch.bfloat16


def device_times(fn, reps=5):
    """Per-call device time (us) by kernel/memset name, averaged over `reps` profiled calls (after one warm-up)."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if e.device_type.name != "CUDA":
            continue
        t = getattr(e, "device_time_total", None)
        if t is None:
            t = e.cuda_time_total
        out[e.key] = out.get(e.key, 0.0) + t / reps
    return out


def share(times, *needles):
    return sum(t for k, t in times.items() if any(n in k for n in needles))


def case(kind, kernel, d, s, causal, bad):
    b, h = 16384 // s, 2048 // d
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v, dout = (torch.randn(b, s, h, d, device="cuda", dtype=DT, generator=g) for _ in range(4))
    if bad:
        k[0, s // 2, 0, 3] = float("nan")  # on the causal diagonal: rows >= s/2 see it
    out, lse = flashkv.attention(q, k, v, causal=causal, return_lse=True, kernel=kernel if kind == "fwd" else "auto")
    if kind == "fwd":
        return lambda: flashkv.attention(q, k, v, causal=causal, return_lse=True, kernel=kernel)
    return lambda: flashkv.attention_backward(dout, q, k, v, out, lse, causal=causal, kernel=kernel)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    rows = ["| call | kernel | head_dim | seqlen | inputs | call median (us) | device total (us) | fix-up (us) | "
            "memsets (us) | fix-up + memsets share |", "|---|---|---|---|---|---|---|---|---|---|"]
    plan = [("fwd", "sm80", 64), ("fwd", "sm80", 96), ("fwd", "sm80", 128), ("fwd", "sm80", 256), ("bwd", "auto", 64),
            ("bwd", "auto", 128), ("bwd", "sm80", 128)]
    for kind, kernel, d in plan:
        for s, bad in ((512, False), (4096, False), (4096, True)):
            try:
                fn = case(kind, kernel, d, s, True, bad)
            except Exception as e:  # noqa: BLE001 (a head dim this build does not carry)
                rows.append(f"| {kind} | {kernel} | {d} | {s} | | skipped: {str(e).splitlines()[0][:80]} |||||")
                break
            times = device_times(fn)
            med = tt.do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e3
            total = sum(times.values())
            fix = share(times, "nonfinite_fixup")
            mem = share(times, "Memset", "memset")
            rows.append(f"| {kind} | {kernel} | {d} | {s} | {'NaN in k' if bad else 'finite'} | {med:.1f} | "
                        f"{total:.1f} | {fix:.1f} | {mem:.1f} | {100 * (fix + mem) / max(total, 1e-9):.2f} % |")
            print(rows[-1], flush=True)
    text = ("Non-finite fix-up cost (bench/gpu/nonfinite_cost.py; B*S = 16k tokens, H*d = 2048, causal, bf16; "
            "device times from torch.profiler, per call)\n\n" + "\n".join(rows) + "\n")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "nonfinite_cost.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
