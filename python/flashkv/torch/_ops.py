"""flashkv's attention as PyTorch custom operators (torch.library.custom_op) over the flashkv C ABI.

Operators (namespace ``torch.ops.flashkv``), each with a fake (meta) implementation so that ``torch.compile`` (also
``fullgraph=True``) and ``torch.export`` trace them as single graph nodes, and with autograd registered for the
forward ones (``register_autograd``: ``loss.backward()`` runs ``bwd`` / ``varlen_bwd``):

    fwd(q, k, v, softmax_scale, causal, window_size_left, window_size_right, softcap) -> (out, lse)
    bwd(dout, q, k, v, out, lse, softmax_scale, causal, window_size_left, window_size_right, softcap,
        deterministic) -> (dq, dk, dv)
    varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
               window_size_left, window_size_right, softcap) -> (out, lse)
    varlen_bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
               causal, window_size_left, window_size_right, softcap, deterministic) -> (dq, dk, dv)
    paged_decode(q, k_cache!, v_cache!, page_table, cache_seqlens, k_new, v_new, softmax_scale, causal, softcap,
                 num_splits, max_seqlen_k) -> (out, lse)
    kv_append(k_cache!, v_cache!, page_table, cache_seqlens, k_new, v_new) -> ()

Shapes, masks and dtypes are those of flashkv.attention / attention_varlen / paged_decode (docs/python.md): bshd
layout, q [batch, seqlen_q, num_heads, head_dim], k/v [batch, seqlen_k, num_heads_kv, head_dim(_v)], lse
[batch, num_heads, seqlen_q] float32 natural log (varlen: packed rows, lse [num_heads, total_q]); causal is
bottom-right aligned; window sizes in tokens (-1 = unbounded); softcap 0 = off; softmax_scale None = 1/sqrt(head_dim).
Tensors may be CPU or CUDA (float32/float16/bfloat16 on the CPU, float16/bfloat16 on CUDA); CUDA work is queued on
``torch.cuda.current_stream()`` and nothing here synchronizes with the host (varlen takes max_seqlen_q/k as ints).

Algorithm: FlashAttention (Dao et al. 2022, §3.1 Alg. 1) with FA2 work partitioning (Dao 2023, §3.1-3.2); the
backward recomputes P from lse (FA2 §3.1.2 Alg. 2); paged_decode is split-KV flash-decoding (Dao et al. 2023) on CUDA
and, on the CPU, the same result computed by gathering the pages and running the varlen forward.

Autograd: out is differentiable in q, k and v. lse is returned for merging partial results and carries no gradient
(it is marked non-differentiable, so ``lse.requires_grad`` is False): code that needs d(loss)/d(lse) must write its own
backward, as flashkv.torch.distributed does. Double backward is not supported (an error, not a wrong result).
"""
from __future__ import annotations

from typing import Optional

import torch

from .. import _attention as _A
from .. import _decode as _D
from .._library import CapacityError

Tensor = torch.Tensor


def _last_contiguous(x: Tensor) -> Tensor:
    """flashkv reads any strides but needs a unit stride on the last dimension (e.g. an expanded gradient has 0)."""
    return x if x.dim() == 0 or x.shape[-1] <= 1 or x.stride(-1) == 1 else x.contiguous()


def _grad_layout(x: Tensor) -> Tensor:
    """Gradients can arrive expanded (stride 0) or permuted: give the kernel a dense tensor."""
    return x if x.is_contiguous() else x.contiguous()


# ---- fixed-length forward / backward ---------------------------------------------------------------------------------


@torch.library.custom_op("flashkv::fwd", mutates_args=())
def fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: Optional[float],
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    softcap: float,
    deterministic: bool = False,
) -> tuple[Tensor, Tensor]:
    q, k, v = (_last_contiguous(x) for x in (q, k, v))
    return _A.attention(
        q, k, v, causal=causal, window_size=(window_size_left, window_size_right), softcap=softcap,
        softmax_scale=softmax_scale, return_lse=True,
    )


@fwd.register_fake
def _fwd_fake(q, k, v, softmax_scale, causal, window_size_left, window_size_right, softcap, deterministic=False):
    b, sq, h, _ = q.shape
    return q.new_empty((b, sq, h, v.shape[-1])), q.new_empty((b, h, sq), dtype=torch.float32)


