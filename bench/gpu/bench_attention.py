#!/usr/bin/env python3
"""flashkv CUDA backend vs PyTorch SDPA (flash = FlashAttention-2, cuDNN, memory-efficient) and FlexAttention,
all measured in the same run on the same GPU. One command, one table:

    PYTHONPATH=python FLASHKV_LIBRARY=build/cuda/lib python3 bench/gpu/bench_attention.py [--quick] [--out DIR]

Sections (FA3-paper conventions, docs/engineering.md):
  prefill  16k tokens per batch, hidden 2048 (heads = 2048 / head_dim), head dims 64/128/256, seqlen 512..16k,
           causal and not, forward and forward+backward; TFLOP/s with fwd = 4*B*H*S^2*d (halved when causal),
           fwd+bwd = 3.5x fwd; ratios flashkv / cuDNN and flashkv / SDPA-flash.
  decode   32 query / 8 KV heads, d = 128, one new token, bf16 KV cache (flashkv: paged, page_size 256), batch 1..128,
           context 4k..128k: effective bandwidth = KV bytes / time, vs cuDNN / SDPA-flash and the measured HBM
           read bandwidth.
  progression  naive (S and P materialized, PyTorch ops), v1 order (flashkv Algorithm.v1_order), v2 (flashkv tiled).
Timing: triton.testing.do_bench (CUDA events, L2 flushed between calls, median). Results: JSON + markdown in --out.
"""
import argparse
import datetime
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
import triton.testing as tt
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashkv
from flashkv import _library as L

DT = torch.bfloat16


def bench(fn, rep=100):
    return tt.do_bench(fn, warmup=25, rep=rep, return_mode="median")


def flops(b, h, sq, sk, d, causal, mode):
    f = 4 * b * h * sq * sk * d
    if causal:
        f /= 2
    return f * (1 if mode == "fwd" else 3.5)


# ---- flashkv calls ----------------------------------------------------------------------------------------------
def fk_forward(q, k, v, causal, algorithm="tiled"):
    return flashkv.attention(q, k, v, causal=causal, return_lse=True, algorithm=algorithm)


def fk_backward(dout, q, k, v, out, lse, causal, deterministic):
    """flashkv.attention_backward with an explicit deterministic flag (default False, as FlashAttention)."""
    return flashkv.attention_backward(dout, q, k, v, out, lse, causal=causal, deterministic=deterministic)


def fk_decode(q, k_cache, v_cache, page_table, seqlens, out, num_splits=0, max_seqlen_k=0):
    """flashkv.paged_decode (the public Python API over flashkv_cuda_decode), writing into `out`."""
    return flashkv.paged_decode(q, k_cache, v_cache, page_table, seqlens, num_splits=num_splits,
                                max_seqlen_k=max_seqlen_k, out=out)


# ---- sections -----------------------------------------------------------------------------------------------------
class Sm80Only:
    """FLASHKV_CUDA_SM80_ONLY=1 inside the block: flashkv runs its sm80 (mma.sync, FA2-class) kernels even on Hopper,
    where it otherwise takes the sm90 (wgmma) kernels for head dims 64/128/256. Read by the library on every call."""

    def __enter__(self):
        os.environ["FLASHKV_CUDA_SM80_ONLY"] = "1"

    def __exit__(self, *exc):
        os.environ.pop("FLASHKV_CUDA_SM80_ONLY", None)


def sm80(fn):
    def run():
        with Sm80Only():
            return fn()
    return run


