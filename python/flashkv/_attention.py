"""Exact attention (forward and backward) over the flashkv C ABI.

Algorithm: FlashAttention (Dao et al., NeurIPS 2022, §3.1 Alg. 1: tiles + online softmax with running max m, running
sum l and an unnormalized accumulator O) with the FA2 work partitioning (Dao 2023, §3.1–3.2); the backward pass
recomputes P from lse (FA2 §3.1.2 Alg. 2). Results are exact up to float32 rounding; see include/flashkv/attention.hpp.

Layout (bshd, as flash-attn):
    q    [batch, seqlen_q, num_heads,    head_dim]
    k    [batch, seqlen_k, num_heads_kv, head_dim]
    v    [batch, seqlen_k, num_heads_kv, head_dim_v]
    out  [batch, seqlen_q, num_heads,    head_dim_v]   (same dtype as q)
    lse  [batch, num_heads, seqlen_q] float32, natural log (-inf for a row that sees no key)
Varlen (packed): q [total_q, num_heads, head_dim], k/v [total_k, num_heads_kv, head_dim(_v)], cu_seqlens_q/k int32
    [batch + 1] (any integer dtype is accepted and converted to int32, values checked to fit), lse [num_heads, total_q].

dtypes: float32, float16, bfloat16 (one dtype for q, k, v, dout, out); float32 accumulation; outputs in the input dtype.
bfloat16 is either an ``ml_dtypes.bfloat16`` numpy array or a uint16 array of bit patterns with ``dtype="bfloat16"``.
FP8 (forward only, CUDA kernel family sm90ws on Hopper): torch.float8_e4m3fn q, k, v give a bfloat16 out, with optional
float32 dequantization scales q_descale / k_descale / v_descale of shape () or (1,) (per tensor) or
(batch, num_heads_kv); the result is attention on q * q_descale, k * k_descale, v * v_descale (flashkv.fp8 quantizes
and applies the Hadamard rotation of FA3's incoherent processing).

Mask (i = query position, j = key position within a sequence, shift = seqlen_k - seqlen_q):
    visible(i, j) = (left < 0 or j >= i + shift - left) and (right < 0 or j <= i + shift + right)
with (left, right) = window_size; causal=True is window_size[1] = 0 (bottom-right aligned). A model with a sliding
window of W tokens uses window_size=(W - 1, 0). softcap > 0 applies softcap * tanh(score / softcap) before masking.
GQA/MQA: num_heads must be a multiple of num_heads_kv.

Non-finite inputs propagate as IEEE arithmetic over the keys each query row sees (include/flashkv/attention.hpp,
NON-FINITE INPUTS): a row whose visible scores include a NaN or +inf, or are all -inf, gets NaN out and NaN lse; a
NaN/inf in a visible v row makes that output channel NaN/inf; rows that do not see the bad key are unchanged and masked
keys never matter; lse = -inf only for a row with no visible key. The backward follows the same rule. Nothing raises.

Errors: ValueError for bad shapes, ranks, strides or values; TypeError for wrong dtypes or object kinds; each message
names the argument with expected vs actual. flashkv.UnsupportedError for what this build cannot run.
"""
from __future__ import annotations

import ctypes
import math
import numbers
from typing import Any, Sequence

import numpy as np

from . import _library as L
from ._tensor import TensorArg, cuda_stream, new_output, to_tensor


_INT32_MAX_ARG = 2**31 - 1


def _int_arg(value: Any, name: str, lo: int, hi: int = _INT32_MAX_ARG) -> int:
    """An integer argument (int or numpy integer, not bool/float/str) in [lo, hi]: the C ABI stores int32/int64, so a
    value outside the range must be an error, never a silent wrap-around or truncation."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"flashkv: argument '{name}': expected an int, got {type(value).__name__} {value!r}")
    v = int(value)
    if not lo <= v <= hi:
        raise ValueError(f"flashkv: argument '{name}': expected an int in {lo}..{hi}, got {v}")
    return v


def _bool_arg(value: Any, name: str) -> bool:
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, (int, np.integer)) and int(value) in (0, 1)):
        return bool(value)
    raise TypeError(f"flashkv: argument '{name}': expected a bool, got {type(value).__name__} {value!r}")


def _float_arg(value: Any, name: str, what: str) -> float:
    """A real number (Python or numpy float/int, not bool or str)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"flashkv: argument '{name}': expected {what}, got {type(value).__name__}")
    return float(value)


