"""PagedCache: a transformers Cache backed by flashkv's paged KV cache, attended straight from the pages.

    cache = flashkv.torch.PagedCache(model.config, kv_cache_dtype="int4", max_cache_len=4096, residual_tokens=128)
    model.generate(input_ids, attention_mask=mask, past_key_values=cache, max_new_tokens=256)
    cache.memory_report()                           # exact bytes (codes / metadata / residual / slack)

The role transformers' QuantizedCache plays, except that with attn_implementation="flashkv" the keys and values are
never dequantized into a dense tensor: each layer's new tokens are quantized when written (quantize-on-write) and the
attention reads the packed pages (flash-decoding split-KV on the pages, flashkv/kvcache).

Backends, chosen by the device of the model's key states at the first update:
    * CPU tensors: flashkv.KVCache (the C++ paged cache): every kv_cache_dtype ("bf16", "fp16", "fp32", "fp8_e4m3",
      "fp8_e5m2", "int8", "int4", "int4_kivi", "int2_kivi", "_gN" group suffixes, "k:int8,v:int4" ...), residual
      window (residual_tokens most recent tokens kept bf16), attention sinks (sink_tokens), Hadamard rotation.
    * CUDA tensors (or backend="pages"): pages of torch tensors [num_pages, page_size, num_heads_kv, head_dim] per layer, attended by
      flashkv's CUDA split-KV paged decode (torch.ops.flashkv.paged_decode, with the append fused in), for
      kv_cache_dtype "bf16"/"fp16" (the model's dtype). Quantized formats on CUDA raise flashkv.UnsupportedError
      until the KV cache has a CUDA backend.

Sizing (the pool is allocated once, at the first update): capacity_pages or capacity_bytes, else max_cache_len tokens
per sequence x the batch size. A full pool raises flashkv.CapacityError naming the sequence (the cache is unchanged).

Other attention implementations ("sdpa", "eager", ...) also work with a PagedCache: update() then returns the whole
dequantized K/V (the reference path used to A/B a format); with "flashkv" it returns the new tokens tagged for the
attention function, which appends them (only the real tokens of a left-padded batch: the 2D mask tells which) and
attends from the pages. Left padding only (what generate() produces for decoder-only models); right padding inside a
prompt is a ValueError. Beam search, crop (assisted decoding) and batch reordering are flashkv.UnsupportedError.
"""
from __future__ import annotations

import math
import re

import numpy as np
from typing import Any, Optional

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .._library import CapacityError, UnsupportedError
from ..kvcache import KVCache
from . import _ops


def _default_page_size(kv_cache_dtype: str) -> int:
    """16 tokens, or the least multiple of the format's quantization groups ("_gN"; KIVI formats group 32 tokens by
    default) so that a group never straddles a page (flashkv.KVCache requires it)."""
    groups = [int(g) for g in re.findall(r"_g(\d+)", kv_cache_dtype)]
    if "kivi" in kv_cache_dtype and not groups:
        groups = [32]
    size = 16
    for g in groups:
        size = size * g // math.gcd(size, g)
    return size


def _text_config(config: Any) -> Any:
    get = getattr(config, "get_text_config", None)
    return get(decoder=True) if callable(get) else config


