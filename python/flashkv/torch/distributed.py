"""Context-parallel (ring) attention over a torch.distributed process group, on flashkv's kernels.

Each rank holds a shard of the sequence (its queries and their keys/values). The K/V shards travel around the ring
(rank r sends to r + 1 and receives from r - 1 with isend/irecv, posted before the local attention call so the
transfer overlaps it); every rank attends its queries to each K/V block with flashkv (torch.ops.flashkv.fwd /
varlen_fwd) and merges the partial results with the log-sum-exp combine of split-KV attention (flash-decoding):

    lse = log(sum_b exp(lse_b)),   out = sum_b exp(lse_b - lse) * out_b

The backward recomputes each block's gradients with flashkv's FA2 backward from the final out and lse (exact: the
block's P = exp(S - lse) and D = rowsum(dout * out) are the global ones); dQ stays local, dK/dV accumulators travel
around the ring with their K/V block and arrive back at the block's owner after a full turn. Sums run in a fixed ring
order (deterministic for a given world size) in float32. The K/V transfers overlap the attention calls in both
passes; the dK/dV accumulator transfers of the backward do not (they need the step's result).

    out = ring_attention(q, k, v, causal=True)                       # q [batch, s_local, num_heads, head_dim]
    out, lse = ring_attention(q, k, v, causal=True, return_lse=True)
    local = shard(x, world_size, rank, sharding="zigzag")            # the shard of a global [batch, seqlen, ...]
    x = unshard([shard_0, ..., shard_W-1], sharding="zigzag")        # and back

Sharding (which global positions a rank holds; every rank must pass the same value):
    "zigzag" (default): the sequence is cut into 2W chunks and rank r holds chunks r and 2W-1-r, concatenated. With
        causal=True every rank then does the same work at every step (load balance): at step t the K/V of rank
        j = r - t is attended by all local queries against j's first chunk (j < r) or by the local second chunk
        against all of j's keys (j > r): one flashkv call per step.
    "contiguous": rank r holds the r-th contiguous piece. Causal work is unbalanced (rank W-1 does W times rank 0's).
Shard lengths may differ between ranks (uneven shards): they are exchanged once per call (one all_gather of a few ints).
Varlen (cu_seqlens given): several sequences packed per rank, each sequence split contiguously across the ranks;
cu_seqlens [n_seq + 1] int32 of the local rows on each rank (sharding="contiguous"). GQA/MQA: fewer K/V heads.
softmax_scale defaults to 1/sqrt(head_dim); softcap as flashkv.attention. No sliding window.

Backends: gloo (CPU tensors; the tests), NCCL (CUDA tensors; CUDA work is enqueued on the current stream and the
transfers on NCCL's). NVLink multicast stays off: NCCL_NVLS_ENABLE=0 is set at import unless the environment sets it.
"""
from __future__ import annotations

import os
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist

from . import _ops

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

SHARDINGS = ("zigzag", "contiguous")


# ---- sharding helpers -------------------------------------------------------------------------------------------------


def _chunks(n: int, parts: int) -> list[int]:
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def shard_bounds(seqlen: int, world_size: int, rank: int, sharding: str = "zigzag") -> list[tuple[int, int]]:
    """The global [start, end) ranges rank `rank` holds, in local order."""
    _check_sharding(sharding)
    if sharding == "contiguous":
        sizes = _chunks(seqlen, world_size)
        start = sum(sizes[:rank])
        return [(start, start + sizes[rank])]
    sizes = _chunks(seqlen, 2 * world_size)
    starts = [sum(sizes[:i]) for i in range(2 * world_size)]
    a, b = rank, 2 * world_size - 1 - rank
    return [(starts[a], starts[a] + sizes[a]), (starts[b], starts[b] + sizes[b])]


def shard(x: torch.Tensor, world_size: int, rank: int, sharding: str = "zigzag", dim: int = 1) -> torch.Tensor:
    """The local shard of a global tensor (sequence along `dim`), as ring_attention expects it."""
    parts = [x.narrow(dim, s, e - s) for s, e in shard_bounds(x.shape[dim], world_size, rank, sharding)]
    return torch.cat(parts, dim=dim) if len(parts) > 1 else parts[0].contiguous()


