#!/usr/bin/env python3
"""flashkv CUDA backend vs PyTorch SDPA (flash = FlashAttention-2, cuDNN, memory-efficient), FlexAttention and the
previous flashkv release, all measured in the same run on the same GPU. One command, one table:

    PYTHONPATH=python FLASHKV_LIBRARY=build/cuda/lib python3 bench/gpu/bench_attention.py [--quick] [--out DIR]
        [--prev-library PATH/libflashkv.so]

--prev-library: the previous release's library (e.g. commit 88b7f60 built with head dims 64;128;256, bf16) is timed in
a subprocess through its own C ABI (ctypes; the old library predates this package's kernel families, so its sm80
column uses its FLASHKV_CUDA_SM80_ONLY switch) on the same shapes; its numbers go into the same tables ("prev").
The flashkv sm80 / sm90 / sm90ws columns run flashkv.attention(kernel=...) with that family (sm90/sm90ws: forward
only, Hopper); every flashkv row records flashkv.last_kernel_path(), listed under the tables as footnotes.

Sections (FA3-paper conventions, docs/engineering.md):
  prefill  16k tokens per batch, hidden 2048 (heads = 2048 / head_dim), head dims 64/128/256, seqlen 512..16k,
           causal and not, forward and forward+backward; TFLOP/s with fwd = 4*B*H*S^2*d (halved when causal),
           fwd+bwd = 3.5x fwd; ratios flashkv / cuDNN and flashkv / SDPA-flash. "C ABI" / "C ABI sm80": this library
           (auto / kernel family sm80) through the same raw ctypes calls as the previous release (PrevLib), so that
           "C ABI sm80 / prev sm80" compares kernels and host paths only, without the Python binding's per-call cost.
           An A/A check of the cross-process comparison: --prev-library this library's own libflashkv.so (its sm80
           rows then run kernel="sm80"; prev and prev sm80 should come out at 1.00x of C ABI and C ABI sm80).
  decode   32 query / 8 KV heads, d = 128, one new token, bf16 KV cache (flashkv: paged, page_size 256), batch 1..128,
           context 4k..128k: effective bandwidth = KV bytes / time, vs cuDNN / SDPA-flash and the measured HBM
           read bandwidth. Two flashkv rows: "flashkv" through the public Python API (flashkv.paged_decode: argument
           conversion + validation in Python on every call) and "flashkv C ABI" through the same raw ctypes call as
           the previous release; do_bench times one call per flush, so where the kernel is shorter than the host's
           per-call cost (batch 1) the Python row shows that cost. "C ABI / prev" is the like-for-like ratio.
  fp8      the prefill grid's forward with float8_e4m3fn q/k/v (bfloat16 out, per-(batch, kv head) descales): flashkv
           (kernel family sm90ws, the FP8 mainloop) next to FA3's FP8 forward (fa3_fwd_interface.flash_attn_func with
           the same e4m3 tensors and descales) and flashkv's own bf16 sm90ws forward; same FLOP formula; the max
           |flashkv - FA3| of the FP8 outputs is reported as a sanity check.
  progression  naive (S and P materialized, PyTorch ops), v1 order (flashkv Algorithm.v1_order), v2 (flashkv tiled).
Timing: triton.testing.do_bench (CUDA events, L2 flushed between calls, median). Results: JSON + markdown in --out
(the tables: bench_attention_report.py).
"""
import argparse
import ctypes
import datetime
import json
import math
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
import triton.testing as tt
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashkv
from flashkv import _library as L
from flashkv._tensor import to_tensor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_attention_report import Paths, decode_table, fp8_table, prefill_table  # noqa: E402

DT = torch.bfloat16


def bench(fn, rep=100):
    return tt.do_bench(fn, warmup=25, rep=rep, return_mode="median")


def flops(b, h, sq, sk, d, causal, mode):
    f = 4 * b * h * sq * sk * d
    if causal:
        f /= 2
    return f * (1 if mode == "fwd" else 3.5)