@torch.library.custom_op("flashkv::bwd", mutates_args=())
def bwd(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    softmax_scale: Optional[float],
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    softcap: float,
    deterministic: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    dout = _grad_layout(dout)
    q, k, v, out = (_last_contiguous(x) for x in (q, k, v, out))
    return _A.attention_backward(
        dout, q, k, v, out, lse, causal=causal, window_size=(window_size_left, window_size_right), softcap=softcap,
        softmax_scale=softmax_scale, deterministic=deterministic,
    )


@bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, softmax_scale, causal, window_size_left, window_size_right, softcap,
              deterministic):
    return q.new_empty(q.shape), q.new_empty(k.shape), q.new_empty(v.shape)


def _fwd_setup_context(ctx, inputs, output):
    q, k, v, softmax_scale, causal, wl, wr, softcap, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.args = (softmax_scale, causal, wl, wr, softcap, deterministic)
    ctx.mark_non_differentiable(lse)


def _fwd_backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = bwd(dout, q, k, v, out, lse, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None


# ---- varlen ------------------------------------------------------------------------------------------------------------


@torch.library.custom_op("flashkv::varlen_fwd", mutates_args=())
def varlen_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: Optional[float],
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    softcap: float,
    deterministic: bool = False,
) -> tuple[Tensor, Tensor]:
    q, k, v = (_last_contiguous(x) for x in (q, k, v))
    return _A.attention_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
        window_size=(window_size_left, window_size_right), softcap=softcap, softmax_scale=softmax_scale,
        return_lse=True,
    )


@varlen_fwd.register_fake
def _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                     window_size_left, window_size_right, softcap, deterministic=False):
    tq, h, _ = q.shape
    return q.new_empty((tq, h, v.shape[-1])), q.new_empty((h, tq), dtype=torch.float32)


@torch.library.custom_op("flashkv::varlen_bwd", mutates_args=())
def varlen_bwd(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: Optional[float],
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    softcap: float,
    deterministic: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    dout = _grad_layout(dout)
    q, k, v, out = (_last_contiguous(x) for x in (q, k, v, out))
    return _A.attention_varlen_backward(
        dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
        window_size=(window_size_left, window_size_right), softcap=softcap, softmax_scale=softmax_scale,
        deterministic=deterministic,
    )


@varlen_bwd.register_fake
def _varlen_bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                     causal, window_size_left, window_size_right, softcap, deterministic):
    return q.new_empty(q.shape), q.new_empty(k.shape), q.new_empty(v.shape)


def _varlen_setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, causal, wl, wr, softcap, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.args = (max_q, max_k, softmax_scale, causal, wl, wr, softcap, deterministic)
    ctx.mark_non_differentiable(lse)


def _varlen_backward(ctx, dout, _dlse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    dq, dk, dv = varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, *ctx.args)
    return (dq, dk, dv) + (None,) * 10


# ---- KV append and paged decode ----------------------------------------------------------------------------------------


def _append_positions(k_cache: Tensor, page_table: Optional[Tensor], cache_seqlens: Tensor, seqlen_new: int):
    """(index tensors into k_cache, capacity): token i of sequence b goes to position cache_seqlens[b] + i."""
    batch = cache_seqlens.shape[0]
    pos = cache_seqlens.to(torch.int64)[:, None] + torch.arange(seqlen_new, device=cache_seqlens.device)
    if page_table is None:
        rows = torch.arange(batch, device=pos.device)[:, None].expand(batch, seqlen_new)
        return (rows, pos), k_cache.shape[1]
    page_size = k_cache.shape[1]
    pages = page_table.to(torch.int64).gather(1, torch.div(pos, page_size, rounding_mode="floor"))
    return (pages, pos % page_size), page_table.shape[1] * page_size


