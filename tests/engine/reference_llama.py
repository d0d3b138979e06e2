"""Independent float32 numpy implementation of the llama2.c architecture (run.c semantics), for exactness tests.

Reads the llama2.c legacy checkpoint and tokenizer files directly with numpy/struct; shares no code with flashkv.
Architecture: token embedding → L × [RMSNorm → q/k/v → RoPE (interleaved pairs, theta 10000) → causal GQA attention →
wo → residual; RMSNorm → SwiGLU (w2(silu(w1 x) * w3 x)) → residual] → RMSNorm → classifier (shared embedding).
"""
import struct

import numpy as np


class Checkpoint:
    def __init__(self, path):
        raw = open(path, "rb").read()
        dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack("7i", raw[:28])
        self.shared = vocab > 0
        vocab = abs(vocab)
        self.dim, self.hidden, self.n_layers, self.n_heads, self.n_kv = dim, hidden, n_layers, n_heads, n_kv
        self.vocab, self.seq_len = vocab, seq_len
        self.head_size = dim // n_heads
        w = np.frombuffer(raw, dtype=np.float32, offset=28)
        off = 0

        def take(*shape):
            nonlocal off
            n = int(np.prod(shape))
            a = w[off:off + n].reshape(shape)
            off += n
            return a

        kv_dim = n_kv * self.head_size
        self.emb = take(vocab, dim)
        self.rms_att = take(n_layers, dim)
        self.wq = take(n_layers, dim, dim)
        self.wk = take(n_layers, kv_dim, dim)
        self.wv = take(n_layers, kv_dim, dim)
        self.wo = take(n_layers, dim, dim)
        self.rms_ffn = take(n_layers, dim)
        self.w1 = take(n_layers, hidden, dim)
        self.w2 = take(n_layers, dim, hidden)
        self.w3 = take(n_layers, hidden, dim)
        self.rms_final = take(dim)
        take(seq_len * self.head_size)  # freq_cis real + imag (unused)
        self.wcls = self.emb if self.shared else take(vocab, dim)
        assert off == w.size, "checkpoint size mismatch"


def rmsnorm(x, w):
    ss = np.float32(np.mean(x * x, dtype=np.float32)) + np.float32(1e-5)
    return (w * (x / np.sqrt(ss))).astype(np.float32)


def rope(vec, pos, head_size):
    out = vec.copy()
    i = np.arange(0, vec.size, 2)
    freq = (1.0 / np.power(np.float32(10000.0), (i % head_size).astype(np.float32) / np.float32(head_size))).astype(np.float32)
    ang = (np.float32(pos) * freq).astype(np.float32)
    c, s = np.cos(ang), np.sin(ang)
    v0, v1 = vec[0::2], vec[1::2]
    out[0::2] = v0 * c - v1 * s
    out[1::2] = v0 * s + v1 * c
    return out


class Runner:
    """Token-at-a-time forward with a float32 K/V cache, exactly the order of llama2.c's forward()."""

    def __init__(self, ck):
        self.ck = ck
        kv_dim = ck.n_kv * ck.head_size
        self.k = np.zeros((ck.n_layers, ck.seq_len, kv_dim), np.float32)
        self.v = np.zeros((ck.n_layers, ck.seq_len, kv_dim), np.float32)

    def forward(self, token, pos):
        ck = self.ck
        hs, rep = ck.head_size, ck.n_heads // ck.n_kv
        x = ck.emb[token].astype(np.float32).copy()
        for l in range(ck.n_layers):
            xb = rmsnorm(x, ck.rms_att[l])
            q = rope(ck.wq[l] @ xb, pos, hs)
            self.k[l, pos] = rope(ck.wk[l] @ xb, pos, hs)
            self.v[l, pos] = ck.wv[l] @ xb
            att_out = np.zeros(ck.dim, np.float32)
            for h in range(ck.n_heads):
                kvh = h // rep
                qh = q[h * hs:(h + 1) * hs]
                keys = self.k[l, :pos + 1, kvh * hs:(kvh + 1) * hs]
                vals = self.v[l, :pos + 1, kvh * hs:(kvh + 1) * hs]
                scores = (keys @ qh) / np.sqrt(np.float32(hs))
                scores = np.exp(scores - scores.max())
                scores = scores / scores.sum()
                att_out[h * hs:(h + 1) * hs] = scores @ vals
            x = x + ck.wo[l] @ att_out
            xb = rmsnorm(x, ck.rms_ffn[l])
            h1 = ck.w1[l] @ xb
            h3 = ck.w3[l] @ xb
            x = x + ck.w2[l] @ ((h1 / (np.float32(1.0) + np.exp(-h1))) * h3)
        return ck.wcls @ rmsnorm(x, ck.rms_final)


def greedy(ck, prompt_tokens, steps):
    """llama2.c generate(): feed the prompt, then argmax; stop at BOS (1) or EOS (2). Returns generated tokens."""
    r = Runner(ck)
    out = []
    token = prompt_tokens[0]
    pos = 0
    while pos < ck.seq_len:
        logits = r.forward(token, pos)
        if pos < len(prompt_tokens) - 1:
            token = prompt_tokens[pos + 1]
        else:
            nxt = int(np.argmax(logits))
            if nxt in (1, 2) or len(out) >= steps:
                break
            out.append(nxt)
            token = nxt
        pos += 1
    return out


class Tokenizer:
    """llama2.c tokenizer: BPE merges by score, dummy prefix, byte fallback <0xXX> (= byte + 3)."""

    def __init__(self, path, vocab):
        raw = open(path, "rb").read()
        off = 4
        self.pieces, self.scores = [], []
        for _ in range(vocab):
            score, n = struct.unpack("fi", raw[off:off + 8])
            off += 8
            self.pieces.append(raw[off:off + n])
            self.scores.append(score)
            off += n
        self.index = {}
        for i, p in enumerate(self.pieces):
            self.index.setdefault(p, i)

    def encode(self, text):
        data = text.encode("utf-8")
        toks = [1]
        body = [self.index[b" "]] if data else []
        for ch in text:
            b = ch.encode("utf-8")
            if b in self.index:
                body.append(self.index[b])
            else:
                body.extend(x + 3 for x in b)
        while True:
            best, best_i, best_id = None, -1, -1
            for i in range(len(body) - 1):
                cand = self.pieces[body[i]] + self.pieces[body[i + 1]]
                j = self.index.get(cand)
                if j is not None and (best is None or self.scores[j] > best):
                    best, best_i, best_id = self.scores[j], i, j
            if best_id < 0:
                break
            body[best_i:best_i + 2] = [best_id]
        return toks + body
