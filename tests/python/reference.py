"""float64 reference attention for the Python tests, written from the definitions (explicit boolean mask), independent
of the library's masking code. Layout bshd; lse natural log, -inf for rows with no visible key."""
import numpy as np


def visible_mask(seqlen_q, seqlen_k, causal=False, window_size=(-1, -1)):
    """Boolean [seqlen_q, seqlen_k]: visible(i, j) per include/flashkv/attention.hpp (bottom-right aligned)."""
    left, right = window_size
    if causal:
        right = 0
    shift = seqlen_k - seqlen_q
    i = np.arange(seqlen_q)[:, None]
    j = np.arange(seqlen_k)[None, :]
    m = np.ones((seqlen_q, seqlen_k), dtype=bool)
    if left >= 0:
        m &= j >= i + shift - left
    if right >= 0:
        m &= j <= i + shift + right
    return m


def _expand_kv(x, num_heads):
    return np.repeat(x, num_heads // x.shape[2], axis=2)


def _scores(q, k, scale, softcap):
    raw = np.einsum("bihd,bjhd->bhij", q, k) * scale
    if softcap > 0:
        t = np.tanh(raw / softcap)
        return softcap * t, 1.0 - t * t
    return raw, np.ones_like(raw)


def attention_ref(q, k, v, causal=False, window_size=(-1, -1), softcap=0.0, softmax_scale=None):
    """Returns (out [b, sq, h, dv], lse [b, h, sq]) in float64."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    h = q.shape[2]
    scale = 1.0 / np.sqrt(q.shape[3]) if softmax_scale is None else softmax_scale
    k, v = _expand_kv(k, h), _expand_kv(v, h)
    s, _ = _scores(q, k, scale, softcap)
    mask = visible_mask(q.shape[1], k.shape[1], causal, window_size)[None, None]
    s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True, initial=-np.inf)
    any_visible = np.isfinite(m)
    m = np.where(any_visible, m, 0.0)
    p = np.where(mask, np.exp(s - m), 0.0)
    l = p.sum(axis=-1, keepdims=True)
    p = np.where(any_visible, p / np.where(l > 0, l, 1.0), 0.0)
    out = np.einsum("bhij,bjhd->bihd", p, v)
    lse = np.where(any_visible[..., 0], m[..., 0] + np.log(np.where(l[..., 0] > 0, l[..., 0], 1.0)), -np.inf)
    return out, lse


def attention_backward_ref(dout, q, k, v, causal=False, window_size=(-1, -1), softcap=0.0, softmax_scale=None):
    """Gradients (dq, dk, dv) of sum(out * dout), float64; dk/dv summed over the query heads sharing a kv head."""
    dout, q, k, v = (np.asarray(x, dtype=np.float64) for x in (dout, q, k, v))
    h, hkv = q.shape[2], k.shape[2]
    scale = 1.0 / np.sqrt(q.shape[3]) if softmax_scale is None else softmax_scale
    ke, ve = _expand_kv(k, h), _expand_kv(v, h)
    s, dcap = _scores(q, ke, scale, softcap)
    mask = visible_mask(q.shape[1], k.shape[1], causal, window_size)[None, None]
    s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.where(mask, np.exp(s - m), 0.0)
    l = p.sum(axis=-1, keepdims=True)
    p = p / np.where(l > 0, l, 1.0)
    dv_e = np.einsum("bhij,bihd->bjhd", p, dout)
    dp = np.einsum("bihd,bjhd->bhij", dout, ve)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True)) * dcap * scale
    dq = np.einsum("bhij,bjhd->bihd", ds, ke)
    dk_e = np.einsum("bhij,bihd->bjhd", ds, q)
    g = h // hkv
    b, sk = k.shape[0], k.shape[1]
    dk = dk_e.reshape(b, sk, hkv, g, dk_e.shape[-1]).sum(axis=3)
    dv = dv_e.reshape(b, sk, hkv, g, dv_e.shape[-1]).sum(axis=3)
    return dq, dk, dv