def ceilings():
    n = 2 ** 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    copy = 2 * n / bench(lambda: b.copy_(a)) / 1e9  # TB/s (bytes / ms / 1e9)
    x = torch.randn(n // 2, dtype=DT, device="cuda")
    read = n / bench(lambda: x.sum()) / 1e9  # TB/s read (output is one scalar)
    A = torch.randn(8192, 8192, dtype=DT, device="cuda")
    B = torch.randn_like(A)
    gemm = 2 * 8192 ** 3 / bench(lambda: A @ B) / 1e9
    del a, b, x, A, B
    torch.cuda.empty_cache()
    return {"copy_TBps": copy, "read_TBps": read, "bf16_gemm_TFLOPs": gemm}


def prefill(dims, seqlens, modes, check):
    rows = []
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "mem_eff": SDPBackend.EFFICIENT_ATTENTION}
    for d in dims:
        for s in seqlens:
            bsz, h = max(1, 16384 // s), 2048 // d
            q = torch.randn(bsz, s, h, d, dtype=DT, device="cuda", requires_grad=True)
            k = torch.randn_like(q, requires_grad=True)
            v = torch.randn_like(q, requires_grad=True)
            g = torch.randn_like(q)
            qt, kt, vt, gt = (x.transpose(1, 2) for x in (q, k, v, g))  # [B, H, S, D] views for SDPA
            for causal in (False, True):
                if check:  # flashkv output vs SDPA flash on the benchmark inputs (sanity, not the test suite)
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)
                    out, _ = fk_forward(q.detach(), k.detach(), v.detach(), causal)
                    err = (out.float() - ref.float()).abs().max().item()
                    rows.append(dict(d=d, s=s, causal=causal, backend="check", mode="fwd", max_abs_diff=err))
                for mode in modes:
                    fns = {}
                    for name, be in backends.items():
                        if mode == "fwd":
                            def fn(be=be):
                                with sdpa_kernel(be):
                                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                        else:
                            def fn(be=be):
                                with sdpa_kernel(be):
                                    o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                                o.backward(gt)
                        fns[name] = fn
                    qd, kd, vd = q.detach(), k.detach(), v.detach()
                    if mode == "fwd":
                        fns["flashkv"] = lambda: fk_forward(qd, kd, vd, causal)
                        fns["flashkv_sm80"] = sm80(lambda: fk_forward(qd, kd, vd, causal))
                    else:
                        def fk_fb(det):
                            out, lse = fk_forward(qd, kd, vd, causal)
                            return fk_backward(g, qd, kd, vd, out, lse, causal, det)
                        fns["flashkv"] = lambda: fk_fb(False)
                        fns["flashkv_det"] = lambda: fk_fb(True)
                        fns["flashkv_sm80"] = sm80(lambda: fk_fb(False))
                    for name, fn in fns.items():
                        try:
                            ms = bench(fn)
                            rows.append(dict(d=d, s=s, b=bsz, h=h, causal=causal, backend=name, mode=mode, ms=ms,
                                             tflops=flops(bsz, h, s, s, d, causal, mode) / ms / 1e9))
                        except Exception as e:  # noqa: BLE001 — a backend may not support a shape
                            rows.append(dict(d=d, s=s, causal=causal, backend=name, mode=mode, err=str(e)[:160]))
                        print(f"  {rows[-1]}", flush=True)
            del q, k, v, g
            torch.cuda.empty_cache()
    return rows


def flex_rows(configs):
    rows = []
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention, dynamic=False)
        for d, s in configs:
            bsz, h = 16384 // s, 2048 // d
            q = torch.randn(bsz, h, s, d, dtype=DT, device="cuda")
            k, v = torch.randn_like(q), torch.randn_like(q)
            for causal in (False, True):
                bm = create_block_mask(lambda b, hh, qi, ki: qi >= ki, None, None, s, s) if causal else None
                flex(q, k, v, block_mask=bm)
                ms = bench(lambda: flex(q, k, v, block_mask=bm))
                rows.append(dict(d=d, s=s, causal=causal, backend="flex", mode="fwd", ms=ms,
                                 tflops=flops(bsz, h, s, s, d, causal, "fwd") / ms / 1e9))
                print(f"  {rows[-1]}", flush=True)
    except Exception as e:  # noqa: BLE001
        rows.append(dict(backend="flex", err=str(e)[:200]))
    return rows