def unshard(shards: Sequence[torch.Tensor], sharding: str = "zigzag", dim: int = 1) -> torch.Tensor:
    """Inverse of shard(): the global tensor from every rank's shard (in rank order)."""
    _check_sharding(sharding)
    if sharding == "contiguous":
        return torch.cat(list(shards), dim=dim)
    w = len(shards)
    seqlen = sum(s.shape[dim] for s in shards)
    sizes = _chunks(seqlen, 2 * w)
    pieces: list[Any] = [None] * (2 * w)
    for r, s in enumerate(shards):
        a, b = r, 2 * w - 1 - r
        pieces[a], pieces[b] = s.narrow(dim, 0, sizes[a]), s.narrow(dim, sizes[a], sizes[b])
    return torch.cat(pieces, dim=dim)


def _check_sharding(sharding: str) -> None:
    if sharding not in SHARDINGS:
        raise ValueError(f"flashkv: argument 'sharding': expected one of {', '.join(SHARDINGS)}, got {sharding!r}")


# ---- the ring -----------------------------------------------------------------------------------------------------------


class _Ring:
    """Ranks and the per-rank shard layout of one call."""

    def __init__(self, group, local_sizes: list[int], device):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.world) if group is not None else \
            (self.rank + 1) % self.world
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.world) if group is not None else \
            (self.rank - 1) % self.world
        t = torch.tensor(local_sizes, dtype=torch.int64, device=device)
        out = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(out, t, group=group)
        self.sizes = [o.tolist() for o in out]  # sizes[rank] = that rank's layout numbers
        if self.sizes[0][0] == -1:  # zigzag with the default split: shard()'s chunks of the global length
            chunks = _chunks(sum(s[1] for s in self.sizes), 2 * self.world)
            for r, s in enumerate(self.sizes):
                s[0] = chunks[r]
            if any(chunks[r] + chunks[2 * self.world - 1 - r] != s[1] for r, s in enumerate(self.sizes)):
                raise ValueError("flashkv: argument 'first_chunk': the local lengths are not shard()'s zigzag split of "
                                 f"the global sequence (lengths {[s[1] for s in self.sizes]}); pass first_chunk")

    def src(self, step: int) -> int:
        return (self.rank - step) % self.world

    def exchange(self, send: list[torch.Tensor], recv_shapes: list[tuple]) -> tuple[list, list]:
        """Posts isend of `send` to next and irecv of new buffers from prev; returns (buffers, requests)."""
        if self.world == 1:
            return [t.contiguous() for t in send], []
        bufs = [torch.empty(s, dtype=t.dtype, device=t.device) for t, s in zip(send, recv_shapes)]
        reqs = [dist.isend(t.contiguous(), self.next, group=self.group) for t in send]
        reqs += [dist.irecv(b, self.prev, group=self.group) for b in bufs]
        return bufs, reqs


def _merge(acc_out, acc_lse, out, lse, rows=None):
    """In-place lse combine of a partial (out [b, s, h, d], lse [b, h, s]) into float32 accumulators (rows: the
    accumulator's seqlen slice the partial covers)."""
    if rows is not None:
        acc_out_r, acc_lse_r = acc_out[:, rows], acc_lse[:, :, rows]
    else:
        acc_out_r, acc_lse_r = acc_out, acc_lse
    new = torch.logaddexp(acc_lse_r, lse)
    safe = torch.where(torch.isneginf(new), torch.zeros_like(new), new)
    w_old = torch.exp(acc_lse_r - safe).transpose(1, 2).unsqueeze(-1)
    w_new = torch.exp(lse - safe).transpose(1, 2).unsqueeze(-1)
    acc_out_r.mul_(w_old).add_(out.float() * w_new)
    acc_lse_r.copy_(new)