def _check_append_args(k_cache, v_cache, page_table, cache_seqlens, k_new, v_new):
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4:
            raise ValueError(f"flashkv: argument '{name}': expected 4 dimensions, got shape {list(t.shape)}")
    for name, t in (("k_new", k_new), ("v_new", v_new)):
        if t.dim() != 4:
            raise ValueError(
                f"flashkv: argument '{name}': expected 4 dimensions [batch, seqlen_new, num_heads_kv, head_dim], got "
                f"shape {list(t.shape)}"
            )
    if tuple(k_new.shape) != tuple(v_new.shape[:3]) + (k_new.shape[3],):
        raise ValueError(f"flashkv: argument 'v_new': expected shape like k_new {list(k_new.shape)}[:3], got "
                         f"{list(v_new.shape)}")
    if cache_seqlens.dim() != 1 or cache_seqlens.shape[0] != k_new.shape[0]:
        raise ValueError(f"flashkv: argument 'cache_seqlens': expected shape [{k_new.shape[0]}] (= k_new.shape[0]), "
                         f"got {list(cache_seqlens.shape)}")
    for name, t in (("cache_seqlens", cache_seqlens), ("page_table", page_table)):
        if t is not None and t.dtype != torch.int32:
            raise TypeError(f"flashkv: argument '{name}': expected int32, got {t.dtype}")
    if k_new.dtype != k_cache.dtype or v_new.dtype != v_cache.dtype:
        raise TypeError(f"flashkv: argument 'k_new': expected the cache dtype {k_cache.dtype}, got {k_new.dtype}")
    if page_table is None and k_cache.shape[0] < k_new.shape[0]:
        raise ValueError(f"flashkv: argument 'k_cache': expected at least {k_new.shape[0]} sequences (= batch), got "
                         f"{k_cache.shape[0]}")


@torch.library.custom_op("flashkv::kv_append", mutates_args=("k_cache", "v_cache"))
def kv_append(
    k_cache: Tensor,
    v_cache: Tensor,
    page_table: Optional[Tensor],
    cache_seqlens: Tensor,
    k_new: Tensor,
    v_new: Tensor,
) -> None:
    """Writes k_new/v_new [batch, seqlen_new, num_heads_kv, head_dim] into the caches at positions cache_seqlens[b] + i
    (through page_table [batch, max_pages] int32 when given: page page_table[b, t // page_size], row t % page_size;
    else k_cache is [batch, capacity, num_heads_kv, head_dim]). cache_seqlens is not modified. Every position must be
    below the capacity (max_pages * page_size, or k_cache.shape[1]): checked on the CPU (flashkv.CapacityError, nothing
    written); on CUDA it is a
    precondition (checking would synchronize) and an out-of-range position stops the stream with a device-side
    index assertion, never a silent write elsewhere."""
    _check_append_args(k_cache, v_cache, page_table, cache_seqlens, k_new, v_new)
    if k_new.shape[1] == 0 or k_new.shape[0] == 0:
        return
    if k_cache.device.type == "cpu":
        capacity = page_table.shape[1] * k_cache.shape[1] if page_table is not None else k_cache.shape[1]
        need = int(cache_seqlens.max()) + k_new.shape[1]
        if need > capacity:
            raise CapacityError(f"flashkv: argument 'cache_seqlens': expected cache_seqlens + seqlen_new <= capacity "
                                f"{capacity}, got {need}; nothing was written")
    idx, _ = _append_positions(k_cache, page_table, cache_seqlens, k_new.shape[1])
    k_cache.index_put_(idx, k_new)
    v_cache.index_put_(idx, v_new)


@kv_append.register_fake
def _kv_append_fake(k_cache, v_cache, page_table, cache_seqlens, k_new, v_new):
    return None


