"""Loading libflashkv.so and calling the C ABI (include/flashkv/flashkv.h) through ctypes.

Search order for the shared library (first hit wins):
  1. the environment variable ``FLASHKV_LIBRARY`` (a file, or a directory containing ``libflashkv.so``);
  2. the package's own ``_native/`` directory (where ``pip install`` puts it);
  3. the source checkout's ``build/*/lib/libflashkv.so`` (newest first), for use straight from the repository.

Statuses map to Python exceptions carrying the library's message (``flashkv_last_error()``), which names the argument
with expected vs actual:

  FLASHKV_ERROR_INVALID_ARGUMENT -> ValueError          FLASHKV_ERROR_TYPE     -> TypeError
  FLASHKV_ERROR_UNSUPPORTED      -> UnsupportedError (NotImplementedError)
  FLASHKV_ERROR_CAPACITY         -> CapacityError (RuntimeError)
  FLASHKV_ERROR_IO               -> OSError             FLASHKV_ERROR_INTERNAL -> RuntimeError
"""
from __future__ import annotations

import ctypes
import glob
import os
import threading
from pathlib import Path
from typing import Callable

ABI_VERSION = 1  # FLASHKV_ABI_VERSION this package was written against
MAX_DIMS = 8  # FLASHKV_MAX_DIMS

# flashkv_status
OK, INVALID_ARGUMENT, TYPE, UNSUPPORTED, CAPACITY, IO, INTERNAL = range(7)
# flashkv_dtype
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2, "int32": 3, "float64": 4, "uint8": 5, "float8_e4m3fn": 6}
# flashkv_device
DEVICE_CPU, DEVICE_CUDA = 0, 1
# flashkv_algorithm
ALGORITHMS = {"tiled": 0, "v1": 1, "naive": 2}
KERNEL_FAMILIES = {"auto": 0, "sm80": 1, "sm90": 2, "sm90ws": 3}


class UnsupportedError(NotImplementedError):
    """A valid request that this build or machine cannot run (FLASHKV_ERROR_UNSUPPORTED)."""


class CapacityError(RuntimeError):
    """A cache or buffer is full; nothing was modified (FLASHKV_ERROR_CAPACITY)."""


_EXCEPTIONS = {
    INVALID_ARGUMENT: ValueError,
    TYPE: TypeError,
    UNSUPPORTED: UnsupportedError,
    CAPACITY: CapacityError,
    IO: OSError,
    INTERNAL: RuntimeError,
}


class Tensor(ctypes.Structure):
    """flashkv_tensor: non-owning strided view; shape and strides in elements."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("device", ctypes.c_int32),
        ("device_index", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("strides", ctypes.c_int64 * MAX_DIMS),
    ]


class AttentionOptions(ctypes.Structure):
    """flashkv_attention_options (struct_size-prefixed; filled by flashkv_attention_options_default)."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("has_softmax_scale", ctypes.c_int32),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("window_size_left", ctypes.c_int32),
        ("window_size_right", ctypes.c_int32),
        ("softcap", ctypes.c_float),
        ("algorithm", ctypes.c_int32),
        ("deterministic", ctypes.c_int32),
        ("num_threads", ctypes.c_int32),
        ("stream", ctypes.c_void_p),
        ("kernel_family", ctypes.c_int32),
        # FP8 forward dequantization scales (NULL = 1)
        ("q_descale", ctypes.POINTER(Tensor)),
        ("k_descale", ctypes.POINTER(Tensor)),
        ("v_descale", ctypes.POINTER(Tensor)),
    ]


