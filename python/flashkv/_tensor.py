"""Adapter from Python array objects to flashkv_tensor views (no copies), and allocation of outputs of the same kind.

Accepted inputs (checked in this order):
  * torch tensors, by duck typing (``data_ptr()``, ``stride()``, ``dtype``, ``device``, ``new_empty()``) — CPU or CUDA;
    torch is never imported unless a CUDA stream or a float32 output of the torch kind is needed;
  * numpy arrays and any object exposing ``__array_interface__`` (viewed through ``numpy.asarray``, no copy);
  * any object exposing ``__dlpack__`` on the CPU (viewed through ``numpy.from_dlpack``, no copy).

dtypes: float32, float16, bfloat16 for attention tensors (float8_e4m3fn q/k/v for the CUDA FP8 forward, whose out is
bfloat16); int32 for cu_seqlens; float32 for lse and FP8 descales. bfloat16 comes either
as a numpy array whose dtype is named "bfloat16" (``ml_dtypes.bfloat16``; ml_dtypes is optional and never imported
here) or as a uint16 array of bfloat16 bit patterns together with an explicit ``dtype="bfloat16"`` argument.

Errors: an object of another kind or an unknown/non-native dtype -> TypeError; negative strides, strides that are not
a whole number of elements, more than 8 dimensions or a non-contiguous last dimension -> ValueError. Each message
names the argument. Everything else (ranks, shapes, dtype agreement, value ranges) is checked by the library.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._library import DEVICE_CPU, DEVICE_CUDA, DTYPE_CODES, MAX_DIMS, Tensor

_TORCH_DTYPES = {
    "torch.float32": "float32",
    "torch.float16": "float16",
    "torch.bfloat16": "bfloat16",
    "torch.int32": "int32",
    "torch.float64": "float64",
    "torch.uint8": "uint8",
    "torch.float8_e4m3fn": "float8_e4m3fn",
}


@dataclass
class TensorArg:
    """One converted argument: the C view plus what is needed to allocate outputs of the same kind."""

    name: str
    obj: Any  # the numpy array / torch tensor whose memory the view points at (kept alive by this object)
    c: Tensor
    dtype: str  # flashkv dtype name
    shape: tuple
    kind: str  # "numpy" or "torch"
    device: str  # "cpu" or "cuda"
    device_index: int

    @property
    def ptr(self) -> Any:
        return ctypes.byref(self.c)


def _is_torch_like(x: Any) -> bool:
    return (
        callable(getattr(x, "data_ptr", None))
        and callable(getattr(x, "stride", None))
        and callable(getattr(x, "new_empty", None))
        and hasattr(x, "device")
        and hasattr(x, "dtype")
    )


def _fill(name: str, c: Tensor, shape: tuple, strides: tuple) -> None:
    if len(shape) > MAX_DIMS:
        raise ValueError(f"flashkv: argument '{name}': expected at most {MAX_DIMS} dimensions, got {len(shape)}")
    if any(n == 0 for n in shape):  # an empty tensor has no memory to stride over: describe it as contiguous
        strides = tuple(int(np.prod(shape[d + 1 :], dtype=np.int64)) for d in range(len(shape)))
    for s in strides:
        if s < 0:
            raise ValueError(f"flashkv: argument '{name}': expected non-negative strides, got strides {strides}")
    if shape and shape[-1] > 1 and strides[-1] != 1:
        raise ValueError(
            f"flashkv: argument '{name}': expected a contiguous last dimension (stride 1), got stride {strides[-1]} "
            "(use numpy.ascontiguousarray / tensor.contiguous())"
        )
    c.ndim = len(shape)
    for d, (n, s) in enumerate(zip(shape, strides)):
        c.shape[d] = int(n)
        c.strides[d] = int(s)


def _from_torch(x: Any, name: str, dtype_override: str | None) -> TensorArg:
    tname = str(x.dtype)
    dtype = _TORCH_DTYPES.get(tname)
    if dtype is None:
        raise TypeError(f"flashkv: argument '{name}': expected a float32, float16 or bfloat16 tensor, got {tname}")
    dev = x.device
    dev_type = getattr(dev, "type", str(dev))
    if dev_type not in ("cpu", "cuda"):
        raise TypeError(f"flashkv: argument '{name}': expected a cpu or cuda tensor, got device {dev}")
    index = getattr(dev, "index", None) or 0
    c = Tensor()
    c.data = x.data_ptr() or None
    c.dtype = DTYPE_CODES[dtype]
    c.device = DEVICE_CUDA if dev_type == "cuda" else DEVICE_CPU
    c.device_index = index
    shape = tuple(int(n) for n in x.shape)
    _fill(name, c, shape, tuple(int(s) for s in x.stride()))
    return TensorArg(name, x, c, dtype, shape, "torch", dev_type, index)


def _as_numpy(x: Any, name: str) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__array_interface__"):
        return np.asarray(x)
    if hasattr(x, "__dlpack__"):
        try:
            return np.from_dlpack(x)
        except (BufferError, RuntimeError, TypeError) as e:  # e.g. a CUDA buffer or a dtype numpy lacks
            raise TypeError(f"flashkv: argument '{name}': cannot view this __dlpack__ object on the CPU: {e}") from e
    raise TypeError(
        f"flashkv: argument '{name}': expected a numpy array, a torch tensor or an object with "
        f"__array_interface__/__dlpack__, got {type(x).__module__}.{type(x).__qualname__}"
    )


def _from_numpy(x: Any, name: str, dtype_override: str | None) -> TensorArg:
    a = _as_numpy(x, name)
    if not a.dtype.isnative:
        raise TypeError(f"flashkv: argument '{name}': expected native byte order, got dtype {a.dtype.str}")
    dname = a.dtype.name
    if dname == "uint16" and dtype_override == "bfloat16":
        dname = "bfloat16"
    elif dname == "uint16":
        raise TypeError(
            f"flashkv: argument '{name}': expected float32, float16 or bfloat16, got uint16 "
            "(pass dtype='bfloat16' to treat uint16 arrays as bfloat16 bit patterns)"
        )
    if dname not in DTYPE_CODES:
        raise TypeError(f"flashkv: argument '{name}': expected float32, float16 or bfloat16, got {a.dtype}")
    item = a.dtype.itemsize
    if any(s % item for s in a.strides):
        raise ValueError(
            f"flashkv: argument '{name}': expected strides that are whole elements ({item} bytes), got "
            f"byte strides {a.strides}"
        )
    c = Tensor()
    c.data = a.ctypes.data or None
    c.dtype = DTYPE_CODES[dname]
    c.device = DEVICE_CPU
    c.device_index = 0
    _fill(name, c, tuple(a.shape), tuple(s // item for s in a.strides))
    return TensorArg(name, a, c, dname, tuple(a.shape), "numpy", "cpu", 0)


def to_tensor(x: Any, name: str, dtype_override: str | None = None) -> TensorArg:
    """Views `x` as a flashkv_tensor without copying (see the module docstring for what is accepted)."""
    if x is None:
        raise TypeError(f"flashkv: argument '{name}': expected an array or tensor, got None")
    if _is_torch_like(x):
        return _from_torch(x, name, dtype_override)
    return _from_numpy(x, name, dtype_override)


def _torch_float32(like: Any) -> Any:
    """torch.float32 (imported only when a float32 output of the torch kind is needed)."""
    import torch  # noqa: PLC0415

    return torch.float32


def new_output(like: TensorArg, shape: tuple, name: str, float32: bool = False) -> TensorArg:
    """Allocates an output of the same kind/device as `like`: its dtype (or float32 if `float32`; bfloat16 for a
    float8_e4m3fn `like`, the FP8 forward's output type), C-contiguous."""
    shape = tuple(int(n) for n in shape)
    if like.kind == "torch":
        if float32:
            t = like.obj.new_empty(shape, dtype=_torch_float32(like.obj))
        elif like.dtype == "float8_e4m3fn":
            import torch  # noqa: PLC0415

            t = like.obj.new_empty(shape, dtype=torch.bfloat16)
        else:
            t = like.obj.new_empty(shape)
        return _from_torch(t, name, None)
    if float32:
        return _from_numpy(np.empty(shape, dtype=np.float32), name, None)
    if like.dtype == "float8_e4m3fn":  # bfloat16 bit patterns (the FP8 forward runs on CUDA tensors only)
        return _from_numpy(np.empty(shape, dtype=np.uint16), name, "bfloat16")
    return _from_numpy(np.empty(shape, dtype=like.obj.dtype), name, like.dtype if like.dtype == "bfloat16" else None)


def cuda_stream(args: list[TensorArg]) -> int | None:
    """The current torch CUDA stream of the first CUDA argument (as an integer handle), or None on the CPU."""
    for a in args:
        if a.kind == "torch" and a.device == "cuda":
            import torch  # noqa: PLC0415

            return int(torch.cuda.current_stream(a.device_index).cuda_stream) or None
    return None


__all__ = ["TensorArg", "to_tensor", "new_output", "cuda_stream"]
