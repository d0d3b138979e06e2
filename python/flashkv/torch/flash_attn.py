"""flash-attn-compatible functions over flashkv's custom operators: ``import flashkv.torch as flash_attn`` (or
``from flashkv.torch import flash_attn_func``) in place of ``import flash_attn``.

Same argument names, order, defaults, shapes and return conventions as the ``flash_attn`` package (FlashAttention-2,
``flash_attn/flash_attn_interface.py``) for the supported subset:

    flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False)
        q [batch, seqlen_q, num_heads, head_dim], k/v [batch, seqlen_k, num_heads_kv, head_dim]
        -> out [batch, seqlen_q, num_heads, head_dim], or (out, softmax_lse [batch, num_heads, seqlen_q] float32,
           S_dmask) if return_attn_probs
    flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None)
        q [total_q, num_heads, head_dim], k/v [total_k, num_heads_kv, head_dim], cu_seqlens_q/k [batch + 1] int32
        -> out [total_q, num_heads, head_dim], or (out, softmax_lse [num_heads, total_q], S_dmask)
    flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False)
        -> out [batch, seqlen_q, num_heads, head_dim], or (out, softmax_lse [batch, num_heads, seqlen_q])

Semantics as flash_attn: causal is bottom-right aligned; window_size=(left, right) lets query i see keys
[i + seqlen_k - seqlen_q - left, i + seqlen_k - seqlen_q + right] (-1 = unbounded); a row that sees no key gives
out = 0 (lse = -inf); softcap > 0 applies softcap * tanh(score / softcap); GQA/MQA by fewer k/v heads;
softmax_scale defaults to 1/sqrt(head_dim). The first two are differentiable in q, k, v (loss.backward() runs
flashkv's FA2 backward; deterministic=True sums dQ in a fixed order on CUDA, the CPU backward is always
deterministic); softmax_lse carries no gradient (as in flash_attn, whose backward ignores it). flash_attn_with_kvcache
appends k/v into k_cache/v_cache in place at cache_seqlens (not updated) and has no backward, as in flash_attn.

Differences, each an error naming the argument (flashkv.UnsupportedError, a NotImplementedError), never ignored:
dropout_p > 0, alibi_slopes, varlen block_table, and for the kvcache call rotary_cos/rotary_sin, cache_batch_idx,
cache_leftpad and a sliding window (window_size[0] >= 0 or window_size[1] > 0). S_dmask is always an empty tensor:
flash_attn returns attention probabilities only when dropout_p > 0, which flashkv does not support. Paged caches:
page_size (k_cache.shape[1]) a power of two in 16..256 (flash_attn: a multiple of 256). Devices and dtypes: CPU
(float32/float16/bfloat16) and CUDA (float16/bfloat16; head dims as compiled, docs/gpu.md); CUDA work runs on the
current stream with no host synchronization (max_seqlen_q/k are ints, as in flash_attn).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import torch

from .._library import UnsupportedError
from . import _ops

Tensor = torch.Tensor


def _unsupported(name: str, what: str) -> UnsupportedError:
    return UnsupportedError(f"flashkv: argument '{name}': {what}")


def _need_tensor(x: Any, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"flashkv: argument '{name}': expected a torch.Tensor, got {type(x).__name__}")


def _common(dropout_p: float, window_size: Sequence[int], softcap: float, alibi_slopes: Any,
            softmax_scale: Optional[float]) -> tuple[int, int, float, Optional[float]]:
    if dropout_p != 0.0:
        raise _unsupported("dropout_p", f"attention dropout is not supported (expected 0.0, got {dropout_p!r})")
    if alibi_slopes is not None:
        raise _unsupported("alibi_slopes", "ALiBi biases are not supported (expected None)")
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError) as e:
        raise ValueError(f"flashkv: argument 'window_size': expected a pair (left, right) of ints (-1 = unbounded), "
                         f"got {window_size!r}") from e
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"flashkv: argument 'softcap': expected a float, got {type(softcap).__name__}")
    if softmax_scale is not None:
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
            raise TypeError(f"flashkv: argument 'softmax_scale': expected a float or None, got "
                            f"{type(softmax_scale).__name__}")
        softmax_scale = float(softmax_scale)
    return left, right, float(softcap), softmax_scale


def _maybe_contiguous(x: Tensor) -> Tensor:
    return x.contiguous() if x.stride(-1) != 1 else x


def _s_dmask(q: Tensor) -> Tensor:
    return torch.empty((0,), dtype=q.dtype, device=q.device)


def flash_attn_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
):
    """Exact attention, differentiable (see the module docstring for shapes, semantics and the supported subset)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        _need_tensor(x, name)
    left, right, softcap, softmax_scale = _common(dropout_p, window_size, softcap, alibi_slopes, softmax_scale)
    q, k, v = (_maybe_contiguous(x) for x in (q, k, v))
    out, lse = _ops.fwd(q, k, v, softmax_scale, bool(causal), left, right, softcap, bool(deterministic))
    return (out, lse, _s_dmask(q)) if return_attn_probs else out


def _int32_cu(x: Any, name: str) -> Tensor:
    _need_tensor(x, name)
    if x.dtype == torch.int64:
        return x.to(torch.int32)  # on the tensor's device: no host synchronization
    return x


def _seqlen_int(x: Any, name: str) -> int:
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        return int(x)  # flash_attn takes an int; a one-element tensor is read (a host synchronization on CUDA)
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"flashkv: argument '{name}': expected an int, got {type(x).__name__}")
    return x


