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


def _ieee_scores(q, k, scale, softcap):
    """s = softcap(scale * q.k) in float64, the dot product taken to +-inf where it leaves the float32 range."""
    with np.errstate(invalid="ignore", over="ignore"):
        dot = np.einsum("bihd,bjhd->bhij", q, k)
        big = np.isfinite(dot) & (np.abs(dot) > np.finfo(np.float32).max)
        dot = np.where(big, np.sign(dot) * np.inf, dot)
        s = dot * scale
        if softcap > 0:
            t = np.tanh(s / softcap)
            return softcap * t, 1.0 - t * t
        return s, np.ones_like(s)


def attention_ref_ieee(q, k, v, causal=False, window_size=(-1, -1), softcap=0.0, softmax_scale=None):
    """The non-finite contract (include/flashkv/attention.hpp NON-FINITE INPUTS), float64: IEEE arithmetic over the
    keys each row sees, and only over them (masked keys are never read), NaN-propagating max; -inf lse only for rows
    without keys. Returns (out [b, sq, h, dv], lse [b, h, sq])."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    b, sq, h, _ = q.shape
    scale = 1.0 / np.sqrt(q.shape[3]) if softmax_scale is None else softmax_scale
    k, v = _expand_kv(k, h), _expand_kv(v, h)
    s, _ = _ieee_scores(q, k, scale, softcap)
    mask = visible_mask(sq, k.shape[1], causal, window_size)
    out = np.zeros((b, sq, h, v.shape[3]))
    lse = np.full((b, h, sq), -np.inf)
    with np.errstate(invalid="ignore", over="ignore"):
        for bb in range(b):
            for hh in range(h):
                for i in range(sq):
                    js = np.nonzero(mask[i])[0]
                    if js.size == 0:
                        continue
                    si = s[bb, hh, i, js]
                    m = np.max(si)  # NaN if any is NaN
                    p = np.exp(si - m)
                    l = p.sum()
                    out[bb, i, hh] = (p[:, None] * v[bb, js, hh]).sum(axis=0) / l
                    lse[bb, hh, i] = m + np.log(l)
    return out, lse


def attention_backward_ref_ieee(dout, q, k, v, causal=False, window_size=(-1, -1), softcap=0.0, softmax_scale=None):
    """Gradients per the non-finite contract, float64, sums over visible pairs only (out/lse from attention_ref_ieee):
    P = exp(s - lse), D = sum(dout * out), dS = P (dP - D) (x softcap derivative); dk/dv summed over the GQA group."""
    dout, q, k, v = (np.asarray(x, dtype=np.float64) for x in (dout, q, k, v))
    b, sq, h, d = q.shape
    hkv, sk = k.shape[2], k.shape[1]
    scale = 1.0 / np.sqrt(d) if softmax_scale is None else softmax_scale
    out, lse = attention_ref_ieee(q, k, v, causal, window_size, softcap, softmax_scale)
    ke, ve = _expand_kv(k, h), _expand_kv(v, h)
    s, dcap = _ieee_scores(q, ke, scale, softcap)
    mask = visible_mask(sq, sk, causal, window_size)
    dq = np.zeros(q.shape)
    dk_e = np.zeros(ke.shape)
    dv_e = np.zeros(ve.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        for bb in range(b):
            for hh in range(h):
                for i in range(sq):
                    js = np.nonzero(mask[i])[0]
                    if js.size == 0:
                        continue
                    g = dout[bb, i, hh]
                    p = np.exp(s[bb, hh, i, js] - lse[bb, hh, i])
                    dp = ve[bb, js, hh] @ g
                    ds = p * (dp - np.sum(g * out[bb, i, hh])) * dcap[bb, hh, i, js]
                    dq[bb, i, hh] = scale * (ds[:, None] * ke[bb, js, hh]).sum(axis=0)
                    dk_e[bb, js, hh] += scale * ds[:, None] * q[bb, i, hh][None, :]
                    dv_e[bb, js, hh] += p[:, None] * g[None, :]
        g = h // hkv
        dk = dk_e.reshape(b, sk, hkv, g, d).sum(axis=3)
        dv = dv_e.reshape(b, sk, hkv, g, dv_e.shape[-1]).sum(axis=3)
    return dq, dk, dv


def fp_class(x):
    """Per-element class: 0 finite, 1 NaN, 2 +inf, 3 -inf."""
    x = np.asarray(x, dtype=np.float64)
    return np.select([np.isnan(x), np.isposinf(x), np.isneginf(x)], [1, 2, 3], 0)


def assert_classified_close(got, ref, rtol, what=""):
    """Every element's class {finite, NaN, +inf, -inf} equals the reference's; finite elements within
    rtol * max(1, max |finite ref|)."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    cg, cr = fp_class(got), fp_class(ref)
    bad = np.argwhere(cg != cr)
    assert bad.size == 0, (
        f"{what}: {len(bad)} class mismatches, first at {tuple(bad[0])}: got {got[tuple(bad[0])]}, "
        f"reference {ref[tuple(bad[0])]}"
    )
    fin = cr == 0
    scale = max(1.0, float(np.max(np.abs(ref[fin]), initial=0.0)))
    err = float(np.max(np.abs(got[fin] - ref[fin]), initial=0.0))
    assert err <= rtol * scale, f"{what}: finite error {err:.3e} > {rtol * scale:.3e}"