class _CpuBackend:
    """flashkv.KVCache: one sequence id per batch row, every layer in one pool."""

    def __init__(self, owner: "PagedCache", batch: int):
        self.owner, self.batch = owner, batch
        o = owner
        pages = o.capacity_pages
        if not pages and not o.capacity_bytes:
            pages = batch * math.ceil(o.max_tokens / o.page_size)
        self.cache = KVCache(o.num_layers, o.num_heads_kv, o.head_dim, o.kv_cache_dtype, page_size=o.page_size,
                             residual_tokens=o.residual_tokens, sink_tokens=o.sink_tokens, rotation=o.rotation,
                             rotation_seed=o.rotation_seed, capacity_pages=pages, capacity_bytes=o.capacity_bytes)
        for b in range(batch):
            self.cache.add_sequence(b)

    def reset(self) -> None:
        for b in range(self.batch):
            self.cache.remove_sequence(b)
            self.cache.add_sequence(b)

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor, valid: Optional[torch.Tensor]) -> None:
        """k, v [batch, seqlen_new, num_heads_kv, head_dim]; valid [batch, seqlen_new] bool or None (all real)."""
        for b in range(self.batch):
            kb, vb = k[b], v[b]
            if valid is not None:
                n = int(valid[b].sum())
                kb, vb = kb[kb.shape[0] - n :], vb[vb.shape[0] - n :]  # left padding: the real tokens come last
            if kb.shape[0]:
                self.cache.append(b, layer, kb.contiguous(), vb.contiguous())

    def attend(self, layer, q, scale, causal, window_left, softcap) -> torch.Tensor:
        b, sq, h, d = q.shape
        out, _ = self.cache.attention(list(range(b)), q.reshape(b * sq, h, d), layer, q_lens=[sq] * b, causal=causal,
                                      window_size_left=window_left, softcap=softcap, softmax_scale=scale)
        return out.view(b, sq, h, d)

    def dense(self, layer: int, dtype: torch.dtype, device: torch.device):
        ks, vs = zip(*(self.cache.dequantize(b, layer) for b in range(self.batch)))
        k = torch.from_numpy(np.stack(ks)).to(device=device, dtype=dtype)
        v = torch.from_numpy(np.stack(vs)).to(device=device, dtype=dtype)
        return k.transpose(1, 2), v.transpose(1, 2)

    def memory_report(self) -> dict:
        return self.cache.memory_report()

    def close(self) -> None:
        self.cache.close()