def _paged_decode_cpu(q, k_cache, v_cache, page_table, cache_seqlens, k_new, v_new, softmax_scale, causal, softcap):
    """The CPU implementation: append, gather each sequence's pages, run the varlen forward (exact, same masks)."""
    batch, seqlen_q, num_heads, _ = q.shape
    capacity = page_table.shape[1] * k_cache.shape[1] if page_table is not None else k_cache.shape[1]
    if (k_new is None) != (v_new is None):
        raise ValueError("flashkv: argument 'k_new': expected k_new and v_new given together, got only one")
    lens = cache_seqlens.to(torch.int64)
    if k_new is not None:
        _check_append_args(k_cache, v_cache, page_table, cache_seqlens, k_new, v_new)
    need = lens + (k_new.shape[1] if k_new is not None else 0)
    if batch and int(need.max()) > capacity:
        b = int(need.argmax())
        raise CapacityError(f"flashkv: argument 'cache_seqlens': sequence {b} needs {int(need[b])} tokens "
                            f"(cache_seqlens {int(lens[b])} + seqlen_new {int(need[b] - lens[b])}), expected at most the "
                            f"capacity {capacity}; nothing was written")
    if k_new is not None and k_new.shape[1]:
        idx, _ = _append_positions(k_cache if page_table is not None else k_cache[:batch], page_table, cache_seqlens,
                                   k_new.shape[1])
        (k_cache if page_table is not None else k_cache[:batch]).index_put_(idx, k_new)
        (v_cache if page_table is not None else v_cache[:batch]).index_put_(idx, v_new)
    lens = need
    ks, vs = [], []
    for b in range(batch):
        n = int(lens[b])
        if page_table is None:
            ks.append(k_cache[b, :n])
            vs.append(v_cache[b, :n])
        else:
            ps = k_cache.shape[1]
            pages = page_table[b, : (n + ps - 1) // ps].to(torch.int64)
            ks.append(k_cache[pages].reshape(-1, *k_cache.shape[2:])[:n])
            vs.append(v_cache[pages].reshape(-1, *v_cache.shape[2:])[:n])
    k = torch.cat(ks) if ks else k_cache.new_empty((0, *k_cache.shape[2:]))
    v = torch.cat(vs) if vs else v_cache.new_empty((0, *v_cache.shape[2:]))
    cu_k = torch.zeros(batch + 1, dtype=torch.int32)
    cu_k[1:] = torch.cumsum(lens, 0).to(torch.int32)
    cu_q = torch.arange(0, (batch + 1) * seqlen_q, seqlen_q, dtype=torch.int32)
    out, lse = _A.attention_varlen(
        q.reshape(batch * seqlen_q, num_heads, q.shape[3]), k, v, cu_q, cu_k, seqlen_q, int(lens.max()) if batch else 0,
        causal=causal, softcap=softcap, softmax_scale=softmax_scale, return_lse=True,
    )
    return out.reshape(q.shape[:3] + (v_cache.shape[3],)), lse.reshape(num_heads, batch, seqlen_q).permute(1, 0, 2) \
        .contiguous()


@torch.library.custom_op("flashkv::paged_decode", mutates_args=("k_cache", "v_cache"))
def paged_decode(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    page_table: Optional[Tensor],
    cache_seqlens: Tensor,
    k_new: Optional[Tensor],
    v_new: Optional[Tensor],
    softmax_scale: Optional[float],
    causal: bool,
    softcap: float,
    num_splits: int,
    max_seqlen_k: int,
) -> tuple[Tensor, Tensor]:
    """flashkv.paged_decode (docs/python.md) as an operator: attention of q against the (paged) cache, after appending
    k_new/v_new at cache_seqlens (cache_seqlens is not updated; lengths past the capacity raise flashkv.CapacityError
    before anything is written)."""
    if q.device.type == "cuda":
        return _D.paged_decode(
            _last_contiguous(q), k_cache, v_cache, page_table, cache_seqlens, k_new=k_new, v_new=v_new,
            softmax_scale=softmax_scale, causal=causal, softcap=softcap, num_splits=num_splits,
            max_seqlen_k=max_seqlen_k, return_lse=True,
        )
    if q.dim() != 4:
        raise ValueError(f"flashkv: argument 'q': expected 4 dimensions [batch, seqlen_q, num_heads, head_dim], got "
                         f"shape {list(q.shape)}")
    if not 0 <= num_splits <= 256:
        raise ValueError(f"flashkv: argument 'num_splits': expected 0 (auto) .. 256, got {num_splits}")
    return _paged_decode_cpu(q, k_cache, v_cache, page_table, cache_seqlens, k_new, v_new, softmax_scale, causal,
                             softcap)


@paged_decode.register_fake
def _paged_decode_fake(q, k_cache, v_cache, page_table, cache_seqlens, k_new, v_new, softmax_scale, causal, softcap,
                       num_splits, max_seqlen_k):
    b, sq, h, _ = q.shape
    return q.new_empty((b, sq, h, v_cache.shape[-1])), q.new_empty((b, h, sq), dtype=torch.float32)


# ---- autograd registration ---------------------------------------------------------------------------------------------


torch.library.register_autograd("flashkv::fwd", _fwd_backward, setup_context=_fwd_setup_context)
torch.library.register_autograd("flashkv::varlen_fwd", _varlen_backward, setup_context=_varlen_setup_context)

__all__ = ["fwd", "bwd", "varlen_fwd", "varlen_bwd", "paged_decode", "kv_append"]
