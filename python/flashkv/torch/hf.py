"""Hugging Face transformers integration: the attention function "flashkv".

After ``import flashkv.torch`` (registration happens as soon as transformers is imported too, in either order):

    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="flashkv")   # or model.set_attn_implementation

The function follows transformers' attention-function contract (transformers.AttentionInterface, v5):
``flashkv_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
softcap=None, is_causal=None, **kwargs) -> (attn_output, None)`` with query [batch, num_heads, seqlen_q, head_dim],
key/value [batch, num_heads_kv, seqlen_k, head_dim] (transformers' layout; viewed as bshd without copies) and
attn_output [batch, seqlen_q, num_heads, head_dim]. Its mask function is transformers' flash-attention one: the model
passes a 2D padding mask [batch, seqlen_k] (True = real token) or None.

    * No padding: flashkv.torch.flash_attn_func (differentiable; causal bottom-right aligned as transformers' FA2).
    * 2D padding mask: the real tokens are packed and flashkv's varlen attention runs (the packing reads the mask on
      the host once per forward pass, as transformers' FA2 path does); padded query rows get out = 0.
    * Packed sequences without a mask (batch 1): the varlen kwargs cu_seq_lens_q/k + max_length_q/k
      (DataCollatorWithFlattening) or, failing those, position_ids that restart at 0 define the sequences.
    * Keys from flashkv.torch.PagedCache: the new tokens are appended to the paged (quantized) cache and attention is
      computed from the packed pages (flashkv/torch/cache.py).
    * sliding_window W: window_size = (W - 1, W - 1), i.e. (W - 1, 0) when causal; softcap as given; scaling is
      softmax_scale.

Errors (flashkv.UnsupportedError naming the argument): dropout > 0 (model.train() with attention_dropout > 0),
attention sinks (s_aux), 4D / float masks (a custom mask the flash-attention path cannot express).
"""
from __future__ import annotations

import weakref
from typing import Any, Optional

import torch

from .._library import UnsupportedError
from . import _ops

_ATTN_NAME = "flashkv"


def _window(sliding_window: Optional[int], causal: bool) -> tuple[int, int]:
    if sliding_window is None:
        return -1, -1
    w = int(sliding_window)
    return w - 1, (0 if causal else w - 1)


class _Memo:
    """One value derived from a tensor, computed once per forward pass: transformers hands the same mask /
    position_ids object to every layer, so the host synchronization this costs happens once, not once per layer."""

    def __init__(self, fn):
        self._fn = fn
        self._ref: Optional[weakref.ref] = None
        self._key: Any = None
        self._value: Any = None

    def get(self, t: torch.Tensor, key: Any = None):
        if self._ref is not None and self._ref() is t and self._key == key:
            return self._value
        value = self._fn(t, key)
        self._ref, self._key, self._value = weakref.ref(t), key, value
        return value


def _unpad_plan(mask: torch.Tensor, q_len: int):
    """(idx_q, idx_k, cu_q, cu_k, max_q, max_k) for a [batch, seqlen_k] mask whose last q_len columns are the queries."""
    mask = mask.to(torch.bool)
    mq = mask[:, -q_len:]
    lens_k = mask.sum(dim=1, dtype=torch.int32)
    lens_q = mq.sum(dim=1, dtype=torch.int32)
    idx_k = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
    idx_q = torch.nonzero(mq.flatten(), as_tuple=False).flatten()
    cu_k = torch.nn.functional.pad(torch.cumsum(lens_k, 0, dtype=torch.int32), (1, 0))
    cu_q = torch.nn.functional.pad(torch.cumsum(lens_q, 0, dtype=torch.int32), (1, 0))
    max_k, max_q, min_k, min_q = (int(x) for x in torch.stack([lens_k.max(), lens_q.max(), lens_k.min(),
                                                                 lens_q.min()]).tolist())
    if min_k == mask.shape[1] and min_q == q_len:
        return None  # no padding: the dense call (no gathers / scatters)
    return idx_q, idx_k, cu_q, cu_k, max_q, max_k


def _packed_plan(position_ids: torch.Tensor, _key: Any):
    """(cu_seqlens, max_seqlen) for a [1, total] position_ids that restarts at 0 for each packed sequence, or None."""
    pos = position_ids.flatten()
    starts = torch.nonzero(pos == 0, as_tuple=False).flatten().tolist()
    if len(starts) <= 1 or starts[0] != 0:
        return None
    bounds = starts + [pos.numel()]
    cu = torch.tensor(bounds, dtype=torch.int32, device=pos.device)
    return cu, max(b - a for a, b in zip(bounds[:-1], bounds[1:]))


_MASK_MEMO = _Memo(_unpad_plan)
_POS_MEMO = _Memo(_packed_plan)