class _PagesBackend:
    """16-bit pages in torch tensors on the model's device, attended by torch.ops.flashkv.paged_decode (CUDA split-KV
    decode; on the CPU its gather + varlen implementation)."""

    def __init__(self, owner: "PagedCache", batch: int, dtype: torch.dtype, device: torch.device):
        o = owner
        want = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}.get(o.kv_cache_dtype)
        if want is None:
            raise UnsupportedError(
                f"flashkv: argument 'kv_cache_dtype': {o.kv_cache_dtype!r} on CUDA is not supported yet (the quantized "
                "KV cache runs on the CPU; on CUDA PagedCache holds 'bf16' or 'fp16' pages)")
        if want != dtype:
            raise TypeError(f"flashkv: argument 'kv_cache_dtype': expected the model's dtype on CUDA ({dtype}), got "
                            f"{o.kv_cache_dtype!r}")
        self.owner, self.batch, self.device, self.ps = owner, batch, device, o.page_size
        page_bytes = 2 * o.page_size * o.num_heads_kv * o.head_dim * torch.finfo(dtype).bits // 8
        if o.capacity_pages:
            pages = o.capacity_pages
        elif o.capacity_bytes:
            pages = o.capacity_bytes // (page_bytes * o.num_layers)
        else:
            pages = batch * math.ceil(o.max_tokens / o.page_size)
        if pages < 1:
            raise ValueError(f"flashkv: argument 'capacity_bytes': expected >= one page per layer "
                             f"({page_bytes * o.num_layers} bytes), got {o.capacity_bytes}")
        shape = (pages, o.page_size, o.num_heads_kv, o.head_dim)
        self.k = [torch.empty(shape, dtype=dtype, device=device) for _ in range(o.num_layers)]
        self.v = [torch.empty(shape, dtype=dtype, device=device) for _ in range(o.num_layers)]
        self.max_pages = pages if not o.max_tokens else min(pages, math.ceil(o.max_tokens / o.page_size))
        self.page_table = torch.zeros((batch, self.max_pages), dtype=torch.int32, device=device)
        self.free = list(range(pages - 1, -1, -1))
        self.pages: list[list[int]] = [[] for _ in range(batch)]
        self.seqlens = [torch.zeros(batch, dtype=torch.int32, device=device) for _ in range(o.num_layers)]

    def reset(self) -> None:
        for p in self.pages:
            self.free.extend(reversed(p))
            p.clear()
        for s in self.seqlens:
            s.zero_()

    def reserve(self, tokens: int) -> None:
        """Pages for `tokens` positions in every sequence (positions count padding: an upper bound, no sync)."""
        need = math.ceil(tokens / self.ps)
        if need > self.max_pages:
            raise CapacityError(f"flashkv: PagedCache holds at most {self.max_pages * self.ps} tokens per sequence "
                                f"(max_cache_len), {tokens} requested")
        rows = []
        for b, have in enumerate(self.pages):
            if len(have) < need:
                if len(self.free) < need - len(have):
                    raise CapacityError(f"flashkv: PagedCache pool is full (sequence {b} needs {need - len(have)} "
                                        f"more pages, {len(self.free)} free)")
                start = len(have)
                have.extend(self.free.pop() for _ in range(need - len(have)))
                rows.append((b, start, have[start:]))
        for b, start, new in rows:  # a host-to-device copy of the new entries; no synchronization
            self.page_table[b, start : start + len(new)] = torch.tensor(new, dtype=torch.int32).to(self.device,
                                                                                                  non_blocking=True)

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor, valid: Optional[torch.Tensor]) -> None:
        if valid is None:
            return  # fused into attend() (paged_decode appends k_new/v_new itself)
        s = k.shape[1]
        n_real = valid.sum(dim=1, dtype=torch.int32)
        roll = (torch.arange(s, device=k.device)[None, :] + (s - n_real)[:, None]) % s  # real tokens first
        idx = roll[:, :, None, None].expand_as(k)
        _ops.kv_append(self.k[layer], self.v[layer], self.page_table, self.seqlens[layer],
                       k.gather(1, idx).contiguous(), v.gather(1, idx).contiguous())
        self.seqlens[layer] += n_real  # the padding written after the real tokens lies past the end: never read

    def attend(self, layer, q, scale, causal, window_left, softcap, k_new=None, v_new=None) -> torch.Tensor:
        if window_left >= 0:
            raise UnsupportedError("flashkv: argument 'sliding_window': PagedCache on CUDA has no sliding window yet")
        # The promise cache_seqlens <= max_k (no read-back): with k_new the kernel appends it, so the cached length
        # before this call is at most logical_len; without it the tokens were appended already. (>= 1: 0 means "no
        # promise", which costs a synchronous read of cache_seqlens.)
        max_k = max(self.owner.layers[layer].logical_len + (0 if k_new is not None else q.shape[1]), 1)
        out, _ = _ops.paged_decode(q.contiguous(), self.k[layer], self.v[layer], self.page_table, self.seqlens[layer],
                                   k_new, v_new, scale, causal, softcap, 0, max_k)
        if k_new is not None:
            self.seqlens[layer] += k_new.shape[1]
        return out

    def dense(self, layer: int, dtype: torch.dtype, device: torch.device):
        n = self.owner.layers[layer].logical_len
        pages = self.page_table[:, : math.ceil(n / self.ps)].to(torch.int64)
        k = self.k[layer][pages].flatten(1, 2)[:, :n]
        v = self.v[layer][pages].flatten(1, 2)[:, :n]
        return k.transpose(1, 2).to(dtype), v.transpose(1, 2).to(dtype)

    def memory_report(self) -> dict:
        used = sum(len(p) for p in self.pages)
        page_bytes = self.k[0][0].numel() * self.k[0].element_size() * 2 * len(self.k)
        return {"pages_total": len(self.free) + used, "pages_used": used, "page_bytes": page_bytes,
                "total_bytes": used * page_bytes, "pool_bytes": (len(self.free) + used) * page_bytes}

    def close(self) -> None:
        self.k, self.v = [], []


class _PagedHandle:
    """Tags the new key states handed to the "flashkv" attention function (which appends and attends)."""

    __slots__ = ("layer", "consumed")

    def __init__(self, layer: "PagedLayer"):
        self.layer, self.consumed = layer, False

    def attend(self, query, key, value, attention_mask, scale, causal, window_left, softcap):
        layer, owner = self.layer, self.layer.owner
        self.consumed = True
        sq = query.shape[2]
        q = query.transpose(1, 2)  # [batch, seqlen_q, num_heads, head_dim]
        k, v = key.transpose(1, 2), value.transpose(1, 2)
        valid = None
        if attention_mask is not None:
            valid = attention_mask[:, -sq:].to(torch.bool)
            if sq > 1 and not bool((valid[:, 1:] >= valid[:, :-1]).all()):
                raise ValueError("flashkv: argument 'attention_mask': PagedCache expects left padding (padding tokens "
                                 "before the real ones), got padding after a real token")
        be = owner.backend
        if isinstance(be, _PagesBackend):
            be.reserve(layer.logical_len + sq)
            if valid is None:
                out = be.attend(layer.idx, q, scale, causal, window_left, softcap, k.contiguous(), v.contiguous())
            else:
                be.append(layer.idx, k, v, valid)
                out = be.attend(layer.idx, q, scale, causal, window_left, softcap)
        else:
            be.append(layer.idx, k, v, valid)
            out = be.attend(layer.idx, q, scale, causal, window_left, softcap)
        layer.logical_len += sq
        return out


