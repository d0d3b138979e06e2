"""Quantized paged KV cache (flashkv_kvcache.h over include/flashkv/kvcache.hpp) for numpy arrays and torch tensors,
in host memory or on a CUDA device.

    import numpy as np, flashkv
    cache = flashkv.KVCache(num_layers=32, num_heads_kv=8, head_dim=128, kv_cache_dtype="int4")
    cache.add_sequence(0)
    cache.append(0, layer, k, v)                 # k, v [n_tokens, num_heads_kv, head_dim] float32/float16/bfloat16
    out, lse = cache.attention([0], q, layer)    # q [n_q, num_heads, head_dim]; out like q, lse [num_heads, n_q]
    cache.memory_report()                        # dict of exact byte counts (codes/metadata/residual/slack/...)

Capacity: by default (capacity_pages = capacity_bytes = 0) the page pool starts small and grows as appends need pages;
pass capacity_pages or capacity_bytes for a fixed pool (then an append that does not fit raises flashkv.CapacityError
and changes nothing). device="cuda" (or "cuda:N") keeps the pages on the GPU (same layout; attention there takes torch
CUDA tensors; bf16 / fp16, fp8 and int8 / int4 caches without windows or rotation append torch CUDA tensors and decode
on the GPU, KIVI / windows / rotation after cache.to("cpu")); cache.to(device) copies a cache between host and device.

kv_cache_dtype strings: "fp32", "bf16", "fp16", "fp8_e4m3" (= "fp8"), "fp8_e5m2", "fp8_e4m3_dynamic", "int8", "int4",
"int4_kivi", "int2_kivi", with an optional group suffix "_gN" and the explicit form "k:int8,v:int4". Errors: ValueError
(bad argument, naming it), TypeError (dtype), flashkv.CapacityError (pool full; the cache is unchanged).
Sources: KIVI (arXiv 2402.02750) for the *_kivi formats, QuaRot (arXiv 2404.00456) for rotation="hadamard",
flash-decoding for the split-KV attention.
"""
from __future__ import annotations

import ctypes
from typing import Any, Sequence

import numpy as np

from . import _library as L
from ._attention import _bool_arg, _float_arg, _int_arg
from ._handle import OwnedHandle
from ._tensor import new_output, to_tensor

_INT64_MAX = 2**63 - 1


# The KV format's fields, in this order, in flashkv_kv_cache_config and in flashkv_engine_options (engine.py).
_KV_FORMAT_FIELDS = [
    ("kv_cache_dtype", ctypes.c_char_p),
    ("page_size", ctypes.c_int32),
    ("residual_tokens", ctypes.c_int32),
    ("sink_tokens", ctypes.c_int32),
    ("rotation", ctypes.c_int32),
    ("rotation_seed", ctypes.c_uint64),
]


class _Config(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("num_layers", ctypes.c_int32),
        ("num_heads_kv", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
    ] + _KV_FORMAT_FIELDS + [
        ("k_scales", ctypes.POINTER(ctypes.c_float)),
        ("num_k_scales", ctypes.c_int32),
        ("v_scales", ctypes.POINTER(ctypes.c_float)),
        ("num_v_scales", ctypes.c_int32),
        ("capacity_pages", ctypes.c_int64),
        ("capacity_bytes", ctypes.c_int64),
        ("device", ctypes.c_int32),
        ("device_index", ctypes.c_int32),
    ]


class _AttnOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("has_softmax_scale", ctypes.c_int32),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("window_size_left", ctypes.c_int32),
        ("softcap", ctypes.c_float),
        ("num_splits", ctypes.c_int32),
        ("num_threads", ctypes.c_int32),
    ]


_REPORT_FIELDS = [
    "num_sequences", "num_tokens", "token_layers", "page_bytes", "pages_total", "pages_used", "pages_free",
    "code_bytes", "metadata_bytes", "residual_bytes", "slack_bytes", "total_bytes", "pool_bytes",
]


class _Report(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32)] + [(f, ctypes.c_int64) for f in _REPORT_FIELDS] + [
        ("bits_per_element", ctypes.c_double),
        ("ratio_vs_bf16", ctypes.c_double),
    ]


