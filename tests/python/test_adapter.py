"""The tensor adapter: objects other than numpy arrays plug in without copies and get outputs of their own kind.

A torch tensor is recognized by duck typing (data_ptr/stride/dtype/device/new_empty); FakeTorchTensor below implements
exactly that protocol over numpy memory, so the torch path is exercised without installing torch."""
import ctypes

import numpy as np
import pytest

import flashkv
from flashkv import _library, _tensor
from reference import attention_backward_ref, attention_ref


class FakeDevice:
    def __init__(self, type_="cpu", index=None):
        self.type, self.index = type_, index

    def __str__(self):
        return self.type


class FakeDType:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return f"torch.{self.name}"


class FakeTorchTensor:
    """Minimal duck-typed stand-in for torch.Tensor (element strides, data_ptr, new_empty)."""

    def __init__(self, array, device="cpu"):
        self.array = array
        self.dtype = FakeDType(array.dtype.name)
        self.device = FakeDevice(device)
        self.shape = array.shape

    def data_ptr(self):
        return self.array.ctypes.data

    def stride(self):
        return tuple(s // self.array.itemsize for s in self.array.strides)

    def new_empty(self, shape, dtype=None):
        np_dtype = np.float32 if dtype is not None else self.array.dtype
        return FakeTorchTensor(np.empty(shape, dtype=np_dtype), self.device.type)


@pytest.fixture(autouse=True)
def fake_torch_float32(monkeypatch):
    monkeypatch.setattr(_tensor, "_torch_float32", lambda like: "float32")


def test_torch_like_tensors_in_and_out(rng):
    q = rng.standard_normal((2, 30, 4, 32)).astype(np.float32)
    k = rng.standard_normal((2, 41, 2, 32)).astype(np.float32)
    v = rng.standard_normal((2, 41, 2, 32)).astype(np.float32)
    tq, tk, tv = FakeTorchTensor(q), FakeTorchTensor(k), FakeTorchTensor(v)
    out, lse = flashkv.attention(tq, tk, tv, causal=True, return_lse=True)
    assert isinstance(out, FakeTorchTensor) and isinstance(lse, FakeTorchTensor)
    assert lse.array.dtype == np.float32 and lse.shape == (2, 4, 30)
    ref, lse_ref = attention_ref(q, k, v, causal=True)
    assert np.max(np.abs(out.array - ref)) <= 1e-5 * max(1.0, np.abs(ref).max())
    dout = rng.standard_normal(out.shape).astype(np.float32)
    dq, dk, dv = flashkv.attention_backward(FakeTorchTensor(dout), tq, tk, tv, out, lse, causal=True)
    assert all(isinstance(g, FakeTorchTensor) for g in (dq, dk, dv))
    for g, r in zip((dq, dk, dv), attention_backward_ref(dout, q, k, v, causal=True)):
        assert np.max(np.abs(g.array - r)) <= 1e-4 * max(1.0, np.abs(r).max())


def test_torch_like_cuda_tensor_is_refused_by_a_cpu_build(rng, monkeypatch):
    q = FakeTorchTensor(rng.standard_normal((1, 4, 1, 8)).astype(np.float32), device="cuda")
    # Without torch there is no real CUDA stream to ask for; everything else is the real path.
    monkeypatch.setattr(flashkv._attention, "cuda_stream", lambda args: None)
    arg = _tensor.to_tensor(q, "q")
    assert arg.c.device == _library.DEVICE_CUDA and arg.device == "cuda"
    with pytest.raises(flashkv.UnsupportedError, match="CUDA"):
        flashkv.attention(q, q, q)


def test_torch_like_bad_dtype(rng):
    q = FakeTorchTensor(rng.standard_normal((1, 4, 1, 8)).astype(np.float32))
    q.dtype = FakeDType("complex64")
    with pytest.raises(TypeError, match="'q'"):
        flashkv.attention(q, q, q)


class ArrayInterfaceOnly:
    def __init__(self, a):
        self._a = a
        self.__array_interface__ = a.__array_interface__


class DLPackOnly:
    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


@pytest.mark.parametrize("wrap", [ArrayInterfaceOnly, DLPackOnly], ids=["array_interface", "dlpack"])
def test_array_protocols_without_copy(rng, wrap):
    q = rng.standard_normal((1, 12, 2, 16)).astype(np.float32)
    out = flashkv.attention(wrap(q), wrap(q), wrap(q))
    ref, _ = attention_ref(q, q, q)
    assert isinstance(out, np.ndarray)
    assert np.max(np.abs(out - ref)) <= 1e-5 * max(1.0, np.abs(ref).max())
    # the view points at the caller's memory (no copy)
    assert _tensor.to_tensor(wrap(q), "q").c.data == q.ctypes.data


def test_element_strides_and_pointer():
    a = np.zeros((3, 5, 7, 16), np.float16)[:, 1:4]
    t = _tensor.to_tensor(a, "q")
    assert t.c.ndim == 4 and t.c.dtype == _library.DTYPE_CODES["float16"]
    assert list(t.c.strides[:4]) == [5 * 7 * 16, 7 * 16, 16, 1]
    assert t.c.data == a.ctypes.data


def test_options_struct_matches_the_c_abi():
    o = _library.default_options()
    assert o.struct_size == ctypes.sizeof(_library.AttentionOptions)
    assert (o.has_softmax_scale, o.causal, o.window_size_left, o.window_size_right, o.softcap, o.algorithm) == (
        0, 0, -1, -1, 0.0, 0)
