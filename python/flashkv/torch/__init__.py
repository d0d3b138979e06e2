"""flashkv for PyTorch: autograd + torch.compile custom operators, flash-attn-compatible functions, and the
Hugging Face transformers integration (attention function "flashkv" and the PagedCache KV cache).

    import flashkv.torch
    out = flashkv.torch.flash_attn_func(q, k, v, causal=True)      # flash_attn's signature; loss.backward() works
    out, lse = flashkv.torch.attention(q, k, v, causal=True, return_lse=True)

    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="flashkv")
    model.generate(ids, past_key_values=flashkv.torch.PagedCache(model.config, kv_cache_dtype="int4"))

Operators: torch.ops.flashkv.{fwd, bwd, varlen_fwd, varlen_bwd, paged_decode, kv_append} (flashkv/torch/_ops.py,
with fake implementations for torch.compile / torch.export). flash-attn API: flashkv/torch/flash_attn.py. transformers:
flashkv/torch/hf.py (registered as soon as transformers is imported, in either import order) and
flashkv/torch/cache.py. Context-parallel (ring) attention over torch.distributed: flashkv.torch.distributed.
See docs/python.md ("PyTorch").
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any, Optional, Sequence

import torch

from .. import __version__  # noqa: F401
from .._library import CapacityError, UnsupportedError  # noqa: F401
from . import _ops
from ._ops import kv_append  # noqa: F401
from .flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache  # noqa: F401

_MIN_TORCH = (2, 4)  # torch.library.custom_op / register_fake / register_autograd
if tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < _MIN_TORCH:
    raise ImportError(f"flashkv.torch needs torch >= {_MIN_TORCH[0]}.{_MIN_TORCH[1]} (torch.library.custom_op), "
                      f"found {torch.__version__}")


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    softmax_scale: Optional[float] = None,
    return_lse: bool = False,
    *,
    deterministic: bool = False,
) -> Any:
    """flashkv.attention with autograd (out is differentiable in q, k, v; lse carries no gradient) and
    torch.compile support. Arguments, shapes and errors as flashkv.attention (docs/python.md); deterministic as
    flashkv.attention_backward (CUDA dQ accumulation order)."""
    left, right = _pair(window_size)
    out, lse = _ops.fwd(q, k, v, softmax_scale, bool(causal), left, right, float(softcap), bool(deterministic))
    return (out, lse) if return_lse else out


def attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    softmax_scale: Optional[float] = None,
    return_lse: bool = False,
    *,
    deterministic: bool = False,
) -> Any:
    """flashkv.attention_varlen with autograd; max_seqlen_q/k are required ints (no host synchronization)."""
    left, right = _pair(window_size)
    out, lse = _ops.varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
                               softmax_scale, bool(causal), left, right, float(softcap), bool(deterministic))
    return (out, lse) if return_lse else out


def _pair(window_size: Sequence[int]) -> tuple[int, int]:
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError) as e:
        raise ValueError(f"flashkv: argument 'window_size': expected a pair (left, right) of ints (-1 = unbounded), "
                         f"got {window_size!r}") from e
    return left, right


# ---- transformers: register "flashkv" once transformers is imported (whichever is imported first) ----------------------

_HF_REGISTERED = False


def register_transformers() -> None:
    """Registers the attention function "flashkv" with transformers' AttentionInterface (and its mask function).
    Called automatically when both flashkv.torch and transformers are imported; idempotent."""
    global _HF_REGISTERED
    if not _HF_REGISTERED:
        from . import hf

        hf.register()
        _HF_REGISTERED = True


class _TransformersHook(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs register_transformers() right after `transformers.modeling_utils` finishes loading."""

    _target = "transformers.modeling_utils"

    def find_spec(self, fullname, path, target=None):
        if fullname != self._target:
            return None
        sys.meta_path.remove(self)  # find the real spec with the remaining finders
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
        register_transformers()


if "transformers.modeling_utils" in sys.modules:
    register_transformers()
elif not any(isinstance(f, _TransformersHook) for f in sys.meta_path):
    sys.meta_path.insert(0, _TransformersHook())


def __getattr__(name: str) -> Any:
    if name == "PagedCache":
        from .cache import PagedCache

        return PagedCache
    if name == "distributed":
        return importlib.import_module(__name__ + ".distributed")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "attention",
    "attention_varlen",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "kv_append",
    "PagedCache",
    "register_transformers",
    "UnsupportedError",
    "CapacityError",
]
