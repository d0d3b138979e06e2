"""flashkv.KVCache over the C ABI: attention equals the float64 reference on the dequantized cache, memory report
equals the kv-mem formula, append in pieces == at once, typed errors with the cache left unchanged."""
import numpy as np
import pytest

import flashkv
from flashkv.kvcache import KVCache, kv_memory_estimate
from reference import attention_ref


def _cache(dtype="int8", **kw):
    args = dict(num_layers=2, num_heads_kv=2, head_dim=64, kv_cache_dtype=dtype, page_size=16, capacity_pages=64)
    args.update(kw)
    return KVCache(**args)


@pytest.mark.parametrize("dtype", ["bf16", "fp8_e4m3", "int8", "int4_g32", "int4_kivi", "k:int8,v:int2_kivi"])
def test_attention_matches_reference_on_dequantized(rng, dtype):
    c = _cache(dtype, page_size=32, residual_tokens=8, sink_tokens=2)
    lens, nqs = [70, 5], [3, 1]
    for s, n in enumerate(lens):
        c.add_sequence(s)
        k = rng.standard_normal((n, 2, 64)).astype(np.float32)
        v = rng.standard_normal((n, 2, 64)).astype(np.float32)
        c.append(s, 1, k, v)
    q = rng.standard_normal((sum(nqs), 8, 64)).astype(np.float32)
    out, lse = c.attention([0, 1], q, 1, q_lens=nqs, window_size_left=40)
    assert out.shape == q.shape and out.dtype == np.float32 and lse.shape == (8, sum(nqs))
    off = 0
    for s, (n, nq) in enumerate(zip(lens, nqs)):
        kd, vd = c.dequantize(s, 1)
        ref, ref_lse = attention_ref(q[None, off:off + nq].astype(np.float64), kd[None].astype(np.float64),
                                     vd[None].astype(np.float64), causal=True, window_size=(40, -1))
        np.testing.assert_allclose(out[off:off + nq], ref[0], atol=2e-5 * np.abs(vd).max())
        np.testing.assert_allclose(lse[:, off:off + nq], ref_lse[0], rtol=1e-5, atol=1e-5)
        off += nq


def test_append_in_pieces_equals_at_once(rng):
    c = _cache("int2_kivi", page_size=32, residual_tokens=16)
    k = rng.standard_normal((100, 2, 64)).astype(np.float32)
    v = rng.standard_normal((100, 2, 64)).astype(np.float32)
    c.add_sequence(1)
    c.add_sequence(2)
    c.append(1, 0, k, v)
    for a, b in [(0, 1), (1, 40), (40, 41), (41, 100)]:
        c.append(2, 0, k[a:b], v[a:b])
    k1, v1 = c.dequantize(1, 0)
    k2, v2 = c.dequantize(2, 0)
    assert np.array_equal(k1, k2) and np.array_equal(v1, v2)
    assert c.seq_len(2, 0) == 100 and c.seq_len(2, 1) == 0


def test_memory_report_equals_formula(rng):
    c = _cache("int4", page_size=16, residual_tokens=4, sink_tokens=1)
    k = rng.standard_normal((37, 2, 64)).astype(np.float32)
    for s in range(3):
        c.add_sequence(s)
        for layer in range(2):
            c.append(s, layer, k, k)
    live = c.memory_report()
    est = kv_memory_estimate(2, 2, 64, batch=3, tokens=37, kv_cache_dtype="int4", page_size=16, residual_tokens=4,
                             sink_tokens=1)
    for key in ["code_bytes", "metadata_bytes", "residual_bytes", "slack_bytes", "total_bytes", "pages_used"]:
        assert live[key] == est[key], key
    assert live["total_bytes"] == live["pages_used"] * live["page_bytes"] + live["residual_bytes"]
    # bf16 Llama-3-8B at 128k: 16 GiB exactly
    assert kv_memory_estimate(32, 8, 128, 1, 131072)["total_bytes"] == 16 * 2**30