class PagedLayer(CacheLayerMixin):
    """One model layer of a PagedCache (transformers' CacheLayerMixin contract; the data lives in the owner)."""

    is_compileable = False
    is_croppable = False

    def __init__(self, owner: "PagedCache", idx: int, sliding: bool):
        super().__init__()
        self.owner, self.idx, self.is_sliding = owner, idx, sliding
        self.logical_len = 0  # positions processed, padding included (what the model's masks and positions count)
        self._pending: Optional[_PagedHandle] = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.owner._init_backend(key_states)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """key_states/value_states [batch, num_heads_kv, seqlen_new, head_dim]. With attn_implementation "flashkv"
        returns them tagged (the attention function appends and attends); else appends and returns the whole
        dequantized K/V [batch, num_heads_kv, seqlen, head_dim]."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.owner._check_batch(key_states)
        self.owner._check_consumed()
        if self.owner.uses_flashkv_attention():
            h = _PagedHandle(self)
            self.owner._pending = h
            key_states._flashkv_paged = h
            return key_states, value_states
        be = self.owner.backend
        if isinstance(be, _PagesBackend):
            be.reserve(self.logical_len + key_states.shape[2])
            be.append(self.idx, key_states.transpose(1, 2), value_states.transpose(1, 2),
                      torch.ones(key_states.shape[0], key_states.shape[2], dtype=torch.bool, device=key_states.device))
        else:
            be.append(self.idx, key_states.transpose(1, 2), value_states.transpose(1, 2), None)
        self.logical_len += key_states.shape[2]
        return be.dense(self.idx, key_states.dtype, key_states.device)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.logical_len + query_length, 0

    def get_seq_length(self) -> int:
        return self.logical_len

    def get_max_length(self) -> int:
        return self.owner.max_tokens or -1

    def reset(self) -> None:
        self.logical_len = 0

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise UnsupportedError("flashkv: PagedCache does not support beam search (reorder_cache)")

    def crop(self, tokens_to_remove: int) -> None:
        raise UnsupportedError("flashkv: PagedCache does not support crop (assisted decoding)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise UnsupportedError("flashkv: PagedCache does not support batch_repeat_interleave (num_return_sequences / "
                               "beams); build the batch before generate")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise UnsupportedError("flashkv: PagedCache does not support batch_select_indices")


class PagedCache(Cache):
    """A transformers Cache over flashkv's paged (quantized) KV cache; see the module docstring.

    Args:
        config: the model's config (model.config); its num_hidden_layers, num_key_value_heads, head_dim and the
            attention implementation in use are read from it.
        kv_cache_dtype: flashkv's format string (docs/kvcache.md), default "bf16".
        max_cache_len: most tokens per sequence (prompt + generated); sizes the pool as batch x max_cache_len
            unless capacity_pages / capacity_bytes is given.
        page_size: tokens per page (CPU: a multiple of the format's group; CUDA: a power of two in 16..256);
            default 16, or the format's group size when larger (KIVI formats: 32).
        residual_tokens, sink_tokens, rotation, rotation_seed: as flashkv.KVCache (CPU backend).
        capacity_pages, capacity_bytes: pool size (at most one).
        backend: None (default: "kvcache" on the CPU, "pages" on CUDA), "kvcache" (flashkv.KVCache, CPU, every
            format) or "pages" (16-bit torch pages + torch.ops.flashkv.paged_decode; kv_cache_dtype = the model's
            dtype: "bf16"/"fp16", and "fp32" on the CPU). "pages" on the CPU runs the CUDA path's logic with the CPU
            implementation of the operators (what the tests use to check it without a GPU).
    """

    def __init__(self, config: Any, kv_cache_dtype: str = "bf16", *, max_cache_len: Optional[int] = None,
                 page_size: Optional[int] = None, residual_tokens: int = 0, sink_tokens: int = 0, rotation: str = "none",
                 rotation_seed: int = 0, capacity_pages: int = 0, capacity_bytes: int = 0,
                 backend: Optional[str] = None):
        text = _text_config(config)
        if backend not in (None, "kvcache", "pages"):
            raise ValueError(f"flashkv: argument 'backend': expected None, 'kvcache' or 'pages', got {backend!r}")
        self._backend_choice = backend
        if not max_cache_len and not capacity_pages and not capacity_bytes:
            raise ValueError("flashkv: argument 'max_cache_len': expected the most tokens per sequence (prompt + new "
                             "tokens), or capacity_pages / capacity_bytes, got None")
        if capacity_pages and capacity_bytes:
            raise ValueError("flashkv: argument 'capacity_bytes': expected one of capacity_pages / capacity_bytes, "
                             "got both")
        if not isinstance(kv_cache_dtype, str):
            raise TypeError(f"flashkv: argument 'kv_cache_dtype': expected a str, got {type(kv_cache_dtype).__name__}")
        self._config = config
        self.num_layers = int(text.num_hidden_layers)
        heads = int(text.num_attention_heads)
        self.num_heads_kv = int(getattr(text, "num_key_value_heads", None) or heads)
        self.head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
        self.kv_cache_dtype, self.max_tokens = kv_cache_dtype, int(max_cache_len or 0)
        self.page_size = int(page_size) if page_size is not None else _default_page_size(kv_cache_dtype)
        self.residual_tokens, self.sink_tokens = int(residual_tokens), int(sink_tokens)
        self.rotation, self.rotation_seed = rotation, int(rotation_seed)
        self.capacity_pages, self.capacity_bytes = int(capacity_pages), int(capacity_bytes)
        types = list(getattr(text, "layer_types", None) or ["full_attention"] * self.num_layers)
        bad = set(types) - {"full_attention", "sliding_attention"}
        if bad:
            raise UnsupportedError(f"flashkv: PagedCache supports attention layers only, the model has {sorted(bad)}")
        self.backend: Any = None
        self._batch = None
        self._pending: Optional[_PagedHandle] = None
        super().__init__(layers=[PagedLayer(self, i, t == "sliding_attention") for i, t in enumerate(types)])

    def uses_flashkv_attention(self) -> bool:
        return getattr(self._config, "_attn_implementation", None) == "flashkv"

    def _init_backend(self, key_states: torch.Tensor) -> None:
        if self.backend is not None:
            return
        b = key_states.shape[0]
        self._batch = b
        choice = self._backend_choice or ("pages" if key_states.device.type == "cuda" else "kvcache")
        if choice == "kvcache" and key_states.device.type == "cuda":
            raise UnsupportedError("flashkv: argument 'backend': 'kvcache' (flashkv.KVCache) runs on the CPU; CUDA "
                                   "tensors use 'pages'")
        if choice == "pages":
            self.backend = _PagesBackend(self, b, key_states.dtype, key_states.device)
        elif key_states.device.type == "cpu":
            self.backend = _CpuBackend(self, b)
        else:
            raise UnsupportedError(f"flashkv: PagedCache runs on cpu or cuda tensors, got {key_states.device}")

    def _check_batch(self, key_states: torch.Tensor) -> None:
        if key_states.shape[0] != self._batch:
            raise ValueError(f"flashkv: argument 'key_states': expected batch {self._batch} (the batch this cache was "
                             f"started with), got {key_states.shape[0]}")

    def _check_consumed(self) -> None:
        h = self._pending
        if h is not None and not h.consumed:
            raise RuntimeError(
                "flashkv: PagedCache handed the new keys to an attention function other than 'flashkv' (its "
                f"config._attn_implementation is {getattr(self._config, '_attn_implementation', None)!r} but the "
                "model did not call flashkv); pass the model's own config (model.config) to PagedCache")
        self._pending = None

    def reset(self) -> None:
        super().reset()
        if self.backend is not None:
            self.backend.reset()
        self._pending = None

    def memory_report(self) -> dict:
        """Exact bytes of the cache (CPU: flashkv.KVCache.memory_report(); CUDA: pages used / total)."""
        return self.backend.memory_report() if self.backend is not None else {}

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()
            self.backend = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


__all__ = ["PagedCache", "PagedLayer"]
