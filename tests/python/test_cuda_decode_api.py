"""flashkv.paged_decode on any machine (no GPU needed): argument checks done in Python, and the answer of the library
to CPU inputs — flashkv.UnsupportedError naming the reason from a library built without the CUDA backend, TypeError
naming 'q' (expected a cuda tensor) from a CUDA build. The GPU behaviour is tested in test_cuda_torch.py."""
import ctypes

import numpy as np
import pytest

import flashkv
from flashkv import _library


def library_has_cuda():
    """A build without CUDA answers flashkv_cuda_decode with FLASHKV_ERROR_UNSUPPORTED before looking at arguments."""
    lib = _library.lib()
    status = lib.flashkv_cuda_decode(None, None, None, None, None, None, None, None, None, None)
    return status != _library.UNSUPPORTED


def inputs(rng, batch=2, heads=8, heads_kv=2, head_dim=64, page_size=16, num_pages=8, max_pages=4):
    q = rng.standard_normal((batch, 1, heads, head_dim)).astype(np.float16)
    kc = rng.standard_normal((num_pages, page_size, heads_kv, head_dim)).astype(np.float16)
    vc = rng.standard_normal(kc.shape).astype(np.float16)
    table = np.arange(batch * max_pages, dtype=np.int32).reshape(batch, max_pages) % num_pages
    seqlens = np.array([5, 17], dtype=np.int32)[:batch]
    return q, kc, vc, table, seqlens


def test_paged_decode_is_exported():
    assert "paged_decode" in flashkv.__all__ and callable(flashkv.paged_decode)
    assert "k_cache" in flashkv.paged_decode.__doc__ and "cache_seqlens is NOT updated" in flashkv.paged_decode.__doc__


def test_cpu_inputs_raise_unsupported_without_cuda_or_typeerror_with_it(rng):
    q, kc, vc, table, seqlens = inputs(rng)
    before = (kc.copy(), vc.copy(), seqlens.copy())
    if library_has_cuda():
        with pytest.raises(TypeError, match="'q'.*cuda"):
            flashkv.paged_decode(q, kc, vc, table, seqlens, k_new=kc[:2, :1], v_new=vc[:2, :1])
    else:
        with pytest.raises(flashkv.UnsupportedError, match="no CUDA backend"):
            flashkv.paged_decode(q, kc, vc, table, seqlens, k_new=kc[:2, :1], v_new=vc[:2, :1])
        with pytest.raises(flashkv.UnsupportedError, match="no CUDA backend"):
            flashkv.paged_decode(q, kc, vc, None, seqlens, return_lse=True)
    for a, b in zip(before, (kc, vc, seqlens)):  # nothing was written
        assert np.array_equal(a, b)


def test_python_side_argument_checks(rng):
    q, kc, vc, table, seqlens = inputs(rng)
    with pytest.raises(ValueError, match="'v_new'"):
        flashkv.paged_decode(q, kc, vc, table, seqlens, k_new=kc[:2, :1])
    with pytest.raises(ValueError, match="'k_new'"):
        flashkv.paged_decode(q, kc, vc, table, seqlens, v_new=vc[:2, :1])
    with pytest.raises(ValueError, match="'num_splits'"):
        flashkv.paged_decode(q, kc, vc, table, seqlens, num_splits=-1)
    with pytest.raises(ValueError, match="'num_splits'"):
        flashkv.paged_decode(q, kc, vc, table, seqlens, num_splits=257)
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