def _plan(ring: _Ring, step: int, causal: bool, sharding: str, varlen: bool):
    """(kind, q_rows, k_rows) for this step: kind None (nothing to do), "causal" or "full"; rows are slices of the
    local queries / the received K/V block (None = all)."""
    j, r = ring.src(step), ring.rank
    if not causal:
        return "full", None, None
    if j == r:
        return "causal", None, None
    if sharding == "contiguous":
        return ("full", None, None) if j < r else (None, None, None)
    a_r, a_j = ring.sizes[r][0], ring.sizes[j][0]
    if j < r:
        return "full", None, slice(0, a_j)  # every local query vs j's first chunk
    return "full", slice(a_r, None), None  # the local second chunk vs all of j's keys


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, causal, softcap, group, sharding, cu_seqlens, max_seqlen, layout):
        varlen = cu_seqlens is not None
        ring = _Ring(group, layout, q.device)
        out_acc, lse_acc = _accumulators(q, v, varlen)
        kv = (k, v)
        for step in range(ring.world):
            reqs = []
            if step + 1 < ring.world:
                src_next = ring.src(step + 1)
                shapes = [(_rows_of(ring, src_next, varlen), *x.shape[1:]) if varlen else
                          (x.shape[0], _rows_of(ring, src_next, varlen), *x.shape[2:]) for x in kv]
                nxt, reqs = ring.exchange(list(kv), shapes)
            _block_forward(ring, step, q, kv, out_acc, lse_acc, softmax_scale, causal, softcap, sharding, varlen,
                           layout, max_seqlen)
            for req in reqs:
                req.wait()
            if step + 1 < ring.world:
                kv = tuple(nxt)
        out = out_acc.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse_acc, cu_seqlens if varlen else torch.empty(0))
        ctx.args = (softmax_scale, causal, softcap, group, sharding, varlen, layout, max_seqlen)
        ctx.mark_non_differentiable(lse_acc)
        return out, lse_acc

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, cu = ctx.saved_tensors
        softmax_scale, causal, softcap, group, sharding, varlen, layout, max_seqlen = ctx.args
        ring = _Ring(group, layout, q.device)
        dout = dout.contiguous()
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dk_acc = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dv_acc = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        kv = (k, v)
        for step in range(ring.world):
            reqs_kv = []
            if step + 1 < ring.world:  # the next K/V block moves while this one's gradients are computed
                rows = _rows_of(ring, ring.src(step + 1), varlen)
                shapes = [((rows, *x.shape[1:]) if varlen else (x.shape[0], rows, *x.shape[2:])) for x in kv]
                next_kv, reqs_kv = ring.exchange(list(kv), shapes)
            _block_backward(ring, step, dout, q, kv, out, lse, dq, dk_acc, dv_acc, softmax_scale, causal, softcap,
                            sharding, varlen, layout, max_seqlen)
            # the block's dK/dV accumulators follow it; after the last step they arrive at the block's owner
            rows = _rows_of(ring, ring.src(step + 1), varlen)
            shapes = [((rows, *x.shape[1:]) if varlen else (x.shape[0], rows, *x.shape[2:])) for x in (dk_acc, dv_acc)]
            bufs, reqs = ring.exchange([dk_acc, dv_acc], shapes)
            for req in reqs + reqs_kv:
                req.wait()
            dk_acc, dv_acc = bufs
            if step + 1 < ring.world:
                kv = tuple(next_kv)
        return (dq.to(q.dtype), dk_acc.to(k.dtype), dv_acc.to(v.dtype)) + (None,) * 8


def _rows_of(ring: _Ring, rank: int, varlen: bool) -> int:
    s = ring.sizes[rank]
    return s[-1] if varlen else s[1]


def _accumulators(q, v, varlen):
    if varlen:
        out = torch.zeros((*q.shape[:2], v.shape[-1]), dtype=torch.float32, device=q.device)
        lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32, device=q.device)
        return out, lse
    b, s, h, _ = q.shape
    out = torch.zeros((b, s, h, v.shape[-1]), dtype=torch.float32, device=q.device)
    lse = torch.full((b, h, s), float("-inf"), dtype=torch.float32, device=q.device)
    return out, lse


def _block_forward(ring, step, q, kv, out_acc, lse_acc, scale, causal, softcap, sharding, varlen, layout, max_seqlen):
    kind, q_rows, k_rows = _plan(ring, step, causal, "contiguous" if varlen else sharding, varlen)
    if kind is None:
        return
    k, v = kv
    if varlen:
        cu_q = torch.tensor(layout, dtype=torch.int32, device=q.device)
        cu_k = torch.tensor(ring.sizes[ring.src(step)], dtype=torch.int32, device=q.device)
        o, lse = _ops.varlen_fwd(q, k, v, cu_q, cu_k, max_seqlen, max_seqlen, scale, kind == "causal", -1, -1,
                                 softcap, False)
        _merge_varlen(out_acc, lse_acc, o, lse)
        return
    qs = q if q_rows is None else q[:, q_rows]
    ks, vs = (k, v) if k_rows is None else (k[:, k_rows], v[:, k_rows])
    o, lse = _ops.fwd(qs.contiguous(), ks.contiguous(), vs.contiguous(), scale, kind == "causal", -1, -1, softcap,
                      False)
    _merge(out_acc, lse_acc, o, lse, q_rows)


