"""NaN and +-inf inputs through flashkv.attention / attention_backward / the varlen pair (CPU): the contract of
include/flashkv/attention.hpp NON-FINITE INPUTS against the float64 reference that sums over the visible keys only
(reference.py attention_ref_ieee / attention_backward_ref_ieee). Each test pokes one element inside a tile that the
causal mask splits (key 70 of 150: query block 0 holds rows 0..127, half of which do not see it), then compares the
class {finite, NaN, +inf, -inf} of every output element with the reference's, finite values within tolerance, and
checks that elements the bad value cannot reach are bit-for-bit the result without it."""
import numpy as np
import pytest

import flashkv
from lowp import from_bf16_bits, to_bf16_bits
from reference import assert_classified_close, attention_backward_ref_ieee, attention_ref_ieee

POKES = {
    "k_nan": ("k", np.nan),
    "k_pos_inf": ("k", np.inf),
    "k_neg_inf": ("k", -np.inf),
    "v_nan": ("v", np.nan),
    "v_pos_inf": ("v", np.inf),
    "q_nan": ("q", np.nan),
    "dout_nan": ("dout", np.nan),
}
ALGORITHMS = ["tiled", "v1", "naive"]


def _inputs(rng, b=1, s=150, h=4, hkv=2, d=32):
    q = rng.standard_normal((b, s, h, d)).astype(np.float32)
    k = rng.standard_normal((b, s, hkv, d)).astype(np.float32)
    v = rng.standard_normal((b, s, hkv, d)).astype(np.float32)
    dout = rng.standard_normal((b, s, h, d)).astype(np.float32)
    return {"q": q, "k": k, "v": v, "dout": dout}


def _poke(x, name, value, key=70, query=100, head=3, chan=5):
    x = {n: a.copy() for n, a in x.items()}
    kv_head = head // (x["q"].shape[2] // x["k"].shape[2])
    if name in ("k", "v"):
        x[name][0, key, kv_head, chan] = value
    else:
        x[name][0, query, head, chan] = value
    return x


def _unaffected_equal(ref_clean, ref_poked, got_clean, got_poked, what):
    """Where the reference is bit-for-bit unchanged by the poke, the kernel's result must be too."""
    same = np.isfinite(ref_poked) & (ref_clean == ref_poked)
    assert same.any(), what
    assert np.array_equal(got_clean[same], got_poked[same]), f"{what}: unaffected elements changed"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("poke", list(POKES))
def test_dense_causal_gqa_matches_the_contract(rng, algorithm, poke):
    clean = _inputs(rng)
    x = _poke(clean, *POKES[poke])
    opts = {"causal": True}
    out, lse = flashkv.attention(x["q"], x["k"], x["v"], return_lse=True, algorithm=algorithm, **opts)
    out0, lse0 = flashkv.attention(clean["q"], clean["k"], clean["v"], return_lse=True, algorithm=algorithm, **opts)
    ref, ref_lse = attention_ref_ieee(x["q"], x["k"], x["v"], **opts)
    ref0, ref_lse0 = attention_ref_ieee(clean["q"], clean["k"], clean["v"], **opts)
    assert_classified_close(out, ref, 1e-5, "out")
    assert_classified_close(lse, ref_lse, 1e-5, "lse")
    _unaffected_equal(ref0, ref, out0, out, "out")
    _unaffected_equal(ref_lse0, ref_lse, lse0, lse, "lse")
    assert not np.any(np.isneginf(lse)), "causal with seqlen_q == seqlen_k: every row sees a key"
    if algorithm == "tiled":  # the backward has one algorithm
        grads = flashkv.attention_backward(x["dout"], x["q"], x["k"], x["v"], out, lse, **opts)
        refs = attention_backward_ref_ieee(x["dout"], x["q"], x["k"], x["v"], **opts)
        for name, g, r in zip(("dq", "dk", "dv"), grads, refs):
            assert_classified_close(g, r, 2e-5, name)


def test_issue_10_one_nan_in_k_is_not_a_masked_row(rng):
    # The report: one NaN in a single K element made every query row of that KV head return out = 0, lse = -inf.
    x = _inputs(rng)
    x["k"][0, 70, 1, 5] = np.nan
    for algorithm in ALGORITHMS:
        out, lse = flashkv.attention(x["q"], x["k"], x["v"], causal=True, return_lse=True, algorithm=algorithm)
        sees = np.arange(150) >= 70  # causal: rows 70.. see key 70
        for h in (2, 3):  # the query heads of KV head 1
            assert np.all(np.isnan(lse[0, h, sees])) and np.all(np.isnan(out[0, sees, h])), algorithm
            assert np.all(np.isfinite(lse[0, h, ~sees])) and np.all(np.isfinite(out[0, ~sees, h])), algorithm
        assert np.all(np.isfinite(out[0, :, :2])), algorithm  # the other KV head's query heads are untouched