# ---- flashkv calls ----------------------------------------------------------------------------------------------
def fk_forward(q, k, v, causal, algorithm="tiled", kernel="auto"):
    return flashkv.attention(q, k, v, causal=causal, return_lse=True, algorithm=algorithm, kernel=kernel)


def fk_backward(dout, q, k, v, out, lse, causal, deterministic, kernel="auto"):
    """flashkv.attention_backward with an explicit deterministic flag (default False, as FlashAttention)."""
    return flashkv.attention_backward(dout, q, k, v, out, lse, causal=causal, deterministic=deterministic,
                                      kernel=kernel)


class PrevLib:
    """The previous release's libflashkv.so called through its C ABI (flashkv.h, ABI version 1; struct_size-prefixed
    options filled by its own flashkv_attention_options_default), independent of this package's Python binding."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        T, O, DO = ctypes.POINTER(L.Tensor), ctypes.POINTER(L.AttentionOptions), ctypes.POINTER(L.DecodeOptions)
        for name, args in {"flashkv_attention_options_default": [O], "flashkv_attention_forward": [T] * 5 + [O],
                           "flashkv_attention_backward": [T] * 9 + [O], "flashkv_decode_options_default": [DO],
                           "flashkv_cuda_decode": [T] * 9 + [DO]}.items():
            fn = getattr(self.lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
        self.lib.flashkv_last_error.restype = ctypes.c_char_p

    def _check(self, status):
        if status != 0:
            raise RuntimeError(self.lib.flashkv_last_error().decode())

    def _opts(self, causal, deterministic=False, kernel="auto"):
        o = L.AttentionOptions()
        self._check(self.lib.flashkv_attention_options_default(ctypes.byref(o)))
        o.causal, o.deterministic = int(causal), int(deterministic)
        o.stream = torch.cuda.current_stream().cuda_stream
        # A library with kernel families reads this field; the previous release's smaller struct_size leaves it unread
        # (its sm80 rows go through FLASHKV_CUDA_SM80_ONLY instead, see Sm80OnlyPrev).
        o.kernel_family = L.KERNEL_FAMILIES[kernel]
        return o

    def forward(self, q, k, v, causal, kernel="auto"):
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32, device=q.device)
        t = [to_tensor(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out"), (lse, "lse"))]
        o = self._opts(causal, kernel=kernel)
        self._check(self.lib.flashkv_attention_forward(*[x.ptr for x in t], ctypes.byref(o)))
        return out, lse

    def backward(self, dout, q, k, v, out, lse, causal, kernel="auto"):
        g = [torch.empty_like(x) for x in (q, k, v)]
        t = [to_tensor(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out"), (lse, "lse"), (dout, "dout"),
                                          (g[0], "dq"), (g[1], "dk"), (g[2], "dv"))]
        o = self._opts(causal, kernel=kernel)
        self._check(self.lib.flashkv_attention_backward(*[x.ptr for x in t], ctypes.byref(o)))
        return g

    def forward_backward(self, dout, q, k, v, causal, kernel="auto"):
        out, lse = self.forward(q, k, v, causal, kernel)
        return self.backward(dout, q, k, v, out, lse, causal, kernel)

    def decode(self, q, k_cache, v_cache, page_table, seqlens, out, num_splits, max_seqlen_k):
        o = L.DecodeOptions()
        self._check(self.lib.flashkv_decode_options_default(ctypes.byref(o)))
        o.num_splits, o.max_seqlen_k = num_splits, max_seqlen_k
        o.stream = torch.cuda.current_stream().cuda_stream
        t = [to_tensor(x, n) for x, n in ((q, "q"), (k_cache, "k_cache"), (v_cache, "v_cache"),
                                          (page_table, "page_table"), (seqlens, "cache_seqlens"), (out, "out"))]
        self._check(self.lib.flashkv_cuda_decode(t[0].ptr, t[1].ptr, t[2].ptr, t[3].ptr, t[4].ptr, None, None,
                                                 t[5].ptr, None, ctypes.byref(o)))
        return out


PREV = None  # PrevLib in the --prev-worker process
CUR = None  # this library (FLASHKV_LIBRARY) through PrevLib: timed without the Python binding's per-call cost
try:  # FlashAttention-3's forward (PyPI wheel fa3-fwd==0.0.3; scripts/gpu-run installs it from .whl/ when carried)
    import fa3_fwd_interface as FA3
except Exception:  # noqa: BLE001 — the column is then "-"
    FA3 = None


class Sm80OnlyPrev:
    """FLASHKV_CUDA_SM80_ONLY=1 inside the block, for the previous release only (it reads it on every call; the
    current library takes kernel="sm80" instead)."""

    def __enter__(self):
        os.environ["FLASHKV_CUDA_SM80_ONLY"] = "1"

    def __exit__(self, *exc):
        os.environ.pop("FLASHKV_CUDA_SM80_ONLY", None)


def fk_decode(q, k_cache, v_cache, page_table, seqlens, out, num_splits=0, max_seqlen_k=0):
    """flashkv.paged_decode (the public Python API over flashkv_cuda_decode), writing into `out`."""
    return flashkv.paged_decode(q, k_cache, v_cache, page_table, seqlens, num_splits=num_splits,
                                max_seqlen_k=max_seqlen_k, out=out)


# ---- sections -----------------------------------------------------------------------------------------------------
def prev_sm80(fn):
    def run():
        with Sm80OnlyPrev():
            return fn()
    return run


def timed(row, fn, rep=100):
    """Times fn into row (ms), and for flashkv rows records the kernel path of the last call."""
    row["ms"] = bench(fn, rep)
    if row["backend"].startswith("flashkv"):
        row["path"] = flashkv.last_kernel_path()
    return row


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
                if check and PREV is None:  # flashkv output vs SDPA flash on the benchmark inputs (sanity, not the test suite)
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
                    if PREV is not None:  # the --prev-worker process: the previous release only
                        fns = {}
                        # kernel="sm80" too, so that a library with kernel families given as --prev-library (an
                        # A/A run of this one) times its sm80 kernels in these rows.
                        if mode == "fwd":
                            fns["prev"] = lambda: PREV.forward(qd, kd, vd, causal)
                            fns["prev_sm80"] = prev_sm80(lambda: PREV.forward(qd, kd, vd, causal, "sm80"))
                        else:
                            fns["prev"] = lambda: PREV.forward_backward(g, qd, kd, vd, causal)
                            fns["prev_sm80"] = prev_sm80(lambda: PREV.forward_backward(g, qd, kd, vd, causal, "sm80"))
                    elif mode == "fwd":
                        fns["flashkv"] = lambda: fk_forward(qd, kd, vd, causal)
                        fns["flashkv_sm80"] = lambda: fk_forward(qd, kd, vd, causal, kernel="sm80")
                        # The two Hopper forward families side by side (an UnsupportedError row elsewhere).
                        fns["flashkv_sm90"] = lambda: fk_forward(qd, kd, vd, causal, kernel="sm90")
                        fns["flashkv_sm90ws"] = lambda: fk_forward(qd, kd, vd, causal, kernel="sm90ws")
                        if FA3 is not None:
                            fns["fa3"] = lambda: FA3.flash_attn_func(qd, kd, vd, causal=causal)
                    else:
                        def fk_fb(det, kernel="auto"):
                            out, lse = fk_forward(qd, kd, vd, causal, kernel=kernel)
                            return fk_backward(g, qd, kd, vd, out, lse, causal, det, kernel=kernel)
                        fns["flashkv"] = lambda: fk_fb(False)
                        fns["flashkv_det"] = lambda: fk_fb(True)
                        fns["flashkv_sm80"] = lambda: fk_fb(False, "sm80")
                    if CUR is not None and PREV is None:  # this library through the C ABI, exactly as prev is called
                        if mode == "fwd":
                            fns["flashkv_cabi"] = lambda: CUR.forward(qd, kd, vd, causal)
                            fns["flashkv_cabi_sm80"] = lambda: CUR.forward(qd, kd, vd, causal, "sm80")
                        else:
                            fns["flashkv_cabi"] = lambda: CUR.forward_backward(g, qd, kd, vd, causal)
                            fns["flashkv_cabi_sm80"] = lambda: CUR.forward_backward(g, qd, kd, vd, causal, "sm80")
                    for name, fn in fns.items():
                        try:
                            r = timed(dict(d=d, s=s, b=bsz, h=h, causal=causal, backend=name, mode=mode), fn)
                            r["tflops"] = flops(bsz, h, s, s, d, causal, mode) / r["ms"] / 1e9
                            rows.append(r)
                        except Exception as e:  # noqa: BLE001 — a backend may not support a shape
                            rows.append(dict(d=d, s=s, causal=causal, backend=name, mode=mode, err=str(e)[:160]))
                        print(f"  {rows[-1]}", flush=True)
            del q, k, v, g
            torch.cuda.empty_cache()
    return rows


def fa3_fp8(q8, k8, v8, causal, descales):
    """FA3's FP8 forward on the same e4m3 tensors (descales passed when the wheel's interface takes them)."""
    try:
        return FA3.flash_attn_func(q8, k8, v8, causal=causal, q_descale=descales[0], k_descale=descales[1],
                                   v_descale=descales[2])
    except TypeError:  # an interface without descales: unit scales, as the flashkv call's are compared below
        return FA3.flash_attn_func(q8, k8, v8, causal=causal)


def fp8_prefill(dims, seqlens):
    """The prefill grid's forward in FP8 (module docstring, section fp8)."""
    rows = []
    e4m3 = torch.float8_e4m3fn
    for d in dims:
        for s in seqlens:
            bsz, h = max(1, 16384 // s), 2048 // d
            qb = torch.randn(bsz, s, h, d, dtype=DT, device="cuda")
            kb, vb = torch.randn_like(qb), torch.randn_like(qb)
            q8, k8, v8 = (x.to(e4m3) for x in (qb, kb, vb))
            ds = [torch.full((bsz, h), 1.0, dtype=torch.float32, device="cuda") for _ in range(3)]
            for causal in (False, True):
                fns = {"flashkv_fp8": lambda: flashkv.attention(q8, k8, v8, causal=causal, kernel="sm90ws",
                                                                q_descale=ds[0], k_descale=ds[1], v_descale=ds[2]),
                       "flashkv_bf16_sm90ws": lambda: fk_forward(qb, kb, vb, causal, kernel="sm90ws")}
                if FA3 is not None:
                    fns["fa3_fp8"] = lambda: fa3_fp8(q8, k8, v8, causal, ds)
                outs = {}
                for name, fn in fns.items():
                    try:
                        r = timed(dict(d=d, s=s, b=bsz, h=h, causal=causal, backend=name, mode="fwd"), fn)
                        r["tflops"] = flops(bsz, h, s, s, d, causal, "fwd") / r["ms"] / 1e9
                        o = fn()
                        outs[name] = o[0] if isinstance(o, tuple) else o
                        rows.append(r)
                    except Exception as e:  # noqa: BLE001 — a backend may not support a shape
                        rows.append(dict(d=d, s=s, causal=causal, backend=name, mode="fwd", err=str(e)[:160]))
                    print(f"  {rows[-1]}", flush=True)
                if "flashkv_fp8" in outs and "fa3_fp8" in outs:
                    err = (outs["flashkv_fp8"].float() - outs["fa3_fp8"].float()).abs().max().item()
                    rows.append(dict(d=d, s=s, causal=causal, backend="check", mode="fwd", max_abs_diff=err))
            del qb, kb, vb, q8, k8, v8
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
        if PREV is not None:
            r = timed(dict(b=bsz, L=ctx, backend="prev"), lambda: PREV.decode(q, kc, vc, table, seqlens, out, 0, ctx))
            r["TBps"] = kvbytes / r["ms"] / 1e9
            rows.append(r)
            print(f"  {rows[-1]}", flush=True)
            del kc, vc, q
            torch.cuda.empty_cache()
            continue
        for splits in (0, 1):
            name = "flashkv" if splits == 0 else "flashkv_nosplit"
            r = timed(dict(b=bsz, L=ctx, backend=name), lambda: fk_decode(q, kc, vc, table, seqlens, out, splits, ctx))
            r["TBps"] = kvbytes / r["ms"] / 1e9
            rows.append(r)
            print(f"  {rows[-1]}", flush=True)
        if CUR is not None:  # this library through the raw C ABI, exactly as the previous release is called
            r = timed(dict(b=bsz, L=ctx, backend="flashkv_cabi"), lambda: CUR.decode(q, kc, vc, table, seqlens, out, 0, ctx))
            r["TBps"] = kvbytes / r["ms"] / 1e9
            rows.append(r)
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
               "v2 (flashkv sm80, mma.sync)": lambda: fk_forward(q, k, v, causal, kernel="sm80"),
               "v3-class (flashkv sm90, wgmma)": lambda: fk_forward(q, k, v, causal, kernel="sm90"),
               "v3 (flashkv sm90ws, TMA + warp specialization)": lambda: fk_forward(q, k, v, causal, kernel="sm90ws")}
        for name, fn in fns.items():
            try:
                ms = bench(fn, rep=50)
                rows.append(dict(d=d, s=s, causal=causal, variant=name, ms=ms,
                                 tflops=flops(bsz, h, s, s, d, causal, "fwd") / ms / 1e9,
                                 path=flashkv.last_kernel_path() if "flashkv" in name else ""))
            except Exception as e:  # noqa: BLE001
                rows.append(dict(d=d, s=s, causal=causal, variant=name, err=str(e)[:160]))
            print(f"  {rows[-1]}", flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    return rows


def run_prev(path, sections, quick):
    """The previous release, timed in a subprocess (its own CUDA runtime and statics); its rows."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, os.path.abspath(__file__), "--prev-worker", path, "--out", tmp, "--sections",
               ",".join(x for x in sections if x in ("prefill", "decode"))] + (["--quick"] if quick else [])
        print("previous release:", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        with open(os.path.join(tmp, "prev.json")) as f:
            return json.load(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a subset of the grid (seqlen 1k/4k/16k)")
    ap.add_argument("--sections", default="prefill,fp8,decode,progression,flex")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--prev-library", help="the previous release's libflashkv.so: its numbers join the tables")
    ap.add_argument("--prev-worker", help=argparse.SUPPRESS)  # internal: time only this library, write prev.json
    a = ap.parse_args()
    sections = a.sections.split(",")
    global PREV, CUR
    seqlens = (1024, 4096, 16384) if a.quick else (512, 1024, 2048, 4096, 8192, 16384)
    decode_grid = ((1, 32768), (1, 131072), (16, 8192), (64, 4096), (64, 16384), (128, 8192), (128, 4096))
    if a.prev_worker:
        PREV = PrevLib(a.prev_worker)
        res = {}
        if "prefill" in sections:
            res["prefill"] = prefill((64, 128, 256), seqlens, ("fwd", "fwdbwd"), check=False)
        if "decode" in sections:
            res["decode"] = decode(decode_grid)
        with open(os.path.join(a.out, "prev.json"), "w") as f:
            json.dump(res, f)
        return
    dev = torch.cuda.get_device_properties(0)
    meta = dict(gpu=dev.name, sms=dev.multi_processor_count, torch=torch.__version__,
                cudnn=torch.backends.cudnn.version(), date=datetime.datetime.utcnow().isoformat(timespec="seconds"),
                command=" ".join(sys.argv), flashkv_library=L.library_path())
    print("device", meta, flush=True)
    res = dict(meta=meta, ceilings=ceilings())
    print("ceilings", res["ceilings"], flush=True)
    CUR = PrevLib(L.library_path())  # the same loaded library, called like the previous release (ctypes only)
    if "prefill" in sections:
        res["prefill"] = prefill((64, 128, 256), seqlens, ("fwd", "fwdbwd"), check=True)
    if "fp8" in sections:
        res["fp8"] = fp8_prefill((64, 128, 256), seqlens)
    if "flex" in sections:
        res["flex"] = flex_rows(((128, 8192), (64, 8192)))
    if "decode" in sections:
        res["decode"] = decode(decode_grid)
    if "progression" in sections:
        res["progression"] = progression(((128, 1024, False), (128, 4096, False), (128, 4096, True)))
    if a.prev_library:
        res["meta"]["prev_library"] = a.prev_library
        prev = run_prev(a.prev_library, sections, a.quick)
        for sec in ("prefill", "decode"):
            if sec in res:
                res[sec] += prev.get(sec, [])
    os.makedirs(a.out, exist_ok=True)
    stamp = datetime.date.today().isoformat()
    with open(os.path.join(a.out, f"h200-attention-{stamp}.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = [f"# flashkv CUDA vs PyTorch SDPA on {meta['gpu']} — {meta['date']}",
          "flashkv: default dispatch (kernel=\"auto\": on Hopper for head dims 64/128/256 the sm90ws forward where "
          "measured faster, else the sm90 kernels; docs/gpu.md); flashkv sm80 / sm90 / sm90ws: kernel=\"sm80\" "
          "(mma.sync, FA2-class) / \"sm90\" (wgmma, cp.async) / \"sm90ws\" (TMA + wgmma, warp-specialized, "
          "forward only); flashkv det: deterministic backward; prev / prev "
          "sm80: the previous release " + (f"(`{a.prev_library}`, its sm80 kernels through FLASHKV_CUDA_SM80_ONLY=1)"
                                           if a.prev_library else "(not measured: no --prev-library)") +
          ", same run. Paths: flashkv.last_kernel_path() of the rows, footnotes below each table.",
          f"Command: `{meta['command']}`; torch {meta['torch']}, cuDNN {meta['cudnn']}.",
          f"Ceilings (same run): copy {res['ceilings']['copy_TBps']:.2f} TB/s (read+write), HBM read "
          f"{res['ceilings']['read_TBps']:.2f} TB/s, bf16 GEMM {res['ceilings']['bf16_gemm_TFLOPs']:.0f} TFLOP/s.", ""]
    if "prefill" in res:
        paths = Paths()
        md += ["## Prefill, bf16, TFLOP/s (16k tokens/batch, hidden 2048)", prefill_table(res["prefill"], paths), ""]
        md += paths.notes() + [""]
        checks = [r for r in res["prefill"] if r["backend"] == "check"]
        md += [f"Max |flashkv - SDPA flash| over the benchmark inputs: {max(r['max_abs_diff'] for r in checks):.3g}", ""]
    if "fp8" in res:
        paths = Paths()
        md += ["## Prefill forward, FP8 e4m3 (bf16 out), TFLOP/s (16k tokens/batch, hidden 2048); FA3 = "
               "fa3_fwd_interface.flash_attn_func on the same e4m3 tensors" + ("" if FA3 is not None else
                                                                               " (not installed: column empty)"),
               fp8_table(res["fp8"], paths), ""] + paths.notes() + [""]
    if "flex" in res:
        md += ["## FlexAttention (fwd, TFLOP/s)"] + [
            f"- d={r['d']} s={r['s']} causal={int(r['causal'])}: {r['tflops']:.0f}" if "tflops" in r else f"- {r}"
            for r in res["flex"]] + [""]
    if "decode" in res:
        paths = Paths()
        md += ["## Decode, bf16 KV, 32 q / 8 kv heads, d=128 (effective KV bandwidth)",
               decode_table([r for r in res["decode"] if r["backend"] != "check"], res["ceilings"]["read_TBps"],
                            paths), ""] + paths.notes() + [""]
    if "progression" in res:
        md += ["## Progression (fwd, d=128, 16k tokens)", "| seqlen | causal | variant | ms | TFLOP/s | path |",
               "|---|---|---|---|---|---|"] + [
            f"| {r['s']} | {int(r['causal'])} | {r['variant']} | {r.get('ms', 0):.3f} | {r.get('tflops', 0):.1f} | "
            f"{r.get('path') or '-'} |" for r in res["progression"]] + [""]
    text = "\n".join(md)
    with open(os.path.join(a.out, f"h200-attention-{stamp}.md"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
