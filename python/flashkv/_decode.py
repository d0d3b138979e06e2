"""Split-KV paged decode (flash-decoding) over the C function ``flashkv_cuda_decode`` (include/flashkv/flashkv_cuda.h;
semantics in include/flashkv/decode.hpp): CUDA tensors run the CUDA kernels, CPU arrays / tensors the CPU decode.

Algorithm: the keys of each sequence are split into ``num_splits`` chunks processed by separate thread blocks, each
producing a partial output and its log-sum-exp, merged exactly (on CUDA by the last block of each tile to finish) (Dao et al. 2023,
"Flash-Decoding for long-context inference"; FlashAttention-3's split-KV with the query heads of one KV head packed
into one tile, "PackGQA"). The result is exact attention, equal to ``flashkv.attention`` on the gathered keys up to
float32 rounding.
"""
from __future__ import annotations

import ctypes
import math
from typing import Any

from . import _library as L
from ._attention import _bool_arg, _float_arg, _int_arg
from ._tensor import TensorArg, cuda_stream, new_output, to_tensor


def _int32_arg(x: Any, name: str) -> TensorArg:
    """An int32 table (page_table, cache_seqlens); a torch tensor of another dtype is a TypeError naming it."""
    if x is None:
        raise TypeError(f"flashkv: argument '{name}': expected an int32 array or tensor, got None")
    tname = str(getattr(x, "dtype", ""))
    if tname.startswith("torch.") and tname != "torch.int32":
        raise TypeError(f"flashkv: argument '{name}': expected int32, got {tname}")
    return to_tensor(x, name)  # numpy of another dtype: the library reports it (TypeError naming the argument)


def _options(softmax_scale: Any, causal: Any, softcap: Any, num_splits: Any, max_seqlen_k: Any,
             window_size_left: Any = -1, num_threads: Any = 0) -> L.DecodeOptions:
    """flashkv_decode_options from the Python arguments: ints / bools / floats checked (never truncated or wrapped;
    the same checks as flashkv.attention), ranges that only Python can see checked here, the rest by the library."""
    o = L.DecodeOptions()
    L.check(L.lib().flashkv_decode_options_default(ctypes.byref(o)))
    if softmax_scale is not None:
        o.has_softmax_scale = 1
        o.softmax_scale = _float_arg(softmax_scale, "softmax_scale", "a float or None")
        if math.isfinite(softmax_scale) and not math.isfinite(o.softmax_scale):  # overflows float32
            raise ValueError(f"flashkv: argument 'softmax_scale': expected a float32 value, got {softmax_scale!r}")
    o.causal = 1 if _bool_arg(causal, "causal") else 0
    o.softcap = _float_arg(softcap, "softcap", "a float")
    o.num_splits = _int_arg(num_splits, "num_splits", 0, 1024)
    o.max_seqlen_k = _int_arg(max_seqlen_k, "max_seqlen_k", 0, 2**63 - 1)
    o.window_size_left = _int_arg(window_size_left, "window_size_left", -1)
    o.num_threads = _int_arg(num_threads, "num_threads", 0)
    return o