def decode(configs):
    rows = []
    hq, hk, d, page = 32, 8, 128, 256
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    for bsz, ctx in configs:
        kvbytes = 2 * bsz * hk * ctx * d * 2
        q = torch.randn(bsz, 1, hq, d, dtype=DT, device="cuda")
        pages = bsz * ctx // page
        kc = torch.randn(pages, page, hk, d, dtype=DT, device="cuda")
        vc = torch.randn_like(kc)
        table = torch.randperm(pages, device="cuda", dtype=torch.int32).view(bsz, ctx // page)
        seqlens = torch.full((bsz,), ctx, dtype=torch.int32, device="cuda")
        out = torch.empty_like(q)
        for splits in (0, 1):
            name = "flashkv" if splits == 0 else "flashkv_nosplit"
            ms = bench(lambda: fk_decode(q, kc, vc, table, seqlens, out, splits, ctx))
            rows.append(dict(b=bsz, L=ctx, backend=name, ms=ms, TBps=kvbytes / ms / 1e9))
            print(f"  {rows[-1]}", flush=True)
        # SDPA on the same tokens, contiguous [B, Hk, L, D] (gathered once; not timed)
        kk = kc[table.long().flatten()].view(bsz, ctx, hk, d).transpose(1, 2).contiguous()
        vv = vc[table.long().flatten()].view(bsz, ctx, hk, d).transpose(1, 2).contiguous()
        qq = q.transpose(1, 2)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            ref = F.scaled_dot_product_attention(qq, kk, vv, enable_gqa=True).transpose(1, 2)
        fk_decode(q, kc, vc, table, seqlens, out, 0, ctx)
        rows.append(dict(b=bsz, L=ctx, backend="check", max_abs_diff=(out.float() - ref.float()).abs().max().item()))
        del kc, vc
        for name, be in backends.items():
            try:
                def fn(be=be):
                    with sdpa_kernel(be):
                        return F.scaled_dot_product_attention(qq, kk, vv, enable_gqa=True)
                ms = bench(fn)
                rows.append(dict(b=bsz, L=ctx, backend=name, ms=ms, TBps=kvbytes / ms / 1e9))
            except Exception as e:  # noqa: BLE001
                rows.append(dict(b=bsz, L=ctx, backend=name, err=str(e)[:160]))
            print(f"  {rows[-1]}", flush=True)
        del q, kk, vv
        torch.cuda.empty_cache()
    return rows


def progression(configs):
    rows = []
    for d, s, causal in configs:
        bsz, h = 16384 // s, 2048 // d
        q = torch.randn(bsz, s, h, d, dtype=DT, device="cuda")
        k, v = torch.randn_like(q), torch.randn_like(q)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        scale = 1 / math.sqrt(d)

        def naive():
            sc = (qt @ kt.transpose(-1, -2)) * scale
            if causal:
                sc = sc.masked_fill(torch.ones(s, s, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
            return torch.softmax(sc, dim=-1) @ vt
        fns = {"naive (torch, S/P materialized)": naive,
               "v1 order (flashkv)": lambda: fk_forward(q, k, v, causal, "v1"),
               "v2 (flashkv sm80, mma.sync)": sm80(lambda: fk_forward(q, k, v, causal)),
               "v3-class (flashkv sm90, wgmma)": lambda: fk_forward(q, k, v, causal)}
        for name, fn in fns.items():
            try:
                ms = bench(fn, rep=50)
                rows.append(dict(d=d, s=s, causal=causal, variant=name, ms=ms,
                                 tflops=flops(bsz, h, s, s, d, causal, "fwd") / ms / 1e9))
            except Exception as e:  # noqa: BLE001
                rows.append(dict(d=d, s=s, causal=causal, variant=name, err=str(e)[:160]))
            print(f"  {rows[-1]}", flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    return rows


# ---- report -------------------------------------------------------------------------------------------------------
def prefill_table(rows):
    get = {(r["d"], r["s"], r["causal"], r["backend"], r["mode"]): r.get("tflops") for r in rows if "mode" in r}
    lines = ["| mode | d | seqlen | causal | flashkv | flashkv det | flashkv sm80 | SDPA flash | cuDNN | mem-eff | "
             "flashkv/flash | sm80/flash | flashkv/cuDNN |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["mode"], r["d"], r["s"], r["causal"]) for r in rows if "mode" in r and r["backend"] != "check"})
    for mode, d, s, c in keys:
        f = lambda b: get.get((d, s, c, b, mode))  # noqa: E731
        fk, fl, cu = f("flashkv"), f("flash"), f("cudnn")
        fmt = lambda x: f"{x:.0f}" if x else "-"  # noqa: E731
        ratio = lambda a, b: f"{a / b:.2f}" if a and b else "-"  # noqa: E731
        lines.append(f"| {mode} | {d} | {s} | {int(c)} | {fmt(fk)} | {fmt(f('flashkv_det'))} | "
                     f"{fmt(f('flashkv_sm80'))} | {fmt(fl)} | {fmt(cu)} | {fmt(f('mem_eff'))} | {ratio(fk, fl)} | "
                     f"{ratio(f('flashkv_sm80'), fl)} | {ratio(fk, cu)} |")
    return "\n".join(lines)


def decode_table(rows, read_tbps):
    get = {(r["b"], r["L"], r["backend"]): r.get("TBps") for r in rows}
    lines = [f"| batch | context | flashkv TB/s | no-split TB/s | cuDNN TB/s | SDPA flash TB/s | flashkv / HBM read "
             f"({read_tbps:.2f} TB/s) | flashkv / cuDNN |", "|---|---|---|---|---|---|---|---|"]
    for b, ctx in sorted({(r["b"], r["L"]) for r in rows}):
        f = lambda n: get.get((b, ctx, n))  # noqa: E731
        fmt = lambda x: f"{x:.2f}" if x else "-"  # noqa: E731
        fk, cu = f("flashkv"), f("cudnn")
        lines.append(f"| {b} | {ctx} | {fmt(fk)} | {fmt(f('flashkv_nosplit'))} | {fmt(cu)} | {fmt(f('flash'))} | "
                     f"{fk / read_tbps:.0%} | {(fk / cu if fk and cu else 0):.2f} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a subset of the grid (seqlen 1k/4k/16k)")
    ap.add_argument("--sections", default="prefill,decode,progression,flex")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    sections = a.sections.split(",")
    dev = torch.cuda.get_device_properties(0)
    meta = dict(gpu=dev.name, sms=dev.multi_processor_count, torch=torch.__version__,
                cudnn=torch.backends.cudnn.version(), date=datetime.datetime.utcnow().isoformat(timespec="seconds"),
                command=" ".join(sys.argv), flashkv_library=L.library_path())
    print("device", meta, flush=True)
    res = dict(meta=meta, ceilings=ceilings())
    print("ceilings", res["ceilings"], flush=True)
    seqlens = (1024, 4096, 16384) if a.quick else (512, 1024, 2048, 4096, 8192, 16384)
    if "prefill" in sections:
        res["prefill"] = prefill((64, 128, 256), seqlens, ("fwd", "fwdbwd"), check=True)
    if "flex" in sections:
        res["flex"] = flex_rows(((128, 8192), (64, 8192)))
    if "decode" in sections:
        res["decode"] = decode(((1, 32768), (1, 131072), (16, 8192), (64, 4096), (64, 16384), (128, 8192),
                                (128, 4096)))
    if "progression" in sections:
        res["progression"] = progression(((128, 1024, False), (128, 4096, False), (128, 4096, True)))
    os.makedirs(a.out, exist_ok=True)
    stamp = datetime.date.today().isoformat()
    with open(os.path.join(a.out, f"h200-attention-{stamp}.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = [f"# flashkv CUDA vs PyTorch SDPA on {meta['gpu']} — {meta['date']}",
          "flashkv: default dispatch (sm90 wgmma kernels on Hopper for head dims 64/128/256); flashkv sm80: the "
          "mma.sync (FA2-class) kernels forced with FLASHKV_CUDA_SM80_ONLY=1; flashkv det: deterministic backward.",
          f"Command: `{meta['command']}`; torch {meta['torch']}, cuDNN {meta['cudnn']}.",
          f"Ceilings (same run): copy {res['ceilings']['copy_TBps']:.2f} TB/s (read+write), HBM read "
          f"{res['ceilings']['read_TBps']:.2f} TB/s, bf16 GEMM {res['ceilings']['bf16_gemm_TFLOPs']:.0f} TFLOP/s.", ""]
    if "prefill" in res:
        md += ["## Prefill, bf16, TFLOP/s (16k tokens/batch, hidden 2048)", prefill_table(res["prefill"]), ""]
        checks = [r for r in res["prefill"] if r["backend"] == "check"]
        md += [f"Max |flashkv - SDPA flash| over the benchmark inputs: {max(r['max_abs_diff'] for r in checks):.3g}", ""]
    if "flex" in res:
        md += ["## FlexAttention (fwd, TFLOP/s)"] + [
            f"- d={r['d']} s={r['s']} causal={int(r['causal'])}: {r['tflops']:.0f}" if "tflops" in r else f"- {r}"
            for r in res["flex"]] + [""]
    if "decode" in res:
        md += ["## Decode, bf16 KV, 32 q / 8 kv heads, d=128 (effective KV bandwidth)",
               decode_table([r for r in res["decode"] if r["backend"] != "check"], res["ceilings"]["read_TBps"]), ""]
    if "progression" in res:
        md += ["## Progression (fwd, d=128, 16k tokens)", "| seqlen | causal | variant | ms | TFLOP/s |",
               "|---|---|---|---|---|"] + [
            f"| {r['s']} | {int(r['causal'])} | {r['variant']} | {r.get('ms', 0):.3f} | {r.get('tflops', 0):.1f} |"
            for r in res["progression"]] + [""]
    text = "\n".join(md)
    with open(os.path.join(a.out, f"h200-attention-{stamp}.md"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
