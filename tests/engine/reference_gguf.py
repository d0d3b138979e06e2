"""Independent float64 numpy implementation of a GGUF `llama` model (SmolLM2), for the exactness tests.

Reads the GGUF with gguf_spec.py (own reader and block dequantizers), casts every weight to float64 and runs the
architecture as its definition states, over a whole token sequence at once with an explicit causal mask:
  x = token_embd[t];  per block:  h = rmsnorm(x) * attn_norm;  q, k, v = h Wq^T, h Wk^T, h Wv^T
  RoPE on q, k: GGUF `llama` stores Q/K so that ggml's "normal" rope applies — pairs (2i, 2i+1) of each head rotated by
  pos * rope_theta^(-2i/head_dim);  attention per head (GQA: head h reads kv head h // (n_head / n_head_kv)),
  scores = q k^T / sqrt(head_dim) masked to j <= i, softmax, times v;  x += out Wo^T
  h = rmsnorm(x) * ffn_norm;  x += (silu(h Wgate^T) * (h Wup^T)) Wdown^T
  logits = rmsnorm(x) * output_norm  (output.weight, or token_embd.weight when it is absent: tied)
rmsnorm(x) = x / sqrt(mean(x^2) + eps). Shares no code with flashkv.

Also builds a Hugging Face `tokenizers` BPE tokenizer from the GGUF's vocabulary (tokens, merges, control tokens) with
the pre-tokenizer the GGUF names (smollm = Digits(individual_digits) + ByteLevel), the independent tokenizer check.
"""
import numpy as np

import gguf_spec


class Model:
    def __init__(self, path):
        g = gguf_spec.GGUF(path)
        self.g = g
        m = g.meta
        assert m["general.architecture"] == "llama"
        self.dim = m["llama.embedding_length"]
        self.n_layers = m["llama.block_count"]
        self.n_heads = m["llama.attention.head_count"]
        self.n_kv = m["llama.attention.head_count_kv"]
        self.hd = self.dim // self.n_heads
        self.theta = float(m["llama.rope.freq_base"])
        self.eps = float(m["llama.attention.layer_norm_rms_epsilon"])
        self.ctx = m["llama.context_length"]
        f64 = lambda name: g.tensor(name).astype(np.float64)  # noqa: E731
        self.emb = f64("token_embd.weight")  # [vocab, dim]
        self.out = f64("output.weight") if "output.weight" in g.infos else self.emb
        self.final_norm = f64("output_norm.weight")
        self.layers = []
        for l in range(self.n_layers):
            p = f"blk.{l}."
            self.layers.append({k: f64(p + k + ".weight") for k in (
                "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")})

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):
        """x [T, heads, hd]; rotate pairs (2i, 2i+1) by pos * theta^(-2i/hd)."""
        i = np.arange(self.hd // 2, dtype=np.float64)
        ang = pos[:, None].astype(np.float64) * self.theta ** (-2.0 * i / self.hd)  # [T, hd/2]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    def logits(self, tokens, rows):
        """float64 logits [len(rows), vocab] at positions `rows` of the causal forward over `tokens`."""
        T = len(tokens)
        x = self.emb[np.asarray(tokens)]
        pos = np.arange(T)
        mask = pos[None, :] <= pos[:, None]  # [query, key]: key j visible to query i iff j <= i
        rep = self.n_heads // self.n_kv
        for L in self.layers:
            h = self.rmsnorm(x, L["attn_norm"])
            q = self.rope((h @ L["attn_q"].T).reshape(T, self.n_heads, self.hd), pos)
            k = self.rope((h @ L["attn_k"].T).reshape(T, self.n_kv, self.hd), pos)
            v = (h @ L["attn_v"].T).reshape(T, self.n_kv, self.hd)
            att = np.empty((T, self.n_heads, self.hd))
            for hh in range(self.n_heads):
                kv = hh // rep
                s = (q[:, hh, :] @ k[:, kv, :].T) / np.sqrt(self.hd)
                s = np.where(mask, s, -np.inf)
                s = np.exp(s - s.max(axis=1, keepdims=True))
                att[:, hh, :] = (s / s.sum(axis=1, keepdims=True)) @ v[:, kv, :]
            x = x + att.reshape(T, self.dim) @ L["attn_output"].T
            h = self.rmsnorm(x, L["ffn_norm"])
            g = h @ L["ffn_gate"].T
            x = x + ((g / (1.0 + np.exp(-g))) * (h @ L["ffn_up"].T)) @ L["ffn_down"].T
        return self.rmsnorm(x[np.asarray(rows)], self.final_norm) @ self.out.T


def hf_tokenizer(path_or_gguf):
    """A Hugging Face `tokenizers` Tokenizer from the GGUF's vocabulary (byte-level BPE, smollm or gpt2 pre-tokenizer)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    g = path_or_gguf if isinstance(path_or_gguf, gguf_spec.GGUF) else gguf_spec.GGUF(path_or_gguf)
    m = g.meta
    assert m["tokenizer.ggml.model"] == "gpt2"
    tokens = m["tokenizer.ggml.tokens"]
    types = m.get("tokenizer.ggml.token_type", [1] * len(tokens))
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(x.split(" ")) for x in m["tokenizer.ggml.merges"]]
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    pre = m.get("tokenizer.ggml.pre", "gpt2")
    if pre == "smollm":
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in ("gpt2", "default"):
        tk.pre_tokenizer = byte_level
    else:
        raise ValueError(f"pre-tokenizer {pre}")
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty in (3, 4)])
    return tk