def paged_decode(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    page_table: Any,
    cache_seqlens: Any,
    *,
    k_new: Any = None,
    v_new: Any = None,
    softmax_scale: float | None = None,
    causal: bool = True,
    softcap: float = 0.0,
    num_splits: int = 0,
    max_seqlen_k: int = 0,
    window_size_left: int = -1,
    num_threads: int = 0,
    out: Any = None,
    return_lse: bool = False,
) -> Any:
    """Attention of a few new query tokens per sequence against a paged 16-bit KV cache, optionally appending the new
    tokens' K/V to the cache first (split-KV "flash-decoding"), on CUDA (torch CUDA tensors) or on the CPU (numpy
    arrays or CPU torch tensors; float32 allowed there too).

    Shapes (bshd; every tensor on one device, last dimension contiguous):
        q              [batch, seqlen_q, num_heads, head_dim]       the new tokens' queries (seqlen_q small, e.g. 1)
        k_cache/v_cache [num_pages, page_size, num_heads_kv, head_dim] physical pages, shared by all sequences;
                       page_size (shape[1]) a power of two in 16..256
        page_table     [batch, max_pages] int32: token t of sequence b lives in page page_table[b, t // page_size],
                       row t % page_size. Or None: then k_cache/v_cache are contiguous
                       [batch, capacity, num_heads_kv, head_dim] caches (sequence b in k_cache[b]).
        cache_seqlens  [batch] int32: tokens already in the cache for each sequence.
        k_new/v_new    None, or both [batch, seqlen_q, num_heads_kv, head_dim]: the new tokens' keys and values.
        out            None (allocated) or a preallocated [batch, seqlen_q, num_heads, head_dim] tensor, written.
    Returns out [batch, seqlen_q, num_heads, head_dim] (same dtype/device as q), and lse [batch, num_heads, seqlen_q]
    float32 (natural log; -inf for a row that sees no key, whose out is 0) if return_lse.

    Semantics:
        * With k_new/v_new, token i of sequence b is first written into the cache at position cache_seqlens[b] + i
          (through the page table; k_cache and v_cache are modified in place), and attention covers
          seqlen_k = cache_seqlens[b] + seqlen_q tokens. Without them it covers seqlen_k = cache_seqlens[b].
        * cache_seqlens is NOT updated: after an append the caller adds seqlen_q to it for the next step.
        * The cache holds at most capacity = max_pages * page_size tokens per sequence (shape[1] without a page
          table). cache_seqlens[b] (+ seqlen_q when appending) > capacity raises flashkv.CapacityError naming the
          sequence, the lengths and the capacity, before anything is written. On CUDA that check reads cache_seqlens
          back (one small synchronous copy) unless max_seqlen_k > 0 promises cache_seqlens <= max_seqlen_k (then
          max_seqlen_k + seqlen_q <= capacity is checked; a sequence breaking the promise gets NaN output / lse and
          nothing appended). Page ids are checked on the CPU; on the device every id among the first
          ceil(seqlen_k / page_size) entries of a row must be < num_pages. Entries past those are never read.
        * causal (default True) is bottom-right aligned: query i sees keys j <= i + seqlen_k - seqlen_q, i.e. each new
          token sees the cache and the new tokens up to itself. causal=False lets every query see all seqlen_k keys.
        * softmax_scale defaults to 1/sqrt(head_dim); softcap > 0 applies softcap * tanh(score / softcap).
        * GQA/MQA: num_heads a multiple of num_heads_kv; the query heads of one KV head are processed together.
        * window_size_left = W >= 0: query at position p sees keys j in [p - W, p] only (sliding window).
        * num_splits: 0 = heuristic (CUDA: a wave model after FlashAttention-3's, src/cuda/decode_splits.hpp),
          1 = no split, n = n splits (<= 1024). Any choice gives the same result up to rounding (CUDA: each split
          rounds its P to 16 bits for the P·V MMA, a difference at the 16-bit computation's own error level).
        * Non-finite inputs (include/flashkv/decode.hpp): a NaN / inf score of a visible key makes that row's out and
          lse NaN; a non-finite value makes the output channels it reaches non-finite; masked keys and slots past
          the lengths never matter. Only a row without visible keys gets out 0 and lse -inf.
        * CUDA: runs asynchronously on torch.cuda.current_stream() of q's device (no synchronization when
          max_seqlen_k is given). CPU: num_threads OpenMP threads (0 = all).

    dtypes: q, k_cache, v_cache, k_new, v_new, out: one dtype, bfloat16 or float16 (CPU: also float32; float32
    accumulation); page_table, cache_seqlens: int32. CUDA: head_dim a multiple of 8, <= 256, and compiled for decode
    (64 and 128 by default; a smaller head_dim runs on the next compiled one; see docs/gpu.md).

    Errors (each names the argument, expected vs actual):
        TypeError: wrong dtype (e.g. float32 on CUDA, or mixed bf16/fp16), an int64 page_table/cache_seqlens,
            tensors on different devices (CPU with CUDA, or two GPUs), not an array/tensor.
        ValueError: wrong rank or shape, page_size not a power of two in 16..256, head_dim not a multiple of 8 or
            > 256 (CUDA), num_heads not a multiple of num_heads_kv, only one of k_new/v_new, softcap < 0,
            softmax_scale <= 0, num_splits outside 0..1024, max_seqlen_k < 0, window_size_left < -1, a negative
            cache_seqlens, a page id out of range (CPU), pointers or strides not 16-byte aligned (CUDA).
        flashkv.CapacityError: lengths past the capacity (above); nothing was written.
        flashkv.UnsupportedError: CUDA tensors and a library built without the CUDA backend (the message says so),
            or a head_dim/dtype combination that is not compiled (the message lists what is), or batch > 65535.
    """
    if (k_new is None) != (v_new is None):
        missing = "v_new" if v_new is None else "k_new"
        raise ValueError(f"flashkv: argument '{missing}': expected k_new and v_new given together, got only one")
    lib = L.lib()
    if getattr(lib, "flashkv_cuda_decode", None) is None:
        raise L.UnsupportedError(f"flashkv: {L.library_path()} has no flashkv_cuda_decode (an older library)")
    o = _options(softmax_scale, causal, softcap, num_splits, max_seqlen_k, window_size_left, num_threads)
    tq, tk, tv = to_tensor(q, "q"), to_tensor(k_cache, "k_cache"), to_tensor(v_cache, "v_cache")
    tpt = _int32_arg(page_table, "page_table") if page_table is not None else None
    tsl = _int32_arg(cache_seqlens, "cache_seqlens")
    tkn = to_tensor(k_new, "k_new") if k_new is not None else None
    tvn = to_tensor(v_new, "v_new") if v_new is not None else None
    if len(tq.shape) != 4:
        raise ValueError(
            f"flashkv: argument 'q': expected 4 dimensions [batch, seqlen_q, num_heads, head_dim], got "
            f"{len(tq.shape)} dimensions {list(tq.shape)}"
        )
    tout = new_output(tq, tq.shape, "out") if out is None else to_tensor(out, "out")
    batch, seqlen_q, num_heads = tq.shape[:3]
    tlse = new_output(tq, (batch, num_heads, seqlen_q), "lse", float32=True) if return_lse else None
    stream = cuda_stream([tq, tk, tv, tout])
    if stream is not None:
        o.stream = stream
    ptr = lambda t: t.ptr if t is not None else None  # noqa: E731
    L.check(
        lib.flashkv_cuda_decode(
            tq.ptr, tk.ptr, tv.ptr, ptr(tpt), tsl.ptr, ptr(tkn), ptr(tvn), tout.ptr, ptr(tlse), ctypes.byref(o)
        )
    )
    return (tout.obj, tlse.obj) if return_lse else tout.obj


__all__ = ["paged_decode"]
