"""The generation engine (flashkv_engine.h over include/flashkv/engine.hpp): a Llama-architecture model whose prefill
runs flashkv's exact tiled attention and whose decode reads a (quantized) paged KV cache, on the CPU or a CUDA GPU.

    import flashkv
    eng = flashkv.Engine("aidreams260K.bin", "aidreams260K.tok512.bin")       # or a GGUF, or "smollm2-135m"
    eng.generate("Once upon a time", max_new_tokens=64, temperature=0)      # -> str (greedy)
    eng.generate_tokens([1, 403, 407], max_new_tokens=8, temperature=0)     # -> list of token ids
    eng.last_stats["decode_tokens_per_s"]                                    # what `flashkv generate` prints

It runs the code of `flashkv generate` (same prompt encoding, KV format fitting, sampler and stop rule), so with the
same prompt, options and seed it returns the CLI's tokens (`--json` "tokens") and text ("text").

Sampling defaults are the CLI's: temperature 1.0, top_p 0.9, top_k 0, 256 new tokens, stop at end-of-generation tokens.
seed=None takes the engine's seed stream: the n-th such call (n = 0, 1, ...) uses Engine(seed=...) + n, so the first
call equals `flashkv generate --seed <seed>` and successive calls differ, reproducibly.

Continuous batching: add(prompt, ...) admits a request (prefill + its first token), step() decodes one token for every
running request in one batched call, retire(seq) frees a request's pages. Events are EngineEvent(seq, token, stop),
stop None while the request goes on, else "steps" | "bos" | "eos" | "context" (a "bos"/"eos" event's token is the stop
token, not text).

Errors: TypeError / ValueError for bad arguments (naming them, expected vs actual), FileNotFoundError for a model or
tokenizer file that does not exist, OSError for an unreadable or corrupt one, flashkv.CapacityError when max_sequences
are live or the KV page pool lacks pages (nothing changed), flashkv.UnsupportedError for device="cuda" without the
CUDA backend / a GPU / cuBLAS, or a KV format the CUDA engine does not decode.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import threading
from typing import Any, NamedTuple, Sequence

import numpy as np

from . import _library as L
from ._attention import _bool_arg, _float_arg, _int_arg
from ._handle import OwnedHandle
from .kvcache import _KV_FORMAT_FIELDS

_INT64_MAX = 2**63 - 1
_UINT64_MAX = 2**64 - 1
STOP_REASONS = {-1: None, 0: "steps", 1: "bos", 2: "eos", 3: "context"}  # flashkv_stop_reason


class _EngineOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("tokenizer_path", ctypes.c_char_p),
        ("device", ctypes.c_char_p),
    ] + _KV_FORMAT_FIELDS + [
        ("kv_capacity_pages", ctypes.c_int64),
        ("max_sequences", ctypes.c_int32),
        ("max_context", ctypes.c_int32),
        ("seed", ctypes.c_uint64),
    ]


class _GenerateOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("max_new_tokens", ctypes.c_int32),
        ("temperature", ctypes.c_float),
        ("top_k", ctypes.c_int32),
        ("top_p", ctypes.c_float),
        ("has_seed", ctypes.c_int32),
        ("seed", ctypes.c_uint64),
        ("stop_at_eos", ctypes.c_int32),
    ]


_STATS_FIELDS = [
    ("stop_reason", ctypes.c_int32), ("stop_token", ctypes.c_int32), ("prompt_tokens", ctypes.c_int64),
    ("generated_tokens", ctypes.c_int64), ("decode_steps", ctypes.c_int64), ("seed", ctypes.c_uint64),
    ("prefill_seconds", ctypes.c_double), ("decode_seconds", ctypes.c_double),
    ("prefill_tokens_per_s", ctypes.c_double), ("decode_tokens_per_s", ctypes.c_double),
    ("kv_bytes", ctypes.c_int64), ("kv_tokens", ctypes.c_int64), ("kv_bytes_per_token", ctypes.c_double),
    ("kv_effective_bits", ctypes.c_double), ("kv_bf16_bytes_per_token", ctypes.c_double),
]


class _Stats(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32)] + _STATS_FIELDS


class _Info(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32)] + [(f, ctypes.c_int32) for f in (
        "vocab_size", "max_context", "max_sequences", "dim", "hidden_dim", "num_layers", "num_heads", "num_heads_kv",
        "head_dim", "bos_id", "eos_id", "add_bos", "device", "device_index")] + [
        ("kv_cache_dtype", ctypes.c_char_p), ("model_format", ctypes.c_char_p), ("model_path", ctypes.c_char_p)]


class _Event(ctypes.Structure):
    _fields_ = [("seq", ctypes.c_int32), ("token", ctypes.c_int32), ("stop", ctypes.c_int32)]


class EngineEvent(NamedTuple):
    """One token of the batch API: the request's sequence id, the sampled token, and why the request finished (None
    while it goes on; "steps" | "bos" | "eos" | "context"; for "bos" / "eos" the token is the stop token)."""

    seq: int
    token: int
    stop: str | None


def _signatures() -> dict[str, list]:
    H, P = ctypes.c_void_p, ctypes.POINTER
    i32, i64, sz = ctypes.c_int32, ctypes.c_int64, ctypes.c_size_t
    I32P, G, S = P(ctypes.c_int32), P(_GenerateOptions), P(_Stats)
    return {
        "flashkv_engine_options_default": [P(_EngineOptions)],
        "flashkv_generate_options_default": [G],
        "flashkv_engine_create": [ctypes.c_char_p, P(_EngineOptions), P(H)],
        "flashkv_engine_destroy": [H],
        "flashkv_engine_get_info": [H, P(_Info)],
        "flashkv_engine_tokenize": [H, ctypes.c_char_p, sz, i32, I32P, i64, P(i64)],
        "flashkv_engine_detokenize": [H, I32P, i64, ctypes.c_char_p, sz, P(sz)],
        "flashkv_engine_generate": [H, I32P, i64, G, I32P, i64, P(i64), S],
        "flashkv_engine_generate_text": [H, ctypes.c_char_p, sz, G, I32P, i64, P(i64), S],
        "flashkv_engine_add": [H, I32P, i64, G, P(_Event)],
        "flashkv_engine_step": [H, P(_Event), i32, P(i32)],
        "flashkv_engine_retire": [H, i32],
    }


def _lib() -> ctypes.CDLL:
    """libflashkv with the engine C ABI (flashkv_engine.h) declared; UnsupportedError for a library without it."""
    return L.declared("engine", _signatures, older_than="the engine C ABI")


def _path_arg(value: Any, name: str, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if isinstance(value, (str, os.PathLike)):
        text = os.fspath(value)
        if isinstance(text, bytes):
            text = os.fsdecode(text)
        return text
    want = "a str or os.PathLike" + (" or None" if optional else "")
    raise TypeError(f"flashkv: argument '{name}': expected {want}, got {type(value).__name__}")


def _device_arg(device: Any) -> str:
    """'cpu' | 'cuda' | 'cuda:N', or a torch.device (its str); the library checks the spelling."""
    if isinstance(device, str):
        return device
    if type(device).__name__ == "device" and type(device).__module__.startswith("torch"):
        return str(device)
    raise TypeError(f"flashkv: argument 'device': expected a str ('cpu', 'cuda', 'cuda:N') or a torch.device, "
                    f"got {type(device).__name__}")


def _token_ids(tokens: Any, name: str) -> np.ndarray:
    """A sequence of token ids (ints or a numpy integer array) → contiguous int32; the library checks the vocab."""
    if isinstance(tokens, (str, bytes)):
        raise TypeError(f"flashkv: argument '{name}': expected a sequence of token ids (ints), got {type(tokens).__name__}")
    if isinstance(tokens, np.ndarray):
        arr = tokens
    else:
        try:
            items = list(tokens)
        except TypeError:
            raise TypeError(f"flashkv: argument '{name}': expected a sequence of token ids (ints), "
                            f"got {type(tokens).__name__}") from None
        for i, t in enumerate(items):
            if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
                raise TypeError(f"flashkv: argument '{name}[{i}]': expected an int token id, got {type(t).__name__} {t!r}")
        arr = np.asarray([int(t) for t in items], dtype=np.int64)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise TypeError(f"flashkv: argument '{name}': expected a 1-D sequence of int token ids, got an array of "
                        f"dtype {arr.dtype} and shape {arr.shape}")
    if arr.size and (int(arr.min()) < -(2**31) or int(arr.max()) > 2**31 - 1):
        bad = int(arr.max()) if int(arr.max()) > 2**31 - 1 else int(arr.min())
        raise ValueError(f"flashkv: argument '{name}': expected token ids in int32 range, got {bad}")
    return np.ascontiguousarray(arr, dtype=np.int32)


def _text_arg(text: Any, name: str) -> bytes:
    if isinstance(text, str):
        return text.encode("utf-8")
    if isinstance(text, (bytes, bytearray, memoryview)):
        return bytes(text)
    raise TypeError(f"flashkv: argument '{name}': expected a str or bytes, got {type(text).__name__}")


def _i32p(arr: np.ndarray):
    return arr.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))


class Engine(OwnedHandle):
    """A model, its tokenizer and one generation engine with its KV cache. See the module docstring.

    model: a named model ("aidreams260k", "smollm2-135m") or a checkpoint path (llama2.c .bin or GGUF).
    tokenizer: a llama2.c tokenizer file (None: the named model's, or the GGUF's embedded vocabulary).
    device: "cpu" (default; float32 weights, OpenBLAS), "cuda" or "cuda:N" (bf16 weights, cuBLAS, CUDA attention and
    paged decode; see docs/engine.md for the formats it decodes).
    kv_cache_dtype: the KV format (the grammar of flashkv.KVCache: "fp32", "bf16", "int8", "int4", "int2_kivi",
    "k:int8,v:int4", ...); None = "fp32" on the CPU, "bf16" on CUDA (as the CLI).
    page_size: tokens per KV page (power of two 16..256). residual_tokens / sink_tokens: most recent / first tokens
    kept bf16. rotation: "none" or "hadamard" (seeded by rotation_seed). kv_capacity_pages: the page pool (0 = enough
    for max_sequences full sequences). max_sequences: sequences live at once (generate calls + batch requests).
    max_context: tokens per sequence (0 = the model's context). seed: the engine's seed stream.
    """

    def __init__(self, model: str | os.PathLike, tokenizer: str | os.PathLike | None = None, device: Any = "cpu",
                 kv_cache_dtype: str | None = None, *, page_size: int = 32, residual_tokens: int = 0,
                 sink_tokens: int = 0, rotation: str = "none", rotation_seed: int = 0, kv_capacity_pages: int = 0,
                 max_sequences: int = 1, max_context: int = 0, seed: int = 42):
        self._h = None
        self._lock = threading.Lock()  # one C call at a time per engine; close() never overlaps a running call
        model_s = _path_arg(model, "model")
        tok_s = _path_arg(tokenizer, "tokenizer", optional=True)
        if kv_cache_dtype is not None and not isinstance(kv_cache_dtype, str):
            raise TypeError(f"flashkv: argument 'kv_cache_dtype': expected a str or None, "
                            f"got {type(kv_cache_dtype).__name__}")
        if not isinstance(rotation, str):
            raise TypeError(f"flashkv: argument 'rotation': expected 'none' or 'hadamard', got {type(rotation).__name__}")
        if rotation not in ("none", "hadamard"):
            raise ValueError(f"flashkv: argument 'rotation': expected 'none' or 'hadamard', got {rotation!r}")
        lib = _lib()
        o = _EngineOptions()
        L.check(lib.flashkv_engine_options_default(ctypes.byref(o)))
        keep = [s.encode() if s is not None else None for s in (tok_s, _device_arg(device), kv_cache_dtype)]
        o.tokenizer_path, o.device, o.kv_cache_dtype = keep
        for field, val in (("page_size", page_size), ("residual_tokens", residual_tokens),
                           ("sink_tokens", sink_tokens), ("max_sequences", max_sequences),
                           ("max_context", max_context)):
            setattr(o, field, _int_arg(val, field, -(2**31)))  # the library names values outside its range
        o.kv_capacity_pages = _int_arg(kv_capacity_pages, "kv_capacity_pages", -_INT64_MAX, _INT64_MAX)
        o.rotation = 1 if rotation == "hadamard" else 0
        o.rotation_seed = _int_arg(rotation_seed, "rotation_seed", 0, _UINT64_MAX)
        o.seed = _int_arg(seed, "seed", 0, _UINT64_MAX)
        h = ctypes.c_void_p()
        try:
            L.check(lib.flashkv_engine_create(model_s.encode(), ctypes.byref(o), ctypes.byref(h)))
        except OSError as e:
            if type(e) is OSError:  # a file that is not there: FileNotFoundError (an OSError), with the library's message
                for path in (model_s, tok_s):
                    if path and ("/" in path or "." in path) and not os.path.exists(path) and path in str(e):
                        raise FileNotFoundError(errno.ENOENT, str(e), path) from None
            raise
        self._h = h
        info = _Info()
        info.struct_size = ctypes.sizeof(_Info)
        L.check(lib.flashkv_engine_get_info(self._h, ctypes.byref(info)))
        self.vocab_size, self.max_context, self.max_sequences = info.vocab_size, info.max_context, info.max_sequences
        self.bos_id, self.eos_id, self.add_bos = info.bos_id, info.eos_id, bool(info.add_bos)
        self.device = "cpu" if info.device == L.DEVICE_CPU else f"cuda:{info.device_index}"
        self.kv_cache_dtype = info.kv_cache_dtype.decode()  # as it runs, e.g. "int4_kivi_g16 r32"
        self.model_format, self.model_path = info.model_format.decode(), info.model_path.decode()
        self.config = {f: int(getattr(info, f)) for f in ("dim", "hidden_dim", "num_layers", "num_heads",
                                                          "num_heads_kv", "head_dim", "vocab_size")}
        self.last_stats: dict | None = None  # the last generate / generate_tokens call's numbers

    # ---- lifetime (close / with / destructor: _handle.OwnedHandle) -------------------------------------------------
    _kind = "Engine"

    def _free(self, h: ctypes.c_void_p) -> None:
        _lib().flashkv_engine_destroy(h)

    def close(self) -> None:
        """Frees the engine, model and KV cache (idempotent; waits for a call running in another thread); also called
        by the destructor and `with`."""
        super().close()

    @contextlib.contextmanager
    def _use(self):
        """The open handle, with this engine's lock held (calls from several threads run one at a time)."""
        with self._lock:
            yield self._handle()

    def __repr__(self) -> str:
        state = "closed" if self._h is None else f"{self.kv_cache_dtype}, {self.device}"
        return f"flashkv.Engine({getattr(self, 'model_path', '?')!r}, {state})"

    # ---- tokenizer -------------------------------------------------------------------------------------------------
    def tokenize(self, text: str | bytes, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text` as prompts are encoded (special tokens such as <|im_start|> parsed); add_bos None = the
        tokenizer's rule (llama2.c: BOS first; SmolLM2: none)."""
        data = _text_arg(text, "text")
        bos = -1 if add_bos is None else int(_bool_arg(add_bos, "add_bos"))
        n, lib = ctypes.c_int64(), _lib()
        with self._use() as h:
            L.check(lib.flashkv_engine_tokenize(h, data, len(data), bos, None, 0, ctypes.byref(n)))
            out = np.empty(max(1, n.value), dtype=np.int32)
            L.check(lib.flashkv_engine_tokenize(h, data, len(data), bos, _i32p(out), n.value, ctypes.byref(n)))
        return out[: n.value].tolist()

    def detokenize_bytes(self, tokens: Sequence[int]) -> bytes:
        """The bytes of `tokens` (the first token's predecessor is BOS, as `flashkv generate --json` "text")."""
        ids = _token_ids(tokens, "tokens")
        n, lib = ctypes.c_size_t(), _lib()
        with self._use() as h:
            L.check(lib.flashkv_engine_detokenize(h, _i32p(ids), ids.size, None, 0, ctypes.byref(n)))
            buf = ctypes.create_string_buffer(n.value + 1)
            L.check(lib.flashkv_engine_detokenize(h, _i32p(ids), ids.size, buf, n.value + 1, ctypes.byref(n)))
        return buf.raw[: n.value]

    def detokenize(self, tokens: Sequence[int], errors: str = "replace") -> str:
        """detokenize_bytes decoded as UTF-8 (a token may end inside a character: errors="replace" by default, as the
        CLI's JSON output)."""
        return self.detokenize_bytes(tokens).decode("utf-8", errors)

    # ---- generation ------------------------------------------------------------------------------------------------
    def _options(self, max_new_tokens, temperature, top_k, top_p, seed, stop_at_eos) -> _GenerateOptions:
        g = _GenerateOptions()
        L.check(_lib().flashkv_generate_options_default(ctypes.byref(g)))
        g.max_new_tokens = _int_arg(max_new_tokens, "max_new_tokens", -(2**31))
        g.temperature = _float_arg(temperature, "temperature", "a float")
        g.top_k = _int_arg(top_k, "top_k", -(2**31))
        g.top_p = _float_arg(top_p, "top_p", "a float")
        if seed is not None:
            g.has_seed, g.seed = 1, _int_arg(seed, "seed", 0, _UINT64_MAX)
        g.stop_at_eos = 1 if _bool_arg(stop_at_eos, "stop_at_eos") else 0
        return g

    def generate_tokens(self, prompt: str | bytes | Sequence[int], max_new_tokens: int = 256, *,
                        temperature: float = 1.0, top_k: int = 0, top_p: float = 0.9, seed: int | None = None,
                        stop_at_eos: bool = True) -> list[int]:
        """Generated token ids (without the stop token) after `prompt`: text (encoded as `flashkv generate --prompt`)
        or token ids (llama2.c prompts start with BOS = 1). Sets last_stats."""
        g = self._options(max_new_tokens, temperature, top_k, top_p, seed, stop_at_eos)
        cap = max(1, min(g.max_new_tokens, self.max_context))  # the most a call can return (the library checks)
        out = np.empty(cap, dtype=np.int32)
        n = ctypes.c_int64()
        st = _Stats()
        st.struct_size = ctypes.sizeof(_Stats)
        lib = _lib()
        if isinstance(prompt, (str, bytes, bytearray, memoryview)):
            data = _text_arg(prompt, "prompt")
            with self._use() as h:
                L.check(lib.flashkv_engine_generate_text(h, data, len(data), ctypes.byref(g), _i32p(out), cap,
                                                         ctypes.byref(n), ctypes.byref(st)))
        else:
            ids = _token_ids(prompt, "prompt")
            with self._use() as h:
                L.check(lib.flashkv_engine_generate(h, _i32p(ids), ids.size, ctypes.byref(g), _i32p(out), cap,
                                                    ctypes.byref(n), ctypes.byref(st)))
        stats = {f: (float if t is ctypes.c_double else int)(getattr(st, f)) for f, t in _STATS_FIELDS}
        stats["stop"] = STOP_REASONS.get(stats.pop("stop_reason"), "unknown")
        stats["kv_cache_dtype"], stats["device"] = self.kv_cache_dtype, self.device
        self.last_stats = stats
        return out[: n.value].tolist()

    def generate(self, prompt: str | bytes, max_new_tokens: int = 256, *, temperature: float = 1.0, top_k: int = 0,
                 top_p: float = 0.9, seed: int | None = None, stop_at_eos: bool = True) -> str:
        """The generated text after `prompt` (text; token ids go to generate_tokens): `flashkv generate`'s "text".
        Sets last_stats (prefill / decode tokens/s, stop reason, KV bytes, ...)."""
        if not isinstance(prompt, (str, bytes, bytearray, memoryview)):
            raise TypeError(f"flashkv: argument 'prompt': expected a str or bytes (token ids: generate_tokens), "
                            f"got {type(prompt).__name__}")
        return self.detokenize(self.generate_tokens(prompt, max_new_tokens, temperature=temperature, top_k=top_k,
                                                    top_p=top_p, seed=seed, stop_at_eos=stop_at_eos))

    # ---- continuous batching ---------------------------------------------------------------------------------------
    def add(self, prompt: str | bytes | Sequence[int], max_new_tokens: int = 256, *, temperature: float = 1.0,
            top_k: int = 0, top_p: float = 0.9, seed: int | None = None, stop_at_eos: bool = True) -> EngineEvent:
        """Admits a request (a new sequence, prefill of `prompt`, its first token sampled) and returns its first
        event. flashkv.CapacityError when max_sequences are live or the page pool lacks the prompt's pages (nothing
        added)."""
        g = self._options(max_new_tokens, temperature, top_k, top_p, seed, stop_at_eos)
        if isinstance(prompt, (str, bytes, bytearray, memoryview)):
            ids = np.asarray(self.tokenize(prompt), dtype=np.int32)
            if ids.size == 0:
                raise ValueError("flashkv: argument 'prompt': expected a non-empty prompt (this model's tokenizer adds "
                                 "no BOS token to start from), got ''")
        else:
            ids = _token_ids(prompt, "prompt")
        ev = _Event()
        with self._use() as h:
            L.check(_lib().flashkv_engine_add(h, _i32p(ids), ids.size, ctypes.byref(g), ctypes.byref(ev)))
        return EngineEvent(ev.seq, ev.token, STOP_REASONS.get(ev.stop, "unknown"))

    def step(self) -> list[EngineEvent]:
        """One batched decode step over every running request: one event each, by increasing seq ([] when none
        runs). flashkv.CapacityError when the pool lacks pages for the step (nothing computed: retire a request and
        step again)."""
        events = (_Event * max(1, self.max_sequences))()
        n = ctypes.c_int32()
        with self._use() as h:
            L.check(_lib().flashkv_engine_step(h, events, len(events), ctypes.byref(n)))
        return [EngineEvent(e.seq, e.token, STOP_REASONS.get(e.stop, "unknown")) for e in events[: n.value]]

    def retire(self, seq: int) -> None:
        """Frees a request's sequence and pages (a running request is cancelled)."""
        seq = _int_arg(seq, "seq", -(2**31))
        with self._use() as h:
            L.check(_lib().flashkv_engine_retire(h, seq))


__all__ = ["Engine", "EngineEvent"]
