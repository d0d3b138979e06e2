"""flashkv.attention_varlen / attention_varlen_backward vs the float64 reference applied per sequence (explicit mask),
with empty sequences (seqlen_q = 0, seqlen_k = 0), GQA, causal (seqlen_q > seqlen_k included), window and softcap."""
import numpy as np
import pytest

import flashkv
from lowp import from_bf16_bits, to_bf16_bits
from reference import attention_backward_ref, attention_ref

SEQS = [(5, 9), (0, 4), (17, 17), (6, 0), (23, 11), (1, 30)]  # (seqlen_q, seqlen_k) per sequence


def cu(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


@pytest.mark.parametrize(
    "opts",
    [{}, {"causal": True}, {"window_size": (4, 1), "softcap": 2.0}, {"causal": True, "softmax_scale": 0.4}],
    ids=["full", "causal", "window_softcap", "causal_scale"],
)
def test_varlen_forward_backward_match_reference(rng, opts):
    h, hkv, d = 4, 2, 32
    cq, ck = cu([s for s, _ in SEQS]), cu([s for _, s in SEQS])
    q = rng.standard_normal((cq[-1], h, d)).astype(np.float32)
    k = rng.standard_normal((ck[-1], hkv, d)).astype(np.float32)
    v = rng.standard_normal((ck[-1], hkv, d)).astype(np.float32)
    dout = rng.standard_normal((cq[-1], h, d)).astype(np.float32)
    out, lse = flashkv.attention_varlen(q, k, v, cq, ck, return_lse=True, **opts)
    assert out.shape == q.shape and lse.shape == (h, cq[-1]) and lse.dtype == np.float32
    dq, dk, dv = flashkv.attention_varlen_backward(dout, q, k, v, out, lse, cq, ck, **opts)
    for b in range(len(SEQS)):
        qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        ref, lse_ref = attention_ref(q[None, qs], k[None, ks], v[None, ks], **opts)
        scale = max(1.0, np.abs(ref).max()) if ref.size else 1.0
        assert np.max(np.abs(out[qs] - ref[0]), initial=0.0) <= 1e-5 * scale, b
        fin = np.isfinite(lse_ref[0])
        assert np.array_equal(np.isneginf(lse[:, qs]), ~fin), b
        assert np.all(np.abs(lse[:, qs][fin] - lse_ref[0][fin]) <= 1e-5 * (1 + np.abs(lse_ref[0][fin]))), b
        grads = attention_backward_ref(dout[None, qs], q[None, qs], k[None, ks], v[None, ks], **opts)
        for name, g, r in zip(("dq", "dk", "dv"), (dq[qs], dk[ks], dv[ks]), grads):
            tol = 1e-4 * max(1.0, np.abs(r).max(initial=0.0))
            assert np.max(np.abs(g - r[0]), initial=0.0) <= tol, (b, name)


def test_varlen_seqlen_k_zero_gives_zeros(rng):
    cq, ck = cu([6, 3]), cu([0, 0])
    q = rng.standard_normal((9, 2, 16)).astype(np.float32)
    k = np.zeros((0, 2, 16), np.float32)
    out, lse = flashkv.attention_varlen(q, k, k, cq, ck, return_lse=True)
    assert np.all(out == 0.0) and np.all(np.isneginf(lse))


def test_varlen_bfloat16_matches_fixed_length(rng):
    # One sequence of varlen == the fixed-length call on the same data (same kernel path, same rounding).
    x = rng.standard_normal((1, 40, 2, 64)).astype(np.float32)
    bits = to_bf16_bits(x)
    fixed = flashkv.attention(bits, bits, bits, causal=True, dtype="bfloat16")
    c = cu([40])
    packed = flashkv.attention_varlen(bits[0], bits[0], bits[0], c, c, causal=True, dtype="bfloat16")
    assert packed.dtype == np.uint16
    np.testing.assert_array_equal(from_bf16_bits(packed), from_bf16_bits(fixed[0]))


def test_explicit_max_seqlen(rng):
    cq = cu([3, 7])
    q = rng.standard_normal((10, 1, 8)).astype(np.float32)
    a = flashkv.attention_varlen(q, q, q, cq, cq)
    b = flashkv.attention_varlen(q, q, q, cq, cq, max_seqlen_q=64, max_seqlen_k=64)  # upper bounds are fine
    np.testing.assert_array_equal(a, b)


def test_numpy_default_int64_and_list_cu_seqlens_are_converted(rng):
    # issue 10 item 10: np.cumsum gives int64; it is converted (bounds-checked) and the caller's array is unchanged
    q = rng.standard_normal((10, 2, 16)).astype(np.float32)
    kv = rng.standard_normal((12, 2, 16)).astype(np.float32)
    cq32, ck32 = cu([4, 6]), cu([5, 7])
    cq64 = np.concatenate([[0], np.cumsum([4, 6])])
    assert cq64.dtype == np.int64
    ref, ref_lse = flashkv.attention_varlen(q, kv, kv, cq32, ck32, causal=True, return_lse=True)
    out, lse = flashkv.attention_varlen(q, kv, kv, cq64, [0, 5, 12], causal=True, return_lse=True)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(lse, ref_lse)
    assert cq64.dtype == np.int64 and list(cq64) == [0, 4, 10]
    dout = rng.standard_normal(out.shape).astype(np.float32)
    a = flashkv.attention_varlen_backward(dout, q, kv, kv, ref, ref_lse, cq32, ck32, causal=True)
    b = flashkv.attention_varlen_backward(dout, q, kv, kv, ref, ref_lse, cq64, ck32.astype(np.uint32), causal=True)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_torch_int64_cu_seqlens_are_converted(rng):
    torch = pytest.importorskip("torch")
    q = torch.from_numpy(rng.standard_normal((10, 2, 16)).astype(np.float32))
    cq64 = torch.tensor([0, 4, 10])  # torch's default integer dtype is int64
    ref = flashkv.attention_varlen(q, q, q, cq64.to(torch.int32), cq64.to(torch.int32), causal=True)
    out = flashkv.attention_varlen(q, q, q, cq64, cq64, causal=True)
    assert torch.equal(out, ref) and cq64.dtype == torch.int64
    with pytest.raises(ValueError, match="'cu_seqlens_k'"):
        flashkv.attention_varlen(q, q, q, cq64, torch.tensor([0, 4, 2**31]))
    with pytest.raises(TypeError, match="'cu_seqlens_q'"):
        flashkv.attention_varlen(q, q, q, cq64.float(), cq64)
