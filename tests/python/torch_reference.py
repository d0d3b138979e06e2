"""torch reference attention for the flashkv.torch tests: the definition with an explicit boolean mask, differentiable
(autograd gives the reference gradients), evaluated in float64 for the reference and in a low precision for the
"naive same-precision computation" the error rule compares against (docs/engineering.md: forward error <= 2x, backward
<= 3x the naive one's, both measured against float64). Independent of flashkv's masking code."""
import torch


def visible(seqlen_q, seqlen_k, causal=False, window_size=(-1, -1), device="cpu"):
    """[seqlen_q, seqlen_k] bool: key j visible from query i (bottom-right aligned, include/flashkv/attention.hpp)."""
    left, right = window_size
    if causal:
        right = 0
    i = torch.arange(seqlen_q, device=device)[:, None]
    j = torch.arange(seqlen_k, device=device)[None, :]
    shift = seqlen_k - seqlen_q
    m = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        m &= j >= i + shift - left
    if right >= 0:
        m &= j <= i + shift + right
    return m


def attention_ref(q, k, v, causal=False, window_size=(-1, -1), softcap=0.0, softmax_scale=None, dtype=torch.float64):
    """(out [b, sq, h, dv], lse [b, h, sq]) computed in `dtype` (float32 accumulation for 16-bit dtypes is NOT
    emulated: every op runs in `dtype`, as a plain framework implementation would). Differentiable in q, k, v."""
    q, k, v = (x.to(dtype) for x in (q, k, v))
    h, hkv = q.shape[2], k.shape[2]
    k = k.repeat_interleave(h // hkv, dim=2)
    v = v.repeat_interleave(h // hkv, dim=2)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    s = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    mask = visible(q.shape[1], k.shape[1], causal, window_size, q.device)
    any_key = mask.any(dim=-1)  # [sq]
    s = s.masked_fill(~mask, float("-inf"))
    s_safe = torch.where(any_key[:, None], s, torch.zeros_like(s))
    lse = torch.logsumexp(s_safe, dim=-1)
    p = torch.exp(s_safe - lse[..., None]).masked_fill(~mask, 0.0)
    out = torch.einsum("bhij,bjhd->bihd", p, v)
    lse = torch.where(any_key, lse, torch.full_like(lse, float("-inf")))
    return out, lse


def varlen_ref(q, k, v, cu_q, cu_k, dtype=torch.float64, **opts):
    """Per-sequence attention_ref over packed rows; (out [total_q, h, dv], lse [h, total_q])."""
    outs, lses = [], []
    cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cu_q) - 1):
        qs, ks, vs = q[cu_q[b] : cu_q[b + 1]], k[cu_k[b] : cu_k[b + 1]], v[cu_k[b] : cu_k[b + 1]]
        o, lse = attention_ref(qs[None], ks[None], vs[None], dtype=dtype, **opts)
        outs.append(o[0])
        lses.append(lse[0])
    return torch.cat(outs), torch.cat(lses, dim=1)


def max_err(a, ref):
    a, ref = a.detach().to(torch.float64), ref.detach().to(torch.float64)
    fin = torch.isfinite(ref)
    if not torch.equal(torch.isfinite(a), fin) or not torch.equal(a[~fin], ref[~fin]):
        return float("inf")
    return float((a[fin] - ref[fin]).abs().max()) if fin.any() else 0.0


def grads(fn, inputs, dout):
    """Gradients of sum(fn(*inputs) * dout) with respect to inputs (fresh leaves)."""
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    out = out[0] if isinstance(out, tuple) else out
    (out * dout.to(out.dtype)).sum().backward()
    return out.detach(), [x.grad for x in leaves]