def test_all_visible_scores_minus_inf_is_nan_not_empty(rng):
    # window (0, 0): row 37 sees key 37 only; its one score is -inf -> exp(-inf - (-inf)) = NaN.
    x = _inputs(rng, s=100, h=1, hkv=1, d=16)
    x["q"][0, 37, 0, 5] = abs(x["q"][0, 37, 0, 5])
    x["k"][0, 37, 0, 5] = -np.inf
    for algorithm in ALGORITHMS:
        out, lse = flashkv.attention(x["q"], x["k"], x["v"], window_size=(0, 0), return_lse=True,
                                     algorithm=algorithm)
        assert np.isnan(lse[0, 0, 37]) and np.all(np.isnan(out[0, 37])), algorithm
        assert np.all(np.isfinite(np.delete(lse[0, 0], 37))), algorithm


def test_rows_without_keys_stay_zero_and_minus_inf_even_with_nan_inputs(rng):
    # causal seqlen_q = 150 > seqlen_k = 40: rows 0..109 see no key. A NaN in such a row's q or dout changes nothing.
    q = rng.standard_normal((1, 150, 2, 16)).astype(np.float32)
    k = rng.standard_normal((1, 40, 1, 16)).astype(np.float32)
    v = rng.standard_normal((1, 40, 1, 16)).astype(np.float32)
    dout = rng.standard_normal((1, 150, 2, 16)).astype(np.float32)
    q[0, 60, 1, 3] = np.nan
    dout[0, 60, 1, 3] = np.nan
    out, lse = flashkv.attention(q, k, v, causal=True, return_lse=True)
    assert np.all(out[0, :110] == 0) and np.all(np.isneginf(lse[0, :, :110]))
    assert np.all(np.isfinite(out[0, 110:])) and np.all(np.isfinite(lse[0, :, 110:]))
    dq, dk, dv = flashkv.attention_backward(dout, q, k, v, out, lse, causal=True)
    assert np.all(np.isfinite(dq)) and np.all(np.isfinite(dk)) and np.all(np.isfinite(dv))
    assert np.all(dq[0, :110] == 0)


@pytest.mark.parametrize("poke", ["k_nan", "v_pos_inf", "q_nan", "dout_nan"])
def test_varlen_matches_the_contract_per_sequence(rng, poke):
    seqs = [(0, 3), (70, 90), (130, 130), (5, 0)]
    cq = np.concatenate([[0], np.cumsum([a for a, _ in seqs])]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum([b for _, b in seqs])]).astype(np.int32)
    h, hkv, d = 2, 1, 16
    q = rng.standard_normal((cq[-1], h, d)).astype(np.float32)
    k = rng.standard_normal((ck[-1], hkv, d)).astype(np.float32)
    v = rng.standard_normal((ck[-1], hkv, d)).astype(np.float32)
    dout = rng.standard_normal((cq[-1], h, d)).astype(np.float32)
    arrays = {"q": q, "k": k, "v": v, "dout": dout}
    name, value = POKES[poke]
    if name in ("k", "v"):
        arrays[name][ck[2] + 70, 0, 5] = value  # sequence 2, key 70
    else:
        arrays[name][cq[2] + 100, 0, 5] = value  # sequence 2, query 100
    out, lse = flashkv.attention_varlen(q, k, v, cq, ck, causal=True, return_lse=True)
    dq, dk, dv = flashkv.attention_varlen_backward(dout, q, k, v, out, lse, cq, ck, causal=True)
    for b in range(len(seqs)):
        qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        ref, ref_lse = attention_ref_ieee(q[None, qs], k[None, ks], v[None, ks], causal=True)
        assert_classified_close(out[qs], ref[0], 1e-5, f"out seq {b}")
        assert_classified_close(lse[:, qs], ref_lse[0], 1e-5, f"lse seq {b}")
        grads = attention_backward_ref_ieee(dout[None, qs], q[None, qs], k[None, ks], v[None, ks], causal=True)
        for gname, g, r in zip(("dq", "dk", "dv"), (dq[qs], dk[ks], dv[ks]), grads):
            assert_classified_close(g, r[0], 2e-5, f"{gname} seq {b}")


def test_bfloat16_bits_propagate_nan(rng):
    x = _inputs(rng)
    x["k"][0, 70, 1, 5] = np.nan
    bits = {n: to_bf16_bits(a) for n, a in x.items()}
    out, lse = flashkv.attention(bits["q"], bits["k"], bits["v"], causal=True, return_lse=True, dtype="bfloat16")
    ref, ref_lse = attention_ref_ieee(*(from_bf16_bits(bits[n]) for n in ("q", "k", "v")), causal=True)
    assert_classified_close(from_bf16_bits(out), ref, 1.6e-2, "out")
    assert_classified_close(lse, ref_lse, 1e-5, "lse")


def test_logits_overflowing_float32_give_nan_rows(rng):
    x = _inputs(rng)
    x["q"][0, 100, 3, 5] = 1e20
    x["k"][0, 70, 1, 5] = 1e20  # q.k = 1e40: +inf in float32
    out, lse = flashkv.attention(x["q"], x["k"], x["v"], causal=True, return_lse=True)
    ref, ref_lse = attention_ref_ieee(x["q"], x["k"], x["v"], causal=True)
    assert np.isnan(ref_lse[0, 3, 100]) and np.isnan(lse[0, 3, 100])
    assert_classified_close(out, ref, 1e-5, "out")
    assert_classified_close(lse, ref_lse, 1e-5, "lse")
