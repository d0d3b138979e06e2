"""Low-precision naive attention (the baseline the kernel's fp16/bf16 error is judged against): the reference formula
evaluated with every intermediate tensor rounded to the low-precision dtype and float32 accumulation, as a standard
framework implementation would compute it. Also float32 <-> bfloat16 bit conversion (round to nearest even)."""
import numpy as np

from reference import _expand_kv, visible_mask


def to_bf16_bits(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def from_bf16_bits(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def rounder(dtype):
    if dtype == "float32":
        return lambda x: np.asarray(x, dtype=np.float32)
    if dtype == "float16":
        return lambda x: np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)
    return lambda x: from_bf16_bits(to_bf16_bits(x))


def forward_lowp(q, k, v, dtype, causal=False, window_size=(-1, -1), softcap=0.0, softmax_scale=None):
    r = rounder(dtype)
    q, k, v = (r(x) for x in (q, k, v))
    h = q.shape[2]
    scale = np.float32(1.0 / np.sqrt(q.shape[3]) if softmax_scale is None else softmax_scale)
    k, v = _expand_kv(k, h), _expand_kv(v, h)
    s = r(np.einsum("bihd,bjhd->bhij", q, k, dtype=np.float32) * scale)
    if softcap > 0:
        s = r(np.float32(softcap) * np.tanh(s / np.float32(softcap)))
    mask = visible_mask(q.shape[1], k.shape[1], causal, window_size)[None, None]
    s = np.where(mask, s, -np.inf).astype(np.float32)
    m = s.max(axis=-1, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0.0).astype(np.float32)
    p = np.where(mask, np.exp(s - m), 0.0).astype(np.float32)
    l = p.sum(axis=-1, keepdims=True)
    p = r(p / np.where(l > 0, l, 1.0))
    return r(np.einsum("bhij,bjhd->bihd", p, v, dtype=np.float32))


def backward_lowp(dout, q, k, v, dtype, causal=False, window_size=(-1, -1), softcap=0.0, softmax_scale=None):
    r = rounder(dtype)
    dout, q, k, v = (r(x) for x in (dout, q, k, v))
    h, hkv = q.shape[2], k.shape[2]
    scale = np.float32(1.0 / np.sqrt(q.shape[3]) if softmax_scale is None else softmax_scale)
    ke, ve = _expand_kv(k, h), _expand_kv(v, h)
    raw = r(np.einsum("bihd,bjhd->bhij", q, ke, dtype=np.float32) * scale)
    dcap = np.ones_like(raw)
    s = raw
    if softcap > 0:
        t = np.tanh(raw / np.float32(softcap))
        s, dcap = r(np.float32(softcap) * t), (1.0 - t * t).astype(np.float32)
    mask = visible_mask(q.shape[1], k.shape[1], causal, window_size)[None, None]
    s = np.where(mask, s, -np.inf).astype(np.float32)
    m = s.max(axis=-1, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0.0).astype(np.float32)
    p = np.where(mask, np.exp(s - m), 0.0).astype(np.float32)
    p = r(p / np.where(p.sum(axis=-1, keepdims=True) > 0, p.sum(axis=-1, keepdims=True), 1.0))
    dv_e = r(np.einsum("bhij,bihd->bjhd", p, dout, dtype=np.float32))
    dp = r(np.einsum("bihd,bjhd->bhij", dout, ve, dtype=np.float32))
    ds = r(p * (dp - (p * dp).sum(axis=-1, keepdims=True)) * dcap * scale)
    dq = r(np.einsum("bhij,bjhd->bihd", ds, ke, dtype=np.float32))
    dk_e = r(np.einsum("bhij,bihd->bjhd", ds, q, dtype=np.float32))
    g = h // hkv
    b, sk, d, dv = k.shape[0], k.shape[1], k.shape[3], v.shape[3]
    return dq, r(dk_e.reshape(b, sk, hkv, g, d).sum(axis=3)), r(dv_e.reshape(b, sk, hkv, g, dv).sum(axis=3))
