"""Random-weight Llama models in Hugging Face transformers and their GGUF v3 twins, so that flashkv and transformers run
the SAME weights (issue 14's benchmark: bench/gpu/engine_bench.py; proven equal on the CPU by
tests/engine/test_hf_gguf.py).

  config(shape, **overrides)      a transformers LlamaConfig: "llama3-8b" (Meta-Llama-3-8B's config.json: 32 layers,
                                  hidden 4096, 32 / 8 heads of 128, intermediate 14336, vocab 128256, rope_theta 5e5),
                                  "smollm2-135m" (SmolLM2-135M's: 30 layers, hidden 576, 9 / 3 heads of 64,
                                  intermediate 1536, vocab 49152, tied embeddings, rope_theta 1e5) or "tiny" (tests)
  build_model(cfg, seed, ...)     LlamaForCausalLM (attn_implementation "sdpa") whose every parameter is drawn from
                                  its own seeded generator and rounded to bf16 (exact in the GGUF's BF16 tensors)
  write_gguf(model, path, ...)    GGUF v3 as llama.cpp's convert_hf_to_gguf.py writes a Llama: BF16 matrices, F32
                                  norms, llama.cpp tensor names, q_proj / k_proj rows permuted for ggml's interleaved-
                                  pair RoPE (LlamaModel.permute), metadata llama.*, and a synthetic SentencePiece
                                  vocabulary (<unk>, <s>, </s>, the 256 byte pieces <0xXX>, then "▁w<i>") that
                                  flashkv's loader accepts. Tensors are streamed to the file one at a time.

Weights: embeddings N(0, 1), each projection N(0, 1 / fan_in) (unit-variance outputs), norms 1 + 0.1·N(0, 1), the
classifier N(0, 1 / hidden): logits of order one, so a wrong mapping shows. The parameter i of named_parameters()
(registration order) is drawn from torch.Generator(device).manual_seed(seed · 1000003 + i) in float32.
"""
import struct

import numpy as np
import torch

SHAPES = {
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
                      rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False),
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
                         rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
    "tiny": dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rope_theta=5000.0,
                 rms_norm_eps=1e-5, tie_word_embeddings=False),
}

GGML_F32, GGML_BF16 = 0, 30
GGUF_U32, GGUF_I32, GGUF_F32, GGUF_BOOL, GGUF_STRING, GGUF_ARRAY = 4, 5, 6, 7, 8, 9
ALIGN = 32


def config(shape, **overrides):
    from transformers import LlamaConfig

    kw = dict(SHAPES[shape])
    kw.update(overrides)
    return LlamaConfig(attn_implementation="sdpa", **kw)


def rope_theta(cfg):
    rp = getattr(cfg, "rope_parameters", None) or {}
    return float(rp.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))


def build_model(cfg, seed, device="cpu", dtype=torch.bfloat16):
    """LlamaForCausalLM(cfg) on `device` in `dtype`, every parameter seeded (module docstring), eval mode."""
    from transformers import LlamaForCausalLM

    with torch.device(device):
        model = LlamaForCausalLM._from_config(cfg, dtype=dtype)
    model.eval()
    hidden = cfg.hidden_size
    with torch.no_grad():
        for i, (name, p) in enumerate(model.named_parameters()):
            g = torch.Generator(device=p.device).manual_seed(seed * 1000003 + i)
            x = torch.randn(p.shape, generator=g, device=p.device, dtype=torch.float32)
            if name.endswith("norm.weight"):
                x = 1.0 + 0.1 * x
            elif name.endswith("embed_tokens.weight"):
                pass
            elif name == "lm_head.weight":
                x = x * hidden ** -0.5
            else:  # [out, in] projection
                x = x * p.shape[1] ** -0.5
            p.copy_(x.to(torch.bfloat16).to(dtype))
            del x
    return model