def _signatures() -> dict[str, list]:
    T = ctypes.POINTER(L.Tensor)
    C = ctypes.POINTER(_Config)
    H = ctypes.c_void_p
    i32, i64 = ctypes.c_int32, ctypes.c_int64
    return {
        "flashkv_kv_cache_config_default": [C],
        "flashkv_kv_attention_options_default": [ctypes.POINTER(_AttnOptions)],
        "flashkv_kv_cache_create": [C, ctypes.POINTER(H)],
        "flashkv_kv_cache_free": [H],
        "flashkv_kv_cache_to": [H, i32, i32, ctypes.POINTER(H)],
        "flashkv_kv_cache_add_sequence": [H, i64],
        "flashkv_kv_cache_remove_sequence": [H, i64],
        "flashkv_kv_cache_seq_len": [H, i64, i32, ctypes.POINTER(i64)],
        "flashkv_kv_cache_append": [H, i64, i32, T, T],
        "flashkv_kv_cache_attention": [H, ctypes.POINTER(i64), i32, ctypes.POINTER(i32), i32, T, T, T,
                                       ctypes.POINTER(_AttnOptions)],
        "flashkv_kv_cache_memory_report": [H, ctypes.POINTER(_Report)],
        "flashkv_kv_cache_dequantize": [H, i64, i32, T, T],
        "flashkv_kv_memory_estimate": [C, i64, i64, ctypes.POINTER(_Report)],
    }


def _lib() -> ctypes.CDLL:
    """libflashkv with the KV cache C ABI (flashkv_kvcache.h) declared."""
    return L.declared("kvcache", _signatures)


def _device(device: Any) -> tuple[int, int]:
    """'cpu' | 'cuda' | 'cuda:N' (or a torch.device) -> (flashkv_device, index)."""
    text = str(device)
    if text == "cpu":
        return 0, 0
    if text == "cuda":
        return 1, 0
    if text.startswith("cuda:") and text[5:].isdigit():
        return 1, int(text[5:])
    raise ValueError(f"flashkv: argument 'device': expected 'cpu', 'cuda' or 'cuda:N', got {device!r}")