def _options(
    causal: bool,
    window_size: Sequence[int],
    softcap: float,
    softmax_scale: float | None,
    algorithm: str,
    num_threads: int,
    deterministic: bool,
) -> L.AttentionOptions:
    o = L.default_options()
    try:
        left, right = window_size
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"flashkv: argument 'window_size': expected a pair (left, right) of ints (-1 = unbounded), got "
            f"{window_size!r}"
        ) from e
    left = _int_arg(left, "window_size[0]", -(2**31))  # the library reports < -1 with its own message
    right = _int_arg(right, "window_size[1]", -(2**31))
    if algorithm not in L.ALGORITHMS:
        raise ValueError(
            f"flashkv: argument 'algorithm': expected one of {', '.join(L.ALGORITHMS)}, got {algorithm!r}"
        )
    o.causal = 1 if _bool_arg(causal, "causal") else 0
    o.window_size_left, o.window_size_right = left, right
    o.softcap = _float_arg(softcap, "softcap", "a float")
    if softmax_scale is not None:
        o.has_softmax_scale = 1
        o.softmax_scale = _float_arg(softmax_scale, "softmax_scale", "a float or None")
        if math.isfinite(softmax_scale) and not math.isfinite(o.softmax_scale):  # overflows float32
            raise ValueError(f"flashkv: argument 'softmax_scale': expected a float32 value, got {softmax_scale!r}")
    o.algorithm = L.ALGORITHMS[algorithm]
    o.num_threads = _int_arg(num_threads, "num_threads", 0)
    o.deterministic = 1 if deterministic else 0
    return o


def _check_dtype_arg(dtype: str | None) -> None:
    if dtype not in (None, "bfloat16"):
        raise ValueError(
            f"flashkv: argument 'dtype': expected None or 'bfloat16' (uint16 bit patterns), got {dtype!r}"
        )


_FORWARD: Any = object()  # _prepare's dout for forward calls (a backward call's dout=None must still be reported)


def _prepare(
    dtype: str | None,
    q: Any,
    k: Any,
    v: Any,
    causal: bool,
    window_size: Sequence[int],
    softcap: float,
    softmax_scale: float | None,
    algorithm: str,
    num_threads: int,
    dout: Any = _FORWARD,
    deterministic: bool = False,
) -> tuple[L.AttentionOptions, TensorArg | None, TensorArg, TensorArg, TensorArg]:
    """Checks `dtype` and the options, then converts dout (backward only), q, k, v, in that order.

    Returns (o, tdo, tq, tk, tv); tdo is None for a forward call (dout not passed).
    """
    _check_dtype_arg(dtype)
    if not isinstance(deterministic, (bool, np.bool_)):
        raise TypeError(f"flashkv: argument 'deterministic': expected a bool, got {type(deterministic).__name__}")
    o = _options(causal, window_size, softcap, softmax_scale, algorithm, num_threads, bool(deterministic))
    tdo = None if dout is _FORWARD else to_tensor(dout, "dout", dtype)
    tq, tk, tv = to_tensor(q, "q", dtype), to_tensor(k, "k", dtype), to_tensor(v, "v", dtype)
    return o, tdo, tq, tk, tv


def _set_kernel(o: L.AttentionOptions, kernel: str) -> L.AttentionOptions:
    """kernel = "auto" | "sm80" | "sm90" | "sm90ws": the CUDA kernel family (flashkv::KernelFamily; docs/gpu.md)."""
    if not isinstance(kernel, str) or kernel not in L.KERNEL_FAMILIES:
        raise ValueError(f"flashkv: argument 'kernel': expected one of {', '.join(L.KERNEL_FAMILIES)}, got {kernel!r}")
    if kernel != "auto" and o.struct_size < type(o).kernel_family.offset + ctypes.sizeof(ctypes.c_int32):
        raise L.UnsupportedError(
            f"flashkv: argument 'kernel': {kernel!r} needs a flashkv library with kernel families (the loaded one "
            f"predates them)"
        )
    o.kernel_family = L.KERNEL_FAMILIES[kernel]
    return o


def _set_descales(o: L.AttentionOptions, descales: dict[str, Any]) -> list[TensorArg]:
    """Points the options at the FP8 dequantization scales that were given (the library checks dtype float32, shape
    () / (1,) / (batch, num_heads_kv), device and that q is float8_e4m3fn: TypeError / ValueError naming them).
    Returns the converted tensors, which must stay alive until the call returns."""
    keep: list[TensorArg] = []
    for name, x in descales.items():
        if x is None:
            continue
        field = getattr(type(o), name)
        if o.struct_size < field.offset + ctypes.sizeof(ctypes.c_void_p):
            raise L.UnsupportedError(
                f"flashkv: argument '{name}': needs a flashkv library with FP8 attention (the loaded one predates it)"
            )
        t = to_tensor(x, name)
        setattr(o, name, ctypes.pointer(t.c))
        keep.append(t)
    return keep