def test_bfloat16_bits_and_float16_inputs(rng):
    c = _cache("bf16")
    c.add_sequence(0)
    k = rng.standard_normal((9, 2, 64)).astype(np.float32)
    bits = (k.view(np.uint32) >> 16).astype(np.uint16)  # exact bf16 values (truncation of float32)
    c.append(0, 0, bits, bits, dtype="bfloat16")
    kd, vd = c.dequantize(0, 0)
    np.testing.assert_array_equal(kd, (bits.astype(np.uint32) << 16).view(np.float32))
    c.append(0, 0, k.astype(np.float16), k.astype(np.float16))
    assert c.seq_len(0, 0) == 18
    q = rng.standard_normal((1, 4, 64)).astype(np.float16)
    out, lse = c.attention([0], q, 0)
    assert out.dtype == np.float16 and np.isfinite(out).all()


def test_errors_are_typed_and_leave_cache_unchanged(rng):
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        _cache("int3")
    with pytest.raises(ValueError, match="page_size"):
        _cache("int4_kivi_g64", page_size=32)
    with pytest.raises(ValueError, match="head_dim"):
        _cache("int4_g64", head_dim=96)
    c = _cache("int8", page_size=16, capacity_pages=2)
    c.add_sequence(0)
    k = rng.standard_normal((40, 2, 64)).astype(np.float32)
    c.append(0, 0, k[:20], k[:20])
    before = (c.memory_report(), *c.dequantize(0, 0))
    with pytest.raises(flashkv.CapacityError, match="cache unchanged"):
        c.append(0, 0, k, k)  # 60 tokens need 4 pages
    with pytest.raises(ValueError, match="seq_id"):
        c.append(7, 0, k, k)
    with pytest.raises(ValueError, match="layer"):
        c.append(0, 5, k, k)
    with pytest.raises(ValueError, match="'k'"):
        c.append(0, 0, k[:, :1], k)
    with pytest.raises(TypeError, match="'v'"):
        c.append(0, 0, k, k.astype(np.float16))
    bad = k.copy()
    bad[3, 1, 5] = np.nan
    with pytest.raises(ValueError, match="finite"):
        c.append(0, 0, bad[:4], k[:4])
    with pytest.raises(ValueError, match="seq_ids"):
        c.attention([3], rng.standard_normal((1, 4, 64)).astype(np.float32), 0)
    with pytest.raises(ValueError, match="'q'"):
        c.attention([0], rng.standard_normal((1, 3, 64)).astype(np.float32), 0)
    with pytest.raises(TypeError):
        c.attention([0], rng.standard_normal((1, 4, 64)), 0)  # float64
    after = (c.memory_report(), *c.dequantize(0, 0))
    assert before[0] == after[0]
    assert np.array_equal(before[1], after[1]) and np.array_equal(before[2], after[2])
    c.close()
    with pytest.raises(ValueError, match="closed"):
        c.add_sequence(1)