def _merge_varlen(out_acc, lse_acc, o, lse):
    """Varlen shapes: out [total, h, d], lse [h, total] — view them as batch 1 for _merge."""
    _merge(out_acc.unsqueeze(0), lse_acc.unsqueeze(0), o.unsqueeze(0), lse.unsqueeze(0))


def _block_backward(ring, step, dout, q, kv, out, lse, dq, dk_acc, dv_acc, scale, causal, softcap, sharding, varlen,
                    layout, max_seqlen):
    kind, q_rows, k_rows = _plan(ring, step, causal, "contiguous" if varlen else sharding, varlen)
    if kind is None:
        return
    k, v = kv
    if varlen:
        cu_q = torch.tensor(layout, dtype=torch.int32, device=q.device)
        cu_k = torch.tensor(ring.sizes[ring.src(step)], dtype=torch.int32, device=q.device)
        g = _ops.varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_seqlen, max_seqlen, scale, kind == "causal", -1,
                            -1, softcap, False)
        dq.add_(g[0])
        dk_acc.add_(g[1])
        dv_acc.add_(g[2])
        return
    sel = (lambda x: x) if q_rows is None else (lambda x: x[:, q_rows].contiguous())
    ks, vs = (k, v) if k_rows is None else (k[:, k_rows].contiguous(), v[:, k_rows].contiguous())
    lse_r = lse if q_rows is None else lse[:, :, q_rows].contiguous()
    gq, gk, gv = _ops.bwd(sel(dout), sel(q), ks, vs, sel(out), lse_r, scale, kind == "causal", -1, -1, softcap, False)
    (dq if q_rows is None else dq[:, q_rows]).add_(gq)
    (dk_acc if k_rows is None else dk_acc[:, k_rows]).add_(gk)
    (dv_acc if k_rows is None else dv_acc[:, k_rows]).add_(gv)


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    softcap: float = 0.0,
    return_lse: bool = False,
    *,
    group: Any = None,
    sharding: str = "zigzag",
    first_chunk: Optional[int] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    max_seqlen: Optional[int] = None,
) -> Any:
    """Exact attention of the local queries against the keys of every rank (see the module docstring).

    Args:
        q [batch, s_local, num_heads, head_dim], k/v [batch, s_local, num_heads_kv, head_dim(_v)]: this rank's shard
            (varlen: q [total_local, num_heads, head_dim], k/v [total_local, num_heads_kv, head_dim] with
            cu_seqlens [n_seq + 1] int32 and max_seqlen an int bounding every rank's per-sequence piece).
        causal: causal over the global positions of the sharding.
        sharding: "zigzag" (default) or "contiguous"; varlen uses "contiguous".
        first_chunk: zigzag only: how many of the local rows belong to the first chunk (default: shard()'s split
            of the global sequence into 2W near-equal chunks; pass it for other chunk lengths). Every rank passes it
            or none does.
        group: the process group (default: the world).
    Returns out like q (differentiable in q, k, v; gradients exact), and lse [batch, num_heads, s_local] float32
    (varlen [num_heads, total_local]) if return_lse.
    """
    _check_sharding(sharding)
    if not dist.is_initialized():
        raise RuntimeError("flashkv: ring_attention needs an initialized torch.distributed process group")
    varlen = cu_seqlens is not None
    if varlen:
        if sharding != "contiguous":
            raise ValueError("flashkv: argument 'sharding': varlen ring attention shards each sequence contiguously; "
                             "expected 'contiguous', got " + repr(sharding))
        if max_seqlen is None:
            raise ValueError("flashkv: argument 'max_seqlen': expected an int for varlen, got None")
        if cu_seqlens.dtype != torch.int32:
            cu_seqlens = cu_seqlens.to(torch.int32)
    elif q.dim() != 4:
        raise ValueError(f"flashkv: argument 'q': expected 4 dimensions [batch, s_local, num_heads, head_dim], got "
                         f"shape {list(q.shape)}")
    if varlen:
        layout = [int(x) for x in cu_seqlens.tolist()]
    elif sharding == "zigzag":
        layout = [-1 if first_chunk is None else int(first_chunk), q.shape[1]]
    else:
        layout = [q.shape[1], q.shape[1]]
    out, lse = _RingAttention.apply(q, k, v, softmax_scale, bool(causal), float(softcap), group, sharding,
                                    cu_seqlens, max_seqlen, layout)
    return (out, lse) if return_lse else out


__all__ = ["ring_attention", "shard", "unshard", "shard_bounds", "SHARDINGS"]