class DecodeOptions(ctypes.Structure):
    """flashkv_decode_options (include/flashkv/flashkv_cuda.h; filled by flashkv_decode_options_default)."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("has_softmax_scale", ctypes.c_int32),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("softcap", ctypes.c_float),
        ("num_splits", ctypes.c_int32),
        ("max_seqlen_k", ctypes.c_int64),
        ("stream", ctypes.c_void_p),
        ("window_size_left", ctypes.c_int32),
        ("num_threads", ctypes.c_int32),
    ]


def _candidates() -> list[Path]:
    out: list[Path] = []
    env = os.environ.get("FLASHKV_LIBRARY")
    if env:
        p = Path(env)
        out.append(p / "libflashkv.so" if p.is_dir() else p)
        return out  # an explicit choice is never silently replaced by another library
    here = Path(__file__).resolve().parent
    out += sorted((here / "_native").glob("libflashkv.so*"))
    repo = here.parent.parent
    builds = [Path(p) for p in glob.glob(str(repo / "build" / "*" / "lib" / "libflashkv.so"))]
    out += sorted(builds, key=lambda p: p.stat().st_mtime, reverse=True)
    return out


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


def _declare(lib: ctypes.CDLL) -> None:
    T = ctypes.POINTER(Tensor)
    O = ctypes.POINTER(AttentionOptions)
    i64 = ctypes.c_int64
    sigs = {
        "flashkv_version": ([], ctypes.c_char_p),
        "flashkv_abi_version": ([], ctypes.c_int32),
        "flashkv_last_error": ([], ctypes.c_char_p),
        "flashkv_last_kernel_path": ([], ctypes.c_char_p),
        "flashkv_attention_options_default": ([O], ctypes.c_int),
        "flashkv_attention_forward": ([T, T, T, T, T, O], ctypes.c_int),
        "flashkv_attention_backward": ([T, T, T, T, T, T, T, T, T, O], ctypes.c_int),
        "flashkv_attention_varlen_forward": ([T, T, T, T, T, i64, i64, T, T, O], ctypes.c_int),
        "flashkv_attention_varlen_backward": ([T, T, T, T, T, i64, i64, T, T, T, T, T, T, O], ctypes.c_int),
    }
    for name, (args, res) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = res
    # CUDA-only entry points (flashkv_cuda.h): exported by every build (a build without CUDA answers
    # FLASHKV_ERROR_UNSUPPORTED); declared only when present so that an older library still loads.
    DO = ctypes.POINTER(DecodeOptions)
    optional = {
        "flashkv_decode_options_default": ([DO], ctypes.c_int),
        "flashkv_cuda_decode": ([T, T, T, T, T, T, T, T, T, DO], ctypes.c_int),
    }
    for name, (args, res) in optional.items():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.argtypes = args
            fn.restype = res


def lib() -> ctypes.CDLL:
    """The loaded libflashkv.so (loaded on first use; OSError listing the searched paths if none is found)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            tried = []
            for path in _candidates():
                if not path.is_file():
                    tried.append(f"{path} (missing)")
                    continue
                handle = ctypes.CDLL(str(path))
                _declare(handle)
                abi = handle.flashkv_abi_version()
                if abi != ABI_VERSION:
                    raise OSError(f"flashkv: {path} has C ABI version {abi}, this package needs {ABI_VERSION}")
                _lib = handle
                break
            else:
                raise OSError(
                    "flashkv: cannot find libflashkv.so; set FLASHKV_LIBRARY, `pip install .` from the repository, "
                    "or build it (cmake --preset cpu && cmake --build --preset cpu --target flashkv). Tried: "
                    + ("; ".join(tried) if tried else "nothing")
                )
    return _lib


_declared_groups: set[str] = set()


def declared(group: str, signatures: Callable[[], dict[str, list]], older_than: str | None = None) -> ctypes.CDLL:
    """lib() with the entry points of one C header declared, once per `group`: signatures() maps each name to its
    argtypes; every restype is int (a flashkv_status). A name the library lacks raises UnsupportedError ("a library
    older than `older_than`; rebuild it ...") where `older_than` is given, else AttributeError (from ctypes)."""
    handle = lib()
    if group not in _declared_groups:
        for name, args in signatures().items():
            fn = getattr(handle, name, None) if older_than is not None else getattr(handle, name)
            if fn is None:
                raise UnsupportedError(f"flashkv: {library_path()} has no {name} (a library older than {older_than}); "
                                       "rebuild it or point FLASHKV_LIBRARY at a newer one")
            fn.argtypes = args
            fn.restype = ctypes.c_int
        _declared_groups.add(group)
    return handle


def library_path() -> str:
    """Path of the loaded libflashkv.so."""
    return lib()._name


def check(status: int) -> None:
    """Raises the Python exception for a non-OK flashkv_status, with flashkv_last_error() as the message."""
    if status == OK:
        return
    msg = lib().flashkv_last_error().decode("utf-8", "replace")
    raise _EXCEPTIONS.get(status, RuntimeError)(msg or f"flashkv: status {status}")


def default_options() -> AttentionOptions:
    o = AttentionOptions()
    check(lib().flashkv_attention_options_default(ctypes.byref(o)))
    return o
