"""flashkv.paged_decode on any machine (no GPU needed): the CPU decode over numpy arrays against a float64 numpy
reference (append, GQA, page table, lse), the capacity error (issue 10 item 1: nothing written), argument checks done
in Python, and the options struct. The GPU behaviour is tested in test_cuda_torch.py and tests/cuda (label gpu)."""
import ctypes

import numpy as np
import pytest

import flashkv
from flashkv import _library


def inputs(rng, batch=2, heads=8, heads_kv=2, head_dim=64, page_size=16, num_pages=8, max_pages=4, dtype=np.float16):
    q = rng.standard_normal((batch, 1, heads, head_dim)).astype(dtype)
    kc = rng.standard_normal((num_pages, page_size, heads_kv, head_dim)).astype(dtype)
    vc = rng.standard_normal(kc.shape).astype(dtype)
    table = rng.permutation(num_pages)[: batch * max_pages].astype(np.int32).reshape(batch, max_pages)
    seqlens = np.array([5, 17], dtype=np.int32)[:batch]
    return q, kc, vc, table, seqlens


def reference(q, k, v, causal=True):
    """float64 attention of q [sq, h, d] over k, v [sk, hk, d], bottom-right causal; out [sq, h, d], lse [h, sq]."""
    sq, h, d = q.shape
    sk, hk = k.shape[:2]
    g = h // hk
    out = np.zeros((sq, h, d))
    lse = np.full((h, sq), -np.inf)
    for i in range(sq):
        last = i + sk - sq if causal else sk - 1
        if last < 0:
            continue
        for hh in range(h):
            s = k[: last + 1, hh // g].astype(np.float64) @ q[i, hh].astype(np.float64) / np.sqrt(d)
            m = s.max()
            p = np.exp(s - m)
            out[i, hh] = p @ v[: last + 1, hh // g].astype(np.float64) / p.sum()
            lse[hh, i] = m + np.log(p.sum())
    return out, lse


def test_paged_decode_is_exported():
    assert "paged_decode" in flashkv.__all__ and callable(flashkv.paged_decode)
    assert "k_cache" in flashkv.paged_decode.__doc__ and "cache_seqlens is NOT updated" in flashkv.paged_decode.__doc__


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_cpu_paged_decode_with_append_matches_reference(rng, dtype):
    q, kc, vc, table, seqlens = inputs(rng, dtype=dtype)
    page = kc.shape[1]
    kn = rng.standard_normal((2, 1, 2, 64)).astype(dtype)
    vn = rng.standard_normal(kn.shape).astype(dtype)
    before_k = kc.copy()
    out, lse = flashkv.paged_decode(q, kc, vc, table, seqlens, k_new=kn, v_new=vn, return_lse=True, num_splits=3)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == (2, 8, 1)
    tol = 2e-5 if dtype == np.float32 else 2e-3
    for b in range(2):
        n = int(seqlens[b]) + 1
        pos = np.arange(n)
        k = kc[table[b, pos // page], pos % page]  # the cache after the append, gathered
        v = vc[table[b, pos // page], pos % page]
        assert np.array_equal(k[-1], kn[b, 0]) and np.array_equal(v[-1], vn[b, 0])
        ref, ref_lse = reference(q[b], k, v)
        assert np.abs(out[b].astype(np.float64) - ref).max() <= tol
        assert np.abs(lse[b] - ref_lse).max() <= 1e-4
    changed = np.argwhere((kc != before_k).any(axis=(2, 3)))
    expect = {(int(table[b, seqlens[b] // page]), int(seqlens[b] % page)) for b in range(2)}
    assert {tuple(x) for x in changed} <= expect  # only the appended rows changed


def test_cpu_paged_decode_past_capacity_is_a_capacity_error_and_writes_nothing(rng):
    # issue 10 item 1: cached length 500 + 20 new tokens on a page table of 512 slots
    q = rng.standard_normal((1, 20, 4, 64)).astype(np.float16)
    kc = rng.standard_normal((40, 64, 2, 64)).astype(np.float16)
    vc = rng.standard_normal(kc.shape).astype(np.float16)
    table = np.arange(8, dtype=np.int32).reshape(1, 8)
    seqlens = np.array([500], dtype=np.int32)
    kn = rng.standard_normal((1, 20, 2, 64)).astype(np.float16)
    out = np.full(q.shape, 7.0, dtype=np.float16)
    before = (kc.copy(), vc.copy())
    for promise in (0, 600):
        with pytest.raises(flashkv.CapacityError, match="512"):
            flashkv.paged_decode(q, kc, vc, table, seqlens, k_new=kn, v_new=kn, out=out, max_seqlen_k=promise)
    assert np.array_equal(before[0], kc) and np.array_equal(before[1], vc) and (out == 7.0).all()
    with pytest.raises(ValueError, match="'cache_seqlens'"):
        flashkv.paged_decode(q, kc, vc, table, np.array([-3], dtype=np.int32))


def test_python_side_argument_checks(rng):
    q, kc, vc, table, seqlens = inputs(rng)
    with pytest.raises(ValueError, match="'v_new'"):
        flashkv.paged_decode(q, kc, vc, table, seqlens, k_new=kc[:2, :1])
    with pytest.raises(ValueError, match="'k_new'"):
        flashkv.paged_decode(q, kc, vc, table, seqlens, v_new=vc[:2, :1])
    with pytest.raises(ValueError, match="'num_splits'"):
        flashkv.paged_decode(q, kc, vc, table, seqlens, num_splits=-1)
    with pytest.raises(ValueError, match="'num_splits'"):
        flashkv.paged_decode(q, kc, vc, table, seqlens, num_splits=1025)
    with pytest.raises(ValueError, match="'window_size_left'"):
        flashkv.paged_decode(q, kc, vc, table, seqlens, window_size_left=-2)
    with pytest.raises(TypeError, match="'num_splits'"):
        flashkv.paged_decode(q, kc, vc, table, seqlens, num_splits=2.0)
    with pytest.raises(ValueError, match="'max_seqlen_k'"):
        flashkv.paged_decode(q, kc, vc, table, seqlens, max_seqlen_k=-5)
    with pytest.raises(TypeError, match="'softcap'"):
        flashkv.paged_decode(q, kc, vc, table, seqlens, softcap="30")
    with pytest.raises(TypeError, match="'softmax_scale'"):
        flashkv.paged_decode(q, kc, vc, table, seqlens, softmax_scale="0.1")
    with pytest.raises(TypeError, match="'cache_seqlens'"):
        flashkv.paged_decode(q, kc, vc, table, None)
    with pytest.raises(TypeError, match="'q'"):
        flashkv.paged_decode([[1.0]], kc, vc, table, seqlens)
    # the checks of flashkv.attention: no truncation, no truthiness, no int64 wrap-around
    with pytest.raises(TypeError, match="'causal'"):
        flashkv.paged_decode(q, kc, vc, table, seqlens, causal="no")
    with pytest.raises(TypeError, match="'window_size_left'"):
        flashkv.paged_decode(q, kc, vc, table, seqlens, window_size_left=6.5)
    with pytest.raises(TypeError, match="'max_seqlen_k'"):
        flashkv.paged_decode(q, kc, vc, table, seqlens, max_seqlen_k=True)
    with pytest.raises(ValueError, match="'max_seqlen_k'"):
        flashkv.paged_decode(q, kc, vc, table, seqlens, max_seqlen_k=2**63)
    with pytest.raises(ValueError, match="'num_threads'"):
        flashkv.paged_decode(q, kc, vc, table, seqlens, num_threads=-1)
    out = flashkv.paged_decode(q, kc, vc, table, seqlens, causal=np.bool_(True), num_splits=np.int64(2))
    assert out.shape == q.shape  # numpy scalars are accepted


class _FakeInt64Tensor:
    """Duck-typed torch tensor of dtype torch.int64 (no torch needed)."""

    class dtype:  # noqa: N801
        def __str__(self):
            return "torch.int64"

    def __init__(self):
        self.dtype = _FakeInt64Tensor.dtype()
        self.device = "cuda"

    def data_ptr(self):
        return 0

    def stride(self):
        return (1,)

    def new_empty(self, *a, **k):
        raise AssertionError("not reached")


def test_int64_tables_are_type_errors(rng):
    q, kc, vc, _, seqlens = inputs(rng)
    with pytest.raises(TypeError, match="'page_table': expected int32, got torch.int64"):
        flashkv.paged_decode(q, kc, vc, _FakeInt64Tensor(), seqlens)
    with pytest.raises(TypeError, match="'cache_seqlens': expected int32"):
        flashkv.paged_decode(q, kc, vc, None, _FakeInt64Tensor())


def test_decode_options_struct_matches_the_c_default():
    o = _library.DecodeOptions()
    _library.check(_library.lib().flashkv_decode_options_default(ctypes.byref(o)))
    assert o.struct_size == ctypes.sizeof(_library.DecodeOptions)
    assert o.causal == 1 and o.num_splits == 0 and o.max_seqlen_k == 0 and o.has_softmax_scale == 0
    assert o.window_size_left == -1 and o.num_threads == 0
