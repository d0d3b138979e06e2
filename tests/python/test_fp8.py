"""FP8 (torch.float8_e4m3fn) attention through the Python package: the flashkv.fp8 helpers (amax quantization,
Hadamard rotation), the typed errors (FP8 is a CUDA sm90ws forward; descales are float32 tensors of shape () / (1,) /
(batch, num_heads_kv), only with FP8 inputs), and on a Hopper GPU the forward against float64 attention on the
dequantized values. The kernel grid itself is tests/cuda/test_attention_fp8_cuda.cpp (CudaFp8*)."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch, "float8_e4m3fn"):
    pytest.skip("this torch has no float8_e4m3fn", allow_module_level=True)

import flashkv  # noqa: E402
import flashkv.fp8 as fp8  # noqa: E402
from flashkv import _library as L  # noqa: E402

E4M3 = torch.float8_e4m3fn


def test_hadamard_rotation_keeps_qk_and_is_orthonormal():
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 17, 4, 64, generator=g), torch.randn(2, 23, 4, 64, generator=g)
    m = fp8.hadamard_matrix(64, seed=5)
    assert torch.allclose(m @ m.T, torch.eye(64), atol=1e-5)
    q2, k2 = fp8.hadamard_qk(q, k, seed=5)
    s1 = torch.einsum("bihd,bjhd->bhij", q, k)
    s2 = torch.einsum("bihd,bjhd->bhij", q2, k2)
    assert (s1 - s2).abs().max().item() < 1e-4
    with pytest.raises(ValueError, match="power of two"):
        fp8.hadamard_matrix(96)


def test_quantize_shapes_and_round_trip():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(3, 10, 8, 32, generator=g) * torch.tensor([0.1, 1, 10, 100]).repeat_interleave(2)[:, None]
    q8, qd = fp8.quantize_e4m3(q, 4)
    assert q8.dtype == E4M3 and qd.shape == (3, 4) and qd.dtype == torch.float32
    scale = qd.repeat_interleave(2, dim=1)[:, None, :, None]
    back = q8.float() * scale
    # round to nearest e4m3 (3 mantissa bits, subnormal step 2^-9): within half a step of the scaled value
    bound = torch.maximum(q.abs() * 2**-4, scale * 2**-10) * (1 + 1e-5)
    assert bool(((back - q).abs() <= bound).all())
    assert q8.float().abs().max().item() <= 448
    _, d1 = fp8.quantize_e4m3(q, per_head=False)
    assert d1.shape == (1,) and math.isclose(d1.item(), q.abs().max().item() / 448, rel_tol=1e-6)


def test_fp8_on_cpu_tensors_is_unsupported():
    q = torch.randn(1, 8, 2, 16).to(E4M3)
    with pytest.raises(L.UnsupportedError, match="CUDA"):
        flashkv.attention(q, q, q)


def test_descales_are_for_fp8_inputs_only():
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(ValueError, match="q_descale"):
        flashkv.attention(q, q, q, q_descale=torch.ones(1))


def test_fp8_backward_is_unsupported():
    q8 = torch.randn(1, 8, 2, 16).to(E4M3)
    out = torch.zeros(1, 8, 2, 16, dtype=torch.bfloat16)
    lse = torch.zeros(1, 2, 8)
    with pytest.raises(L.UnsupportedError, match="forward-only"):
        flashkv.attention_backward(out, q8, q8, q8, out, lse)


def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability(0) == (9, 0)


@pytest.mark.skipif(not _hopper(), reason="FP8 attention needs a Hopper GPU (kernel family sm90ws)")
@pytest.mark.parametrize("causal", [False, True])
def test_fp8_forward_matches_dequantized_reference(causal):
    g = torch.Generator(device="cuda").manual_seed(3)
    b, s, h, hkv, d = 2, 300, 4, 2, 128
    q = torch.randn(b, s, h, d, device="cuda", generator=g)
    k = torch.randn(b, s, hkv, d, device="cuda", generator=g)
    v = torch.randn(b, s, hkv, d, device="cuda", generator=g)
    (q8, qd), (k8, kd), (v8, vd) = fp8.quantize_e4m3(q, hkv), fp8.quantize_e4m3(k), fp8.quantize_e4m3(v)
    out, lse = flashkv.attention(q8, k8, v8, causal=causal, return_lse=True, q_descale=qd, k_descale=kd,
                                 v_descale=vd)
    assert out.dtype == torch.bfloat16 and "float8_e4m3fn" in flashkv.last_kernel_path()
    deq = lambda x8, ds, grp: (x8.double() * ds.double().repeat_interleave(grp, 1)[:, None, :, None])  # noqa: E731
    qq, kk, vv = deq(q8, qd, h // hkv), deq(k8, kd, 1), deq(v8, vd, 1)
    kk, vv = kk.repeat_interleave(h // hkv, 2), vv.repeat_interleave(h // hkv, 2)
    sc = torch.einsum("bihd,bjhd->bhij", qq, kk) / math.sqrt(d)
    if causal:
        sc = sc.masked_fill(torch.ones(s, s, dtype=torch.bool, device="cuda").triu(1), -math.inf)
    ref = torch.einsum("bhij,bjhd->bihd", sc.softmax(-1), vv)
    assert (out.double() - ref).abs().max().item() < 0.05  # e4m3 P (3 mantissa bits); the 2x rule: tests/cuda
    assert (lse.double() - torch.logsumexp(sc, -1)).abs().max().item() < 1e-3
    with pytest.raises(ValueError, match="k_descale"):
        flashkv.attention(q8, k8, v8, k_descale=torch.ones(3, device="cuda"))
    with pytest.raises(TypeError, match="v_descale"):
        flashkv.attention(q8, k8, v8, v_descale=torch.ones(b, hkv, device="cuda", dtype=torch.float16))
    with pytest.raises(L.UnsupportedError, match="'sm80'"):
        flashkv.attention(q8, k8, v8, kernel="sm80")
    np.testing.assert_array_equal(out.isfinite().cpu().numpy(), True)