def _grads_like(tq: TensorArg, tk: TensorArg, tv: TensorArg) -> tuple[TensorArg, TensorArg, TensorArg]:
    """dq, dk, dv outputs shaped like q, k, v (same kind and dtype as q)."""
    return new_output(tq, tq.shape, "dq"), new_output(tq, tk.shape, "dk"), new_output(tq, tv.shape, "dv")


def _need_rank(t: TensorArg, ndim: int, layout: str) -> None:
    if len(t.shape) != ndim:
        raise ValueError(
            f"flashkv: argument '{t.name}': expected {ndim} dimensions {layout}, got {len(t.shape)} dimensions "
            f"{list(t.shape)}"
        )


def _with_stream(o: L.AttentionOptions, args: list[TensorArg]) -> L.AttentionOptions:
    stream = cuda_stream(args)
    if stream is not None:
        o.stream = stream
    return o


_INT32_MAX = 2**31 - 1


def _cu_seqlens(x: Any, name: str) -> TensorArg:
    """cu_seqlens as an int32 tensor view. int32 arrays/tensors are used as they are (no copy); other integer dtypes
    (numpy's default int64, uint32, ...) and Python sequences of ints are converted to a new int32 array/tensor after
    a bounds check (0..2**31 - 1), so the caller's object is never modified. Anything else is a TypeError naming the
    argument."""
    if x is None:
        raise TypeError(f"flashkv: argument '{name}': expected an int32 array or tensor [batch + 1], got None")
    dtype = getattr(x, "dtype", None)
    if dtype is not None and not isinstance(x, np.ndarray) and callable(getattr(x, "data_ptr", None)):  # torch
        tname = str(dtype)
        if tname == "torch.int32":
            return to_tensor(x, name)
        if tname not in ("torch.int64", "torch.int16", "torch.int8", "torch.uint8"):
            raise TypeError(f"flashkv: argument '{name}': expected an int32 (or integer) tensor, got {tname}")
        if x.numel() and (int(x.min()) < 0 or int(x.max()) > _INT32_MAX):
            raise ValueError(
                f"flashkv: argument '{name}': expected values in 0..{_INT32_MAX} (converted to int32), got "
                f"min {int(x.min())}, max {int(x.max())}"
            )
        return to_tensor(x.to(dtype=_torch_int32()), name)
    if not isinstance(x, np.ndarray):
        if hasattr(x, "__array_interface__") or hasattr(x, "__dlpack__"):
            return to_tensor(x, name)  # the adapter's own checks and messages
        try:
            x = np.asarray(x)
        except (TypeError, ValueError) as e:
            raise TypeError(f"flashkv: argument '{name}': expected an int32 array [batch + 1], got {type(x).__name__}") from e
    if x.dtype == np.int32:
        return to_tensor(x, name)
    if x.dtype.kind not in "iu":
        raise TypeError(
            f"flashkv: argument '{name}': expected an int32 (or integer, converted) array [batch + 1], got {x.dtype}"
        )
    if x.size and (int(x.min()) < 0 or int(x.max()) > _INT32_MAX):
        raise ValueError(
            f"flashkv: argument '{name}': expected values in 0..{_INT32_MAX} (converted to int32), got "
            f"min {int(x.min())}, max {int(x.max())}"
        )
    return to_tensor(np.ascontiguousarray(x, dtype=np.int32), name)


def _torch_int32() -> Any:
    import torch  # noqa: PLC0415

    return torch.int32


def _max_seqlen(cu: TensorArg, given: int | None, name: str) -> int:
    if given is not None:
        return _int_arg(given, name, 0, 2**63 - 1)
    if len(cu.shape) != 1 or cu.shape[0] < 2 or cu.device != "cpu":
        if cu.device != "cpu":
            raise ValueError(f"flashkv: argument '{name}': expected an int for device tensors, got None")
        return 0  # the library reports the malformed cu_seqlens
    c = cu.obj
    return max(0, int((c[1:] - c[:-1]).max()))


