"""FP8 (float8_e4m3fn) helpers for flashkv.attention's FP8 forward (CUDA kernel family sm90ws, Hopper): amax
quantization with the dequantization scales ("descales") the kernel takes, and FlashAttention-3's incoherent
processing (Shah et al. 2024, §3.3): q and k multiplied by the same random orthogonal matrix M = H diag(s) / sqrt(d)
(H the Sylvester-Hadamard matrix, s random signs), which leaves q·kᵀ unchanged while spreading outliers over head_dim,
so that their e4m3 rounding error shrinks. Rotate before quantizing (the rotation is exact in float32 up to rounding)::

    q, k = flashkv.fp8.hadamard_qk(q, k, seed=0)
    q8, qd = flashkv.fp8.quantize_e4m3(q, num_heads_kv)
    k8, kd = flashkv.fp8.quantize_e4m3(k, num_heads_kv)
    v8, vd = flashkv.fp8.quantize_e4m3(v, num_heads_kv)
    out = flashkv.attention(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)  # bfloat16

Outputs and accuracy (the FA3-paper outlier distribution, RMSE vs float64) are in docs/gpu.md ("FP8"). torch only.
"""
from __future__ import annotations

from typing import Any

E4M3_MAX = 448.0  # largest finite float8_e4m3fn


def _torch() -> Any:
    import torch  # noqa: PLC0415

    return torch


def hadamard_matrix(d: int, seed: int | None = 0, device: Any = None) -> Any:
    """M = H diag(s) / sqrt(d) (float32 [d, d], orthonormal) with H the Sylvester-Hadamard matrix of order d (a power
    of two) and s random signs drawn from `seed` (None: no signs, the plain normalized Hadamard matrix)."""
    torch = _torch()
    if d < 1 or d & (d - 1):
        raise ValueError(f"flashkv.fp8: argument 'd': expected a power of two (head_dim), got {d}")
    h = torch.ones(1, 1, dtype=torch.float32)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        s = torch.randint(0, 2, (d,), generator=g).to(torch.float32) * 2 - 1
        h = s[:, None] * h  # diag(s) H: rows scaled, x @ (diag(s) H) = (x * s) @ H
    return (h / d**0.5).to(device=device)


def hadamard_qk(q: Any, k: Any, seed: int | None = 0) -> tuple[Any, Any]:
    """(q M, k M) along the last dimension (head_dim, a power of two), in float32, with M = hadamard_matrix(d, seed):
    (q M)(k M)ᵀ = q M Mᵀ kᵀ = q kᵀ in real arithmetic. v is not rotated (P v does not involve q or k)."""
    torch = _torch()
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"flashkv.fp8: q and k head_dim differ ({q.shape[-1]} vs {k.shape[-1]})")
    m = hadamard_matrix(q.shape[-1], seed, q.device)
    return (torch.matmul(q.to(torch.float32), m), torch.matmul(k.to(torch.float32), m))


def quantize_e4m3(x: Any, num_heads_kv: int | None = None, *, per_head: bool = True,
                  cu_seqlens: Any = None) -> tuple[Any, Any]:
    """(x8, descale) with x ≈ x8.float() * descale, x8 torch.float8_e4m3fn (round to nearest, amax scaled to 448).

    x: [batch, seqlen, heads, head_dim] (or packed [total, heads, head_dim] with cu_seqlens [batch + 1]). per_head:
    one scale per (batch, kv head), descale shape [batch, num_heads_kv] (heads h of kv head h // (heads /
    num_heads_kv) share it: pass the kv head count for q; default = heads); else one per tensor, shape [1]. These are
    the shapes flashkv.attention's q_descale / k_descale / v_descale take. A group whose amax is 0 gets scale 1."""
    torch = _torch()
    x = x.to(torch.float32)
    heads = x.shape[-2]
    hkv = heads if num_heads_kv is None else int(num_heads_kv)
    if heads % hkv:
        raise ValueError(f"flashkv.fp8: num_heads_kv {hkv} does not divide the heads {heads}")
    if not per_head:
        amax = x.abs().amax().reshape(1)
        descale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
        return (x / descale).to(torch.float8_e4m3fn), descale
    if cu_seqlens is None:
        if x.dim() != 4:
            raise ValueError(f"flashkv.fp8: expected x [batch, seqlen, heads, head_dim], got shape {tuple(x.shape)}")
        b = x.shape[0]
        amax = x.abs().reshape(b, x.shape[1], hkv, heads // hkv, x.shape[-1]).amax(dim=(1, 3, 4))
        descale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
        scale = descale.repeat_interleave(heads // hkv, dim=1)[:, None, :, None]
        return (x / scale).to(torch.float8_e4m3fn), descale.contiguous()
    cu = [int(c) for c in cu_seqlens.tolist()]
    descale = torch.ones(len(cu) - 1, hkv, dtype=torch.float32, device=x.device)
    x8 = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    for i in range(len(cu) - 1):
        seg = x[cu[i]:cu[i + 1]]
        if seg.shape[0] == 0:
            continue
        amax = seg.abs().reshape(seg.shape[0], hkv, heads // hkv, x.shape[-1]).amax(dim=(0, 2, 3))
        descale[i] = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
        x8[cu[i]:cu[i + 1]] = (seg / descale[i].repeat_interleave(heads // hkv)[None, :, None]).to(torch.float8_e4m3fn)
    return x8, descale


__all__ = ["E4M3_MAX", "hadamard_matrix", "hadamard_qk", "quantize_e4m3"]