def _config(num_layers, num_heads_kv, head_dim, kv_cache_dtype, page_size, residual_tokens, sink_tokens, rotation,
            rotation_seed, k_scales, v_scales, capacity_pages, capacity_bytes, device="cpu") -> tuple[_Config, list]:
    lib = _lib()
    c = _Config()
    L.check(lib.flashkv_kv_cache_config_default(ctypes.byref(c)))
    keep: list = []
    for name, val in (("num_layers", num_layers), ("num_heads_kv", num_heads_kv), ("head_dim", head_dim),
                      ("page_size", page_size), ("residual_tokens", residual_tokens), ("sink_tokens", sink_tokens)):
        # the library names values out of its range; an int32 overflow must not wrap on the way there
        setattr(c, name, _int_arg(val, name, -(2**31)))
    if not isinstance(kv_cache_dtype, str):
        raise TypeError(f"flashkv: argument 'kv_cache_dtype': expected a str, got {type(kv_cache_dtype).__name__}")
    enc = kv_cache_dtype.encode()
    keep.append(enc)
    c.kv_cache_dtype = enc
    if rotation not in ("none", "hadamard"):
        raise ValueError(f"flashkv: argument 'rotation': expected 'none' or 'hadamard', got {rotation!r}")
    c.rotation = 1 if rotation == "hadamard" else 0
    c.rotation_seed = _int_arg(rotation_seed, "rotation_seed", 0, 2**64 - 1)
    for field, vals in (("k_scales", k_scales), ("v_scales", v_scales)):
        if vals is None:
            continue
        arr = np.ascontiguousarray(np.asarray(vals, dtype=np.float32).reshape(-1))
        keep.append(arr)
        setattr(c, field, arr.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
        setattr(c, "num_" + field, int(arr.size))
    c.capacity_pages = _int_arg(capacity_pages, "capacity_pages", -_INT64_MAX, _INT64_MAX)
    c.capacity_bytes = _int_arg(capacity_bytes, "capacity_bytes", -_INT64_MAX, _INT64_MAX)
    c.device, c.device_index = _device(device)
    return c, keep


def _seq_id(x: Any, name: str = "seq_id") -> int:
    return _int_arg(x, name, -(2**63), _INT64_MAX)


def _layer(x: Any) -> int:
    return _int_arg(x, "layer", -(2**31))  # the library names a layer out of 0..num_layers-1


def _report_dict(r: _Report) -> dict:
    d = {f: int(getattr(r, f)) for f in _REPORT_FIELDS}
    d["bits_per_element"] = float(r.bits_per_element)
    d["ratio_vs_bf16"] = float(r.ratio_vs_bf16)
    return d


def kv_memory_estimate(num_layers: int, num_heads_kv: int, head_dim: int, batch: int, tokens: int,
                       kv_cache_dtype: str = "bf16", page_size: int = 16, residual_tokens: int = 0,
                       sink_tokens: int = 0) -> dict:
    """The `flashkv kv-mem` formula: bytes of `batch` sequences of `tokens` tokens (dict as KVCache.memory_report)."""
    c, keep = _config(num_layers, num_heads_kv, head_dim, kv_cache_dtype, page_size, residual_tokens, sink_tokens,
                      "none", 0, None, None, 0, 0)
    r = _Report()
    r.struct_size = ctypes.sizeof(_Report)
    batch, tokens = _int_arg(batch, "batch", 0, _INT64_MAX), _int_arg(tokens, "tokens", 0, _INT64_MAX)
    L.check(_lib().flashkv_kv_memory_estimate(ctypes.byref(c), batch, tokens, ctypes.byref(r)))
    del keep
    return _report_dict(r)


class KVCache(OwnedHandle):
    """A quantized paged KV cache. See the module docstring and include/flashkv/kvcache.hpp for the semantics.

    num_layers, num_heads_kv, head_dim: the model's shape (required). kv_cache_dtype: the format grammar of the
    module docstring (default "bf16"). page_size: tokens per page (power of two, 16..256). residual_tokens /
    sink_tokens: most recent / first tokens kept bf16. rotation: "none" or "hadamard" (seeded by rotation_seed).
    k_scales / v_scales: static fp8 scales (1 value or num_heads_kv values). capacity_pages / capacity_bytes: a fixed
    pool (at most one of them); both 0 (default): the pool grows on demand. device: "cpu" (default), "cuda", "cuda:N".
    """

    def __init__(self, num_layers: int, num_heads_kv: int, head_dim: int, kv_cache_dtype: str = "bf16", *,
                 page_size: int = 16, residual_tokens: int = 0, sink_tokens: int = 0, rotation: str = "none",
                 rotation_seed: int = 0, k_scales: Sequence[float] | None = None,
                 v_scales: Sequence[float] | None = None, capacity_pages: int = 0, capacity_bytes: int = 0,
                 device: Any = "cpu"):
        self._h = None
        c, keep = _config(num_layers, num_heads_kv, head_dim, kv_cache_dtype, page_size, residual_tokens, sink_tokens,
                          rotation, rotation_seed, k_scales, v_scales, capacity_pages, capacity_bytes, device)
        h = ctypes.c_void_p()
        L.check(_lib().flashkv_kv_cache_create(ctypes.byref(c), ctypes.byref(h)))
        del keep
        self._h = h
        self.num_layers, self.num_heads_kv, self.head_dim = int(num_layers), int(num_heads_kv), int(head_dim)
        self.kv_cache_dtype = kv_cache_dtype
        self.device = "cpu" if c.device == 0 else f"cuda:{c.device_index}"

    def to(self, device: Any) -> "KVCache":
        """A copy of this cache (sequences, pages, windows: the same bytes) in the memory of `device`."""
        dev, index = _device(device)
        h = ctypes.c_void_p()
        L.check(_lib().flashkv_kv_cache_to(self._handle(), dev, index, ctypes.byref(h)))
        other = KVCache.__new__(KVCache)
        other._h = h
        other.num_layers, other.num_heads_kv, other.head_dim = self.num_layers, self.num_heads_kv, self.head_dim
        other.kv_cache_dtype = self.kv_cache_dtype
        other.device = "cpu" if dev == 0 else f"cuda:{index}"
        return other

    # ---- lifetime (close / with / destructor: _handle.OwnedHandle) -------------------------------------------------
    _kind = "KVCache"

    def _free(self, h: ctypes.c_void_p) -> None:
        _lib().flashkv_kv_cache_free(h)

    def close(self) -> None:
        """Frees the cache (idempotent); also called by the destructor and `with`."""
        super().close()

    def add_sequence(self, seq_id: int) -> None:
        """Registers sequence `seq_id` (any int64; its bf16 sink / residual buffers are allocated here)."""
        L.check(_lib().flashkv_kv_cache_add_sequence(self._handle(), _seq_id(seq_id)))

    def remove_sequence(self, seq_id: int) -> None:
        """Frees the sequence's pages and buffers (page contents are overwritten, never read again)."""
        L.check(_lib().flashkv_kv_cache_remove_sequence(self._handle(), _seq_id(seq_id)))

    def seq_len(self, seq_id: int, layer: int = 0) -> int:
        """Tokens cached for (seq_id, layer)."""
        n = ctypes.c_int64()
        L.check(_lib().flashkv_kv_cache_seq_len(self._handle(), _seq_id(seq_id), _layer(layer), ctypes.byref(n)))
        return int(n.value)

    def append(self, seq_id: int, layer: int, k: Any, v: Any, dtype: str | None = None) -> None:
        """Quantize-on-write append of k, v [n_tokens, num_heads_kv, head_dim] float32 / float16 / bfloat16 (numpy or
        torch; dtype='bfloat16' marks uint16 arrays as bfloat16 bits). Host arrays work for every cache (quantized on
        the host, then copied for a CUDA cache); a CUDA cache without sinks, residual window, KIVI keys or rotation also
        takes torch CUDA tensors on its device (a bf16 / fp16 cache: its own dtype; other formats: float32 / float16 /
        bfloat16, quantized on the device with the CPU codec's codes), written by a kernel on the default stream.
        A fixed pool without room raises flashkv.CapacityError and changes nothing."""
        kt, vt = to_tensor(k, "k", dtype), to_tensor(v, "v", dtype)
        L.check(_lib().flashkv_kv_cache_append(self._handle(), _seq_id(seq_id), _layer(layer), kt.ptr, vt.ptr))

    def attention(self, seq_ids: Sequence[int], q: Any, layer: int, *, q_lens: Sequence[int] | None = None,
                  causal: bool = True, window_size_left: int = -1, softcap: float = 0.0,
                  softmax_scale: float | None = None, num_splits: int = 0, num_threads: int = 0,
                  dtype: str | None = None) -> tuple[Any, Any]:
        """Attention of q [total_q, num_heads, head_dim] against the cache of `layer` for the sequences `seq_ids`
        (q_lens query tokens each; default one per sequence, i.e. decode; causal is bottom-right aligned). Returns
        (out like q, lse [num_heads, total_q] float32, natural log; -inf for a row without keys, whose out is 0).
        q lives on the cache's device (a torch CUDA tensor for a CUDA cache; the CUDA decode is queued on the default
        CUDA stream, torch's current stream unless you switched it). num_splits: 0 = auto, else 1..1024; num_threads: CPU threads, 0 = all."""
        ids = np.ascontiguousarray(np.asarray([_seq_id(x, "seq_ids") for x in seq_ids], dtype=np.int64))
        if q_lens is None:
            lens = np.ones(ids.size, dtype=np.int64)
        else:
            lens = np.asarray([_int_arg(x, "q_lens", 0, 2**31 - 1) for x in q_lens], dtype=np.int64)
        if lens.size != ids.size:
            raise ValueError(f"flashkv: argument 'q_lens': expected {ids.size} values (one per sequence), "
                             f"got {lens.size}")
        if lens.sum() > 2**31 - 1:
            raise ValueError(f"flashkv: argument 'q_lens': expected a total below 2^31, got {int(lens.sum())}")
        cu = np.ascontiguousarray(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
        o = _AttnOptions()
        L.check(_lib().flashkv_kv_attention_options_default(ctypes.byref(o)))
        o.causal = 1 if _bool_arg(causal, "causal") else 0
        o.window_size_left = _int_arg(window_size_left, "window_size_left", -(2**31))
        o.softcap = _float_arg(softcap, "softcap", "a float")
        if softmax_scale is not None:
            o.has_softmax_scale, o.softmax_scale = 1, _float_arg(softmax_scale, "softmax_scale", "a float or None")
        o.num_splits = _int_arg(num_splits, "num_splits", 0, 1024)
        o.num_threads = _int_arg(num_threads, "num_threads", 0)
        qt = to_tensor(q, "q", dtype)
        if len(qt.shape) != 3:
            raise ValueError(f"flashkv: argument 'q': expected 3 dimensions [total_q, num_heads, head_dim], "
                             f"got shape {qt.shape}")
        out = new_output(qt, qt.shape, "out")
        lse = new_output(qt, (qt.shape[1], qt.shape[0]), "lse", float32=True)
        L.check(_lib().flashkv_kv_cache_attention(
            self._handle(), ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)), int(ids.size),
            cu.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), _layer(layer), qt.ptr, out.ptr, lse.ptr,
            ctypes.byref(o)))
        return out.obj, lse.obj

    def memory_report(self) -> dict:
        """Exact byte accounting: codes, metadata, residual (bf16 sinks + ring), slack, total, pages, bits/element."""
        r = _Report()
        r.struct_size = ctypes.sizeof(_Report)
        L.check(_lib().flashkv_kv_cache_memory_report(self._handle(), ctypes.byref(r)))
        return _report_dict(r)

    def dequantize(self, seq_id: int, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """(k, v) float32 [seq_len, num_heads_kv, head_dim] as stored (original basis), for tests and analysis."""
        n = self.seq_len(seq_id, layer)
        k = np.empty((n, self.num_heads_kv, self.head_dim), dtype=np.float32)
        v = np.empty_like(k)
        kt, vt = to_tensor(k, "k_out"), to_tensor(v, "v_out")
        L.check(_lib().flashkv_kv_cache_dequantize(self._handle(), _seq_id(seq_id), _layer(layer), kt.ptr, vt.ptr))
        return k, v


__all__ = ["KVCache", "kv_memory_estimate"]
