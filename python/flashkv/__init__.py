"""flashkv — exact IO-aware attention (FlashAttention algorithm) and quantized KV caches, over the flashkv C ABI.

Pure Python (ctypes) over libflashkv.so; see flashkv/_library.py for how the library is found and docs/python.md.
Accepts numpy arrays (and objects with __array_interface__ / CPU __dlpack__) and torch tensors (duck-typed).
"""
from ._library import CapacityError, UnsupportedError, library_path
from ._attention import attention, attention_backward, attention_varlen, attention_varlen_backward
from ._decode import paged_decode  # split-KV paged decode on CUDA (flashkv_cuda_decode; python/flashkv/_decode.py)
from .kvcache import KVCache, kv_memory_estimate  # noqa: F401  (quantized paged KV cache; python/flashkv/kvcache.py)
from .engine import Engine, EngineEvent  # noqa: F401  (generation engine; python/flashkv/engine.py)

__version__ = "0.1.0"  # kept equal to project(flashkv VERSION ...) in CMakeLists.txt (checked by tests/python)


def library_version() -> str:
    """Version string of the loaded libflashkv.so (flashkv_version())."""
    from ._library import lib

    return lib().flashkv_version().decode()


def last_kernel_path() -> str:
    """The kernel family / code path this thread's last flashkv call took, e.g.
    ``"attention_forward cuda sm90 fwd hdim128 bfloat16 causal"`` ("" before the first call). Setting the
    environment variable ``FLASHKV_LOG=1`` also prints one such line per call to stderr (flashkv/diagnostics.hpp)."""
    from ._library import lib

    return lib().flashkv_last_kernel_path().decode()


__all__ = [
    "__version__",
    "attention",
    "attention_backward",
    "attention_varlen",
    "attention_varlen_backward",
    "paged_decode",
    "KVCache",
    "kv_memory_estimate",
    "Engine",
    "EngineEvent",
    "library_path",
    "library_version",
    "last_kernel_path",
    "UnsupportedError",
    "CapacityError",
]