def attention(
    q: Any,
    k: Any,
    v: Any,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    softmax_scale: float | None = None,
    return_lse: bool = False,
    algorithm: str = "tiled",
    *,
    dtype: str | None = None,
    num_threads: int = 0,
    kernel: str = "auto",
    q_descale: Any = None,
    k_descale: Any = None,
    v_descale: Any = None,
) -> Any:
    """Fixed-length exact attention forward.

    Args:
        q, k, v: bshd arrays (see the module docstring); any strides, last dimension contiguous.
        causal: bottom-right aligned causal mask (same as window_size[1] = 0).
        window_size: (left, right) in tokens, -1 = unbounded.
        softcap: 0 = off; else score = softcap * tanh(score / softcap).
        softmax_scale: default 1 / sqrt(head_dim).
        return_lse: also return lse [batch, num_heads, seqlen_q] float32 (natural log).
        algorithm: "tiled" (FA2 order, default), "v1" (FA1 2022 loop order) or "naive" (materializes S and P).
        dtype: None, or "bfloat16" to read uint16 arrays as bfloat16 bit patterns (outputs are uint16 then).
        num_threads: CPU threads, 0 = OpenMP default.
        kernel: CUDA kernel family: "auto" (default: on Hopper where compiled sm90ws, the TMA warp-specialized
            forward, for fixed-length calls without softcap with seqlen_k >= 2048, head_dim 256, or head_dim 128
            without mask, else sm90; elsewhere sm80),
            "sm80", "sm90" or "sm90ws" (forward only); a family the GPU or build cannot run raises
            flashkv.UnsupportedError. CPU tensors take only "auto".
        q_descale, k_descale, v_descale: FP8 only (torch.float8_e4m3fn q/k/v on a Hopper GPU; module docstring):
            float32 tensors of shape () / (1,) / (batch, num_heads_kv), None = 1.
    Returns:
        out [batch, seqlen_q, num_heads, head_dim_v] of the same kind (numpy/torch) and dtype as q (bfloat16 for
        float8_e4m3fn q); (out, lse) if return_lse.
    """
    o, _, tq, tk, tv = _prepare(dtype, q, k, v, causal, window_size, softcap, softmax_scale, algorithm, num_threads)
    _set_kernel(o, kernel)
    _keep = _set_descales(o, {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale})
    _need_rank(tq, 4, "[batch, seqlen_q, num_heads, head_dim]")
    _need_rank(tv, 4, "[batch, seqlen_k, num_heads_kv, head_dim_v]")
    out = new_output(tq, tq.shape[:3] + tv.shape[3:], "out")
    lse = new_output(tq, (tq.shape[0], tq.shape[2], tq.shape[1]), "lse", float32=True) if return_lse else None
    _with_stream(o, [tq, tk, tv])
    L.check(
        L.lib().flashkv_attention_forward(
            tq.ptr, tk.ptr, tv.ptr, out.ptr, lse.ptr if lse is not None else None, ctypes.byref(o)
        )
    )
    return (out.obj, lse.obj) if return_lse else out.obj


def attention_backward(
    dout: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    softmax_scale: float | None = None,
    *,
    dtype: str | None = None,
    num_threads: int = 0,
    deterministic: bool = False,
    kernel: str = "auto",
) -> tuple[Any, Any, Any]:
    """Fixed-length backward (FA2 Alg. 2: recomputes P = exp(S * scale - lse) tile by tile).

    `out` and `lse` must come from `attention(..., return_lse=True)` with the same options. dout is like out.
    Returns (dq, dk, dv) shaped and typed like q, k, v (same kind as q). Gradients of rows that see no key are 0.
    deterministic: CUDA only (the CPU backward is always deterministic). False (default, as in FlashAttention):
    dq is summed with float32 atomics, so its last bits may differ run to run; True: dq is summed in a fixed order
    and every gradient is bit-identical run to run, at about half the speed. kernel: as in `attention`.
    """
    o, tdo, tq, tk, tv = _prepare(
        dtype, q, k, v, causal, window_size, softcap, softmax_scale, "tiled", num_threads, dout=dout,
        deterministic=deterministic,
    )
    _set_kernel(o, kernel)
    tout, tlse = to_tensor(out, "out", dtype), to_tensor(lse, "lse")
    dq, dk, dv = _grads_like(tq, tk, tv)
    _with_stream(o, [tq, tk, tv])
    L.check(
        L.lib().flashkv_attention_backward(
            tq.ptr, tk.ptr, tv.ptr, tout.ptr, tlse.ptr, tdo.ptr, dq.ptr, dk.ptr, dv.ptr, ctypes.byref(o)
        )
    )
    return dq.obj, dk.obj, dv.obj