def flash_attn_varlen_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: Optional[Tensor] = None,
):
    """Varlen (packed) exact attention, differentiable; sequence b is rows cu_seqlens_q[b]:cu_seqlens_q[b+1] of q
    against rows cu_seqlens_k[b]:cu_seqlens_k[b+1] of k/v. max_seqlen_q/k: ints bounding the sequence lengths."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        _need_tensor(x, name)
    left, right, softcap, softmax_scale = _common(dropout_p, window_size, softcap, alibi_slopes, softmax_scale)
    if block_table is not None:
        raise _unsupported("block_table", "paged K/V in the varlen call is not supported (expected None); use "
                                          "flash_attn_with_kvcache(..., block_table=...) for paged caches")
    cu_q, cu_k = _int32_cu(cu_seqlens_q, "cu_seqlens_q"), _int32_cu(cu_seqlens_k, "cu_seqlens_k")
    mq, mk = _seqlen_int(max_seqlen_q, "max_seqlen_q"), _seqlen_int(max_seqlen_k, "max_seqlen_k")
    q, k, v = (_maybe_contiguous(x) for x in (q, k, v))
    out, lse = _ops.varlen_fwd(q, k, v, cu_q, cu_k, mq, mk, softmax_scale, bool(causal), left, right, softcap,
                               bool(deterministic))
    return (out, lse, _s_dmask(q)) if return_attn_probs else out


def flash_attn_with_kvcache(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Optional[Tensor] = None,
    v: Optional[Tensor] = None,
    rotary_cos: Optional[Tensor] = None,
    rotary_sin: Optional[Tensor] = None,
    cache_seqlens: Optional[Union[int, Tensor]] = None,
    cache_batch_idx: Optional[Tensor] = None,
    cache_leftpad: Optional[Tensor] = None,
    block_table: Optional[Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: Optional[Tensor] = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
):
    """Decode-time attention against a (paged) KV cache, appending k/v first (in place) when given.

    k_cache/v_cache: [batch, seqlen_cache, num_heads_kv, head_dim] without block_table, else
    [num_pages, page_size, num_heads_kv, head_dim] with block_table [batch, max_pages] int32. cache_seqlens: int or
    [batch] int32, tokens already in the cache (None = the whole capacity); not updated. k/v: [batch, seqlen_new,
    num_heads_kv, head_dim] written at cache_seqlens[b] + i, then attention covers cache_seqlens[b] + seqlen_new keys.
    Capacity (max_pages * page_size, or seqlen_cache): lengths past it raise flashkv.CapacityError before anything is
    written when cache_seqlens is an int or on the CPU; a CUDA cache_seqlens tensor is not read back (no host
    synchronization, as flash_attn): the kernels check it on the device and a sequence past the capacity gets NaN out
    and lse, nothing written past its pages. num_splits: 0 = heuristic, 1 = no split, n <= 1024 splits."""
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _need_tensor(x, name)
    left, right, softcap, softmax_scale = _common(0.0, window_size, softcap, alibi_slopes, softmax_scale)
    for name, val in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin), ("cache_batch_idx", cache_batch_idx),
                      ("cache_leftpad", cache_leftpad)):
        if val is not None:
            raise _unsupported(name, "not supported by flashkv's paged decode (expected None)")
    if left >= 0 or right > 0:
        raise _unsupported("window_size", f"a sliding window is not supported by flashkv's paged decode (expected "
                                          f"(-1, -1) or (-1, 0), got {tuple(window_size)})")
    causal = bool(causal) or right == 0
    if (k is None) != (v is None):
        raise ValueError(f"flashkv: argument '{'v' if v is None else 'k'}': expected k and v given together, got "
                         "only one")
    if isinstance(num_splits, bool) or not isinstance(num_splits, int):
        raise TypeError(f"flashkv: argument 'num_splits': expected an int, got {type(num_splits).__name__}")
    if q.dim() != 4:
        raise ValueError(f"flashkv: argument 'q': expected 4 dimensions [batch, seqlen_q, num_heads, head_dim], got "
                         f"shape {list(q.shape)}")
    batch = q.shape[0]
    if block_table is not None:
        _need_tensor(block_table, "block_table")
        capacity = block_table.shape[1] * k_cache.shape[1] if block_table.dim() == 2 else 0
    else:
        capacity = k_cache.shape[1]
    seqlen_new = k.shape[1] if k is not None and k.dim() == 4 else 0
    if cache_seqlens is None or isinstance(cache_seqlens, int):
        n = capacity if cache_seqlens is None else int(cache_seqlens)
        cache_seqlens = torch.full((batch,), n, dtype=torch.int32, device=q.device)
        max_seqlen_k = n  # known on the host: checked against the capacity without reading anything back
    else:
        cache_seqlens = _int32_cu(cache_seqlens, "cache_seqlens")
        # On CUDA the lengths stay on the device: promise the largest length that fits (the kernels turn a broken
        # promise into NaN for that sequence, never a write past its pages); 0 (read back) when nothing fits.
        max_seqlen_k = max(capacity - seqlen_new, 0)
    q = _maybe_contiguous(q)
    if k is not None:
        k, v = _maybe_contiguous(k), _maybe_contiguous(v)
    out, lse = _ops.paged_decode(q, k_cache, v_cache, block_table, cache_seqlens, k, v, softmax_scale, causal, softcap,
                                 num_splits, max_seqlen_k)
    return (out, lse) if return_softmax_lse else out


__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"]