def test_default_arguments_just_work(rng):
    # issue 10 item 11: KVCache(num_layers, num_heads_kv, head_dim) with every other argument defaulted — a bf16 cache
    # in host memory whose pool grows as appends need pages — decodes exactly like a fixed pool large enough.
    c = KVCache(2, 2, 64)
    assert c.device == "cpu" and c.kv_cache_dtype == "bf16"
    start = c.memory_report()["pages_total"]
    c.add_sequence(0)
    k = rng.standard_normal((2000, 2, 64)).astype(np.float32)
    v = rng.standard_normal((2000, 2, 64)).astype(np.float32)
    c.append(0, 1, k, v)
    assert c.seq_len(0, 1) == 2000 and c.memory_report()["pages_total"] > start
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    out, lse = c.attention([0], q, 1)
    kd, vd = c.dequantize(0, 1)
    ref, ref_lse = attention_ref(q[None].astype(np.float64), kd[None].astype(np.float64), vd[None].astype(np.float64),
                                 causal=True)
    np.testing.assert_allclose(out, ref[0], atol=2e-5 * np.abs(vd).max())
    np.testing.assert_allclose(lse, ref_lse[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="head_dim"):
        KVCache(2, 2)  # the shape arguments are required, and the message names what is missing
    with pytest.raises(ValueError, match="capacity_pages/capacity_bytes"):
        KVCache(1, 1, 64, capacity_pages=4, capacity_bytes=1 << 20)
    with pytest.raises(ValueError, match="'device'"):
        KVCache(1, 1, 64, device="tpu")


def test_to_cpu_copies_the_cache(rng):
    c = _cache("int4_kivi", page_size=32, residual_tokens=8)
    c.add_sequence(3)
    k = rng.standard_normal((90, 2, 64)).astype(np.float32)
    c.append(3, 0, k, k)
    d = c.to("cpu")
    for a, b in zip(c.dequantize(3, 0), d.dequantize(3, 0)):
        assert np.array_equal(a, b)
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    assert np.array_equal(c.attention([3], q, 0)[0], d.attention([3], q, 0)[0])
    try:  # a library without the CUDA backend (or a machine without a GPU) says so; with one the copy round-trips
        g = c.to("cuda")
    except flashkv.UnsupportedError as e:
        assert "CUDA" in str(e)
    else:
        assert g.device == "cuda:0"
        for a, b in zip(c.dequantize(3, 0), g.to("cpu").dequantize(3, 0)):
            assert np.array_equal(a, b)


def test_arguments_are_checked_never_truncated(rng):
    # the C ABI stores int32 / int64: a float, bool or out-of-range value is an error naming the argument, never
    # truncated or wrapped (6.5 would silently become 6)
    c = _cache("int8")
    c.add_sequence(0)
    k = rng.standard_normal((5, 2, 64)).astype(np.float32)
    c.append(np.int64(0), np.int32(0), k, k)  # numpy integers are ints
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    with pytest.raises(TypeError, match="'seq_id'"):
        c.append(0.0, 0, k, k)
    with pytest.raises(TypeError, match="'layer'"):
        c.append(0, 1.5, k, k)
    with pytest.raises(TypeError, match="'seq_ids'"):
        c.attention([0.5], q, 0)
    with pytest.raises(TypeError, match="'q_lens'"):
        c.attention([0], q, 0, q_lens=[1.0])
    with pytest.raises(ValueError, match="'q_lens'"):
        c.attention([0], q, 0, q_lens=[-1])
    with pytest.raises(TypeError, match="'window_size_left'"):
        c.attention([0], q, 0, window_size_left=6.5)
    with pytest.raises(TypeError, match="'causal'"):
        c.attention([0], q, 0, causal="yes")
    with pytest.raises(TypeError, match="'softcap'"):
        c.attention([0], q, 0, softcap="1")
    with pytest.raises(ValueError, match="'num_splits'"):
        c.attention([0], q, 0, num_splits=2000)
    with pytest.raises(TypeError, match="'num_splits'"):
        c.attention([0], q, 0, num_splits=True)
    with pytest.raises(ValueError, match="'num_threads'"):
        c.attention([0], q, 0, num_threads=-1)
    with pytest.raises(ValueError, match="'layer'"):
        c.attention([0], q, 7)  # the library names the range
    with pytest.raises(ValueError, match="'head_dim'"):
        KVCache(1, 1, 2**31)  # would wrap to a negative int32
    with pytest.raises(TypeError, match="'capacity_pages'"):
        KVCache(1, 1, 64, capacity_pages=4.0)
    with pytest.raises(ValueError, match="'rotation_seed'"):
        KVCache(1, 1, 64, rotation_seed=-1)
    with pytest.raises(TypeError, match="'tokens'"):
        kv_memory_estimate(1, 1, 64, 1, 10.5)
    # the checks ran before anything was sent: the cache holds the one append
    assert c.seq_len(0, 0) == 5


def test_capacity_error_is_exported_and_a_runtime_error(rng):
    assert issubclass(flashkv.CapacityError, RuntimeError) and "CapacityError" in flashkv.__all__
    c = _cache("bf16", page_size=16, capacity_pages=1)
    c.add_sequence(0)
    k = rng.standard_normal((17, 2, 64)).astype(np.float32)
    with pytest.raises(flashkv.CapacityError, match="page"):
        c.append(0, 0, k, k)  # 17 tokens need 2 pages of 16
    assert c.seq_len(0, 0) == 0
    c.append(0, 0, k[:16], k[:16])  # what fits still fits
    assert c.seq_len(0, 0) == 16