def flashkv_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    sliding_window: Optional[int] = None,
    softcap: Optional[float] = None,
    is_causal: Optional[bool] = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function (see the module docstring)."""
    if dropout:
        raise UnsupportedError(f"flashkv: argument 'dropout': attention dropout is not supported (expected 0.0, got "
                               f"{dropout}; set the model's attention_dropout to 0 or use model.eval())")
    if kwargs.get("s_aux") is not None:
        raise UnsupportedError("flashkv: argument 's_aux': attention sinks (s_aux) are not supported (expected None)")
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    left, right = _window(sliding_window, causal)
    cap = float(softcap) if softcap else 0.0
    scale = float(scaling) if scaling is not None else None
    if attention_mask is not None and (attention_mask.dim() != 2 or attention_mask.dtype.is_floating_point):
        raise UnsupportedError(f"flashkv: argument 'attention_mask': expected a 2D padding mask [batch, seqlen_k] or "
                               f"None (the flash-attention mask), got a {attention_mask.dim()}D {attention_mask.dtype} "
                               "mask")
    paged = getattr(key, "_flashkv_paged", None)
    if paged is not None:
        out = paged.attend(query, key, value, attention_mask, scale, causal, left, cap)
        return out, None

    b, h, sq, d = query.shape
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # bshd views, no copies
    unpad = _MASK_MEMO.get(attention_mask, sq) if attention_mask is not None else None
    if unpad is None:  # no mask, or a mask without padding (one host read per new mask, shared by the layers)
        cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
        max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
        plan = None
        if all(x is not None for x in (cu_q, cu_k, max_q, max_k)):
            plan = (cu_q.to(torch.int32), cu_k.to(torch.int32), int(max_q), int(max_k))
        elif b == 1 and kwargs.get("position_ids") is not None and sq == k.shape[1] and sq > 1:
            packed = _POS_MEMO.get(kwargs["position_ids"])
            if packed is not None:
                plan = (packed[0], packed[0], packed[1], packed[1])
        if plan is None:
            out, _ = _ops.fwd(_c(q), _c(k), _c(v), scale, causal, left, right, cap, False)
            return out, None
        cu_q, cu_k, max_q, max_k = plan
        out, _ = _ops.varlen_fwd(q.reshape(-1, h, d), k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:]),
                                 cu_q, cu_k, max_q, max_k, scale, causal, left, right, cap, False)
        return out.view(b, sq, h, -1), None

    idx_q, idx_k, cu_q, cu_k, max_q, max_k = unpad
    qu = q.reshape(b * sq, h, d).index_select(0, idx_q)
    ku = k.reshape(-1, *k.shape[2:]).index_select(0, idx_k)
    vu = v.reshape(-1, *v.shape[2:]).index_select(0, idx_k)
    out_u, _ = _ops.varlen_fwd(qu, ku, vu, cu_q, cu_k, max_q, max_k, scale, causal, left, right, cap, False)
    out = out_u.new_zeros((b * sq, h, out_u.shape[-1])).index_copy(0, idx_q, out_u)
    return out.view(b, sq, h, -1), None


def _c(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def register() -> None:
    """Registers "flashkv" with transformers.AttentionInterface and AttentionMaskInterface (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(_ATTN_NAME, flashkv_attention_forward)
    AttentionMaskInterface.register(_ATTN_NAME, flash_attention_mask)
    _teach_flash_loader()


def _teach_flash_loader() -> None:
    """transformers treats every implementation name containing "flash" as a flash-attention build and preloads its
    functions (modeling_flash_attention_utils._lazy_imports), which for an unknown name means a hub kernel and fails.
    Answer that lookup for "flashkv" (and "paged|flashkv") with flashkv's flash-attn-compatible functions."""
    import transformers.modeling_flash_attention_utils as fau

    orig = getattr(fau, "_lazy_imports", None)
    split = getattr(fau, "split_attention_implementation", None)
    if orig is None or split is None:
        raise ImportError(
            f"flashkv.torch: this transformers version ({__import__('transformers').__version__}) has no "
            "modeling_flash_attention_utils._lazy_imports / split_attention_implementation; the 'flashkv' attention "
            "needs transformers 5.x (tested with 5.17)")
    if getattr(orig, "_flashkv", False):
        return
    from .flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

    def _lazy_imports(implementation, *args, **kwargs):
        if implementation is not None and split(implementation)[1] == _ATTN_NAME:
            return flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache, fau._pad_input, fau._unpad_input
        return orig(implementation, *args, **kwargs)

    _lazy_imports._flashkv = True
    fau._lazy_imports = _lazy_imports


__all__ = ["flashkv_attention_forward", "register"]