def permute_rows(w, n_head):
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute: HF's rotate-half RoPE pairs (i, i + d/2) of a head become
    ggml's interleaved pairs (2i, 2i + 1): row 2i <- row i, row 2i + 1 <- row i + d/2 within each head."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def synthetic_vocab(n):
    """(pieces, scores, token types) of a SentencePiece-style vocabulary of n >= 260 pieces."""
    if n < 260:
        raise ValueError(f"vocab_size {n}: the synthetic vocabulary needs at least 260 tokens")
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256  # llama.cpp token types: unknown, control, byte
    pieces += [f"\u2581w{i}" for i in range(n - len(pieces))]
    types += [1] * (n - len(types))
    scores = [0.0] * 259 + [-float(i) for i in range(n - 259)]
    return pieces, scores, types


class _Buf:
    def __init__(self):
        self.b = bytearray()

    def put(self, fmt, *v):
        self.b += struct.pack("<" + fmt, *v)

    def str(self, s):
        e = s.encode("utf-8")
        self.put("Q", len(e))
        self.b += e


def gguf_tensors(model, permute=True):
    """[(gguf name, tensor getter, ggml type)] in the order llama.cpp writes a Llama; a getter returns a CPU tensor
    (row-major [out, in] = GGUF ne [in, out])."""
    cfg = model.config
    sd = dict(model.named_parameters())
    hq, hk = cfg.num_attention_heads, cfg.num_key_value_heads

    def get(name, heads=None):
        def f():
            w = sd[name].detach()
            if heads is not None and permute:
                w = permute_rows(w, heads)
            return w

        return f

    out = [("token_embd.weight", get("model.embed_tokens.weight"), GGML_BF16)]
    for l in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{l}.", f"blk.{l}."
        out += [
            (b + "attn_norm.weight", get(p + "input_layernorm.weight"), GGML_F32),
            (b + "attn_q.weight", get(p + "self_attn.q_proj.weight", hq), GGML_BF16),
            (b + "attn_k.weight", get(p + "self_attn.k_proj.weight", hk), GGML_BF16),
            (b + "attn_v.weight", get(p + "self_attn.v_proj.weight"), GGML_BF16),
            (b + "attn_output.weight", get(p + "self_attn.o_proj.weight"), GGML_BF16),
            (b + "ffn_norm.weight", get(p + "post_attention_layernorm.weight"), GGML_F32),
            (b + "ffn_gate.weight", get(p + "mlp.gate_proj.weight"), GGML_BF16),
            (b + "ffn_up.weight", get(p + "mlp.up_proj.weight"), GGML_BF16),
            (b + "ffn_down.weight", get(p + "mlp.down_proj.weight"), GGML_BF16),
        ]
    out.append(("output_norm.weight", get("model.norm.weight"), GGML_F32))
    if not cfg.tie_word_embeddings:
        out.append(("output.weight", get("lm_head.weight"), GGML_BF16))
    return out