def attention_varlen(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    softmax_scale: float | None = None,
    return_lse: bool = False,
    algorithm: str = "tiled",
    *,
    dtype: str | None = None,
    num_threads: int = 0,
    kernel: str = "auto",
    q_descale: Any = None,
    k_descale: Any = None,
    v_descale: Any = None,
) -> Any:
    """Varlen (packed) forward: sequence b is q[cu_seqlens_q[b]:cu_seqlens_q[b+1]] against the matching k/v rows.

    q [total_q, num_heads, head_dim], k/v [total_k, num_heads_kv, head_dim(_v)], cu_seqlens_q/k int32 [batch + 1]
    (0 first, non-decreasing, last = total; other integer dtypes such as numpy's default int64, and lists of ints,
    are converted to int32 after a bounds check). max_seqlen_q/k default to the longest sequence (computed from CPU
    cu_seqlens; required for device tensors). Returns out [total_q, num_heads, head_dim_v] (and lse
    [num_heads, total_q] float32 if return_lse). Mask and options (kernel, FP8 descales of shape (batch,
    num_heads_kv) with batch = len(cu_seqlens_q) - 1, too) as in `attention`, per sequence.
    """
    o, _, tq, tk, tv = _prepare(dtype, q, k, v, causal, window_size, softcap, softmax_scale, algorithm, num_threads)
    _set_kernel(o, kernel)
    _keep = _set_descales(o, {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale})
    tcq, tck = _cu_seqlens(cu_seqlens_q, "cu_seqlens_q"), _cu_seqlens(cu_seqlens_k, "cu_seqlens_k")
    _need_rank(tq, 3, "[total_q, num_heads, head_dim]")
    _need_rank(tv, 3, "[total_k, num_heads_kv, head_dim_v]")
    mq, mk = _max_seqlen(tcq, max_seqlen_q, "max_seqlen_q"), _max_seqlen(tck, max_seqlen_k, "max_seqlen_k")
    out = new_output(tq, tq.shape[:2] + tv.shape[2:], "out")
    lse = new_output(tq, (tq.shape[1], tq.shape[0]), "lse", float32=True) if return_lse else None
    _with_stream(o, [tq, tk, tv])
    L.check(
        L.lib().flashkv_attention_varlen_forward(
            tq.ptr, tk.ptr, tv.ptr, tcq.ptr, tck.ptr, mq, mk, out.ptr, lse.ptr if lse is not None else None,
            ctypes.byref(o),
        )
    )
    return (out.obj, lse.obj) if return_lse else out.obj


def attention_varlen_backward(
    dout: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    softmax_scale: float | None = None,
    *,
    dtype: str | None = None,
    num_threads: int = 0,
    deterministic: bool = False,
    kernel: str = "auto",
) -> tuple[Any, Any, Any]:
    """Varlen backward; lse is [num_heads, total_q] from `attention_varlen(..., return_lse=True)`.

    Returns (dq, dk, dv) shaped and typed like q, k, v. deterministic, kernel: as in `attention_backward`.
    """
    o, tdo, tq, tk, tv = _prepare(
        dtype, q, k, v, causal, window_size, softcap, softmax_scale, "tiled", num_threads, dout=dout,
        deterministic=deterministic,
    )
    _set_kernel(o, kernel)
    tout, tlse = to_tensor(out, "out", dtype), to_tensor(lse, "lse")
    tcq, tck = _cu_seqlens(cu_seqlens_q, "cu_seqlens_q"), _cu_seqlens(cu_seqlens_k, "cu_seqlens_k")
    mq, mk = _max_seqlen(tcq, max_seqlen_q, "max_seqlen_q"), _max_seqlen(tck, max_seqlen_k, "max_seqlen_k")
    dq, dk, dv = _grads_like(tq, tk, tv)
    _with_stream(o, [tq, tk, tv])
    L.check(
        L.lib().flashkv_attention_varlen_backward(
            tq.ptr, tk.ptr, tv.ptr, tcq.ptr, tck.ptr, mq, mk, tout.ptr, tlse.ptr, tdo.ptr, dq.ptr, dk.ptr, dv.ptr,
            ctypes.byref(o),
        )
    )
    return dq.obj, dk.obj, dv.obj


__all__ = ["attention", "attention_backward", "attention_varlen", "attention_varlen_backward"]