def write_gguf(model, path, context_length=None, permute=True, name="flashkv random llama"):
    """Writes `model` (a LlamaForCausalLM) as a GGUF v3 file (module docstring). context_length defaults to
    max_position_embeddings. permute=False skips the Q/K row permutation (only to show that it matters). Returns the
    file's size in bytes."""
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if head_dim * cfg.num_attention_heads != cfg.hidden_size:
        raise ValueError("flashkv's GGUF loader derives head_dim = hidden_size / num_attention_heads")
    tensors = gguf_tensors(model, permute)
    meta = _Buf()
    n_kv = 0

    def kv(key, t, fmt=None, value=None):
        nonlocal n_kv
        n_kv += 1
        meta.str(key)
        meta.put("I", t)
        if t == GGUF_STRING:
            meta.str(value)
        elif fmt is not None:
            meta.put(fmt, value)

    def kv_array(key, et, items):
        nonlocal n_kv
        n_kv += 1
        meta.str(key)
        meta.put("IIQ", GGUF_ARRAY, et, len(items))
        if et == GGUF_STRING:
            for s in items:
                meta.str(s)
        else:
            meta.b += np.asarray(items, dtype={GGUF_F32: "<f4", GGUF_I32: "<i4"}[et]).tobytes()

    kv("general.architecture", GGUF_STRING, value="llama")
    kv("general.name", GGUF_STRING, value=name)
    kv("general.alignment", GGUF_U32, "I", ALIGN)
    kv("llama.context_length", GGUF_U32, "I", int(context_length or cfg.max_position_embeddings))
    kv("llama.embedding_length", GGUF_U32, "I", cfg.hidden_size)
    kv("llama.block_count", GGUF_U32, "I", cfg.num_hidden_layers)
    kv("llama.feed_forward_length", GGUF_U32, "I", cfg.intermediate_size)
    kv("llama.attention.head_count", GGUF_U32, "I", cfg.num_attention_heads)
    kv("llama.attention.head_count_kv", GGUF_U32, "I", cfg.num_key_value_heads)
    kv("llama.rope.dimension_count", GGUF_U32, "I", head_dim)
    kv("llama.rope.freq_base", GGUF_F32, "f", rope_theta(cfg))
    kv("llama.attention.layer_norm_rms_epsilon", GGUF_F32, "f", float(cfg.rms_norm_eps))
    kv("llama.vocab_size", GGUF_U32, "I", cfg.vocab_size)
    pieces, scores, types = synthetic_vocab(cfg.vocab_size)
    kv("tokenizer.ggml.model", GGUF_STRING, value="llama")
    kv_array("tokenizer.ggml.tokens", GGUF_STRING, pieces)
    kv_array("tokenizer.ggml.scores", GGUF_F32, scores)
    kv_array("tokenizer.ggml.token_type", GGUF_I32, types)
    kv("tokenizer.ggml.unknown_token_id", GGUF_U32, "I", 0)
    kv("tokenizer.ggml.bos_token_id", GGUF_U32, "I", 1)
    kv("tokenizer.ggml.eos_token_id", GGUF_U32, "I", 2)

    head = _Buf()
    head.b += b"GGUF"
    head.put("IQQ", 3, len(tensors), n_kv)
    head.b += meta.b
    sizes, offset = [], 0
    params = dict(model.named_parameters())
    for tname, getter, t in tensors:
        shape = tuple(params[_hf_name(tname, cfg)].shape)
        ne = list(reversed(shape))
        n = int(np.prod(shape))
        head.str(tname)
        head.put("I", len(ne))
        for d in ne:
            head.put("Q", d)
        head.put("IQ", t, offset)
        size = n * (2 if t == GGML_BF16 else 4)
        sizes.append(size)
        offset += (size + ALIGN - 1) // ALIGN * ALIGN
    head.b += b"\0" * (-len(head.b) % ALIGN)
    with open(path, "wb") as f:
        f.write(head.b)
        for (tname, getter, t), size in zip(tensors, sizes):
            w = getter()
            if t == GGML_BF16:
                arr = w.to(torch.bfloat16).contiguous().view(torch.int16).cpu().numpy()
            else:
                arr = w.to(torch.float32).contiguous().cpu().numpy()
            assert arr.nbytes == size, (tname, arr.nbytes, size)
            f.write(memoryview(arr).cast("B"))
            f.write(b"\0" * (-size % ALIGN))
            del w, arr
        return f.tell()


def _hf_name(gguf_name, cfg):
    fixed = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    if gguf_name in fixed:
        return fixed[gguf_name]
    _, l, rest = gguf_name.split(".", 2)
    m = {"attn_norm.weight": "input_layernorm.weight", "attn_q.weight": "self_attn.q_proj.weight",
         "attn_k.weight": "self_attn.k_proj.weight", "attn_v.weight": "self_attn.v_proj.weight",
         "attn_output.weight": "self_attn.o_proj.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
         "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
         "ffn_down.weight": "mlp.down_proj.weight"}
    return f"model.layers.{l}.{m[rest]}"


def weight_bytes_bf16(cfg):
    """Bytes of the bf16 matrices (projections + the classifier, counted once when tied): what a decode step reads."""
    d, h, v, hd = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    per_layer = d * (q + 2 * kv) + q * d + 3 * h * d
    return 2 * (cfg.num_hidden_layers * per_layer + v * d)
