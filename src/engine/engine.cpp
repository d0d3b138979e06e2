// The inference engine: Llama forward pass on the CPU. Prefill uses flashkv::attention_forward (exact tiled causal
// attention, FA2 order) over the fresh K/V and then writes them into the PagedKVCache (quantize-on-write); decode
// appends each new token's K/V and attends over the cache's packed pages (PagedKVCache::attention).
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "flashkv/attention.hpp"
#include "flashkv/engine.hpp"
#include "flashkv/error.hpp"
#include "flashkv/kvcache.hpp"

namespace flashkv {

std::string KVCacheSpec::label() const {
  std::string s = kv_cache_dtype;
  if (residual > 0) s += " r" + std::to_string(residual);
  if (sinks > 0) s += " s" + std::to_string(sinks);
  if (rotate) s += " hadamard";
  return s;
}

namespace {

/// Y[T, out] = X[T, in] · Wᵀ with W row-major [out, in] (BLAS sgemm).
void matmul(const float* x, int t, int in, const float* w, int out, float* y) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
}

/// out = x / sqrt(mean(x²) + eps) · weight, per row of `dim` elements (llama2.c rmsnorm).
void rmsnorm(float* out, const float* x, const float* weight, int dim, float eps) {
  float ss = 0.0f;
  for (int i = 0; i < dim; ++i) ss += x[i] * x[i];
  ss = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
  for (int i = 0; i < dim; ++i) out[i] = weight[i] * (ss * x[i]);
}

}  // namespace

struct Engine::Impl {
  explicit Impl(const Model& m, const KVCacheSpec& spec, int32_t max_sequences, int32_t max_ctx)
      : cache(make_config(m, spec, max_sequences, max_ctx)), max_context(max_ctx) {
    const ModelConfig& c = m.config;
    live.assign(static_cast<std::size_t>(max_sequences), false);
    // Tiny models: attention over a full context is a few microseconds of work, far less than an OpenMP fork/join
    // on a loaded machine, so run it on the calling thread; larger models use the OpenMP default.
    const double attn_flops = 4.0 * c.num_heads * static_cast<double>(c.seq_len) * c.head_dim;
    attention_threads = attn_flops < 4e6 ? 1 : 0;
    const int half = c.head_dim / 2;
    rope_cos.resize(static_cast<std::size_t>(c.seq_len) * half);
    rope_sin.resize(rope_cos.size());
    for (int pos = 0; pos < c.seq_len; ++pos)
      for (int i = 0; i < half; ++i) {
        const float freq = 1.0f / std::pow(c.rope_theta, static_cast<float>(2 * i) / static_cast<float>(c.head_dim));
        const float val = static_cast<float>(pos) * freq;
        rope_cos[static_cast<std::size_t>(pos) * half + i] = std::cos(val);
        rope_sin[static_cast<std::size_t>(pos) * half + i] = std::sin(val);
      }
  }

  static KVCacheConfig make_config(const Model& m, const KVCacheSpec& spec, int32_t max_sequences, int32_t max_ctx) {
    if (max_sequences < 1) throw Error("max_sequences", ">= 1", std::to_string(max_sequences));
    const ModelConfig& c = m.config;
    KVCacheConfig kc;
    kc.num_layers = c.n_layers;
    kc.num_heads_kv = c.num_heads_kv;
    kc.head_dim = c.head_dim;
    kc.with_kv_cache_dtype(spec.kv_cache_dtype);
    kc.page_size = spec.page_size;
    kc.residual_tokens = spec.residual;
    kc.sink_tokens = spec.sinks;
    kc.rotation = spec.rotate ? KVRotation::hadamard : KVRotation::none;
    kc.rotation_seed = spec.rotation_seed;
    const int64_t pages_per_seq = (max_ctx + spec.page_size - 1) / std::max(1, spec.page_size) + 1;
    kc.capacity_pages = pages_per_seq * max_sequences;
    kc.validate();
    return kc;
  }

  void resize(const ModelConfig& c, int t) {
    auto need = [&](std::vector<float>& v, std::size_t n) { if (v.size() < n) v.resize(n); };
    const std::size_t T = static_cast<std::size_t>(t);
    need(x, T * c.dim);
    need(xb, T * c.dim);
    need(q, T * c.num_heads * c.head_dim);
    need(k, T * c.kv_dim());
    need(v, T * c.kv_dim());
    need(att, T * c.num_heads * c.head_dim);
    need(hb, T * c.hidden_dim);
    need(hb2, T * c.hidden_dim);
  }

  /// In-place RoPE (interleaved pairs) of `heads` heads of row `vec` at position pos.
  void rope(float* vec, int heads, int head_dim, int pos) const {
    const int half = head_dim / 2;
    const float* cs = rope_cos.data() + static_cast<std::size_t>(pos) * half;
    const float* sn = rope_sin.data() + static_cast<std::size_t>(pos) * half;
    for (int h = 0; h < heads; ++h) {
      float* p = vec + h * head_dim;
      for (int i = 0; i < half; ++i) {
        const float v0 = p[2 * i], v1 = p[2 * i + 1];
        p[2 * i] = v0 * cs[i] - v1 * sn[i];
        p[2 * i + 1] = v0 * sn[i] + v1 * cs[i];
      }
    }
  }

  PagedKVCache cache;
  int32_t max_context = 0;
  int32_t attention_threads = 0;
  std::vector<bool> live;
  std::vector<float> rope_cos, rope_sin;
  std::vector<float> x, xb, q, k, v, att, hb, hb2;
};

namespace {
int32_t checked_context(const Model& m, int32_t max_context) {
  if (max_context < 0 || max_context > m.config.seq_len)
    throw Error("max_context", "0..seq_len = " + std::to_string(m.config.seq_len) + " tokens (0 = seq_len)",
                std::to_string(max_context));
  return max_context == 0 ? m.config.seq_len : max_context;
}
}  // namespace

Engine::Engine(const Model& model, const KVCacheSpec& spec, int32_t max_sequences, int32_t max_context)
    : model_(model), spec_(spec),
      impl_(std::make_unique<Impl>(model, spec, max_sequences, checked_context(model, max_context))) {}
int32_t Engine::max_context() const { return impl_->max_context; }
Engine::~Engine() = default;

int32_t Engine::add_sequence() {
  for (std::size_t i = 0; i < impl_->live.size(); ++i) {
    if (!impl_->live[i]) {
      impl_->cache.add_sequence(static_cast<int64_t>(i));
      impl_->live[i] = true;
      return static_cast<int32_t>(i);
    }
  }
  throw CapacityError("flashkv: engine holds its maximum of " + std::to_string(impl_->live.size()) + " sequences");
}

void Engine::remove_sequence(int32_t seq) {
  if (seq < 0 || static_cast<std::size_t>(seq) >= impl_->live.size() || !impl_->live[static_cast<std::size_t>(seq)])
    throw Error("seq", "a live sequence id", std::to_string(seq));
  impl_->cache.remove_sequence(seq);
  impl_->live[static_cast<std::size_t>(seq)] = false;
}

int32_t Engine::length(int32_t seq) const {
  if (seq < 0 || static_cast<std::size_t>(seq) >= impl_->live.size() || !impl_->live[static_cast<std::size_t>(seq)])
    throw Error("seq", "a live sequence id", std::to_string(seq));
  return static_cast<int32_t>(impl_->cache.seq_len(seq, 0));
}

KVMemory Engine::memory() const {
  const KVMemoryReport r = impl_->cache.memory_report();
  const ModelConfig& c = model_.config;
  KVMemory m;
  m.bytes = static_cast<std::size_t>(r.total_bytes);
  m.tokens = static_cast<std::size_t>(r.num_tokens);
  m.bytes_per_token = r.num_tokens > 0 ? static_cast<double>(r.total_bytes) / static_cast<double>(r.num_tokens) : 0.0;
  m.effective_bits = r.bits_per_element;
  m.bf16_bytes_per_token = 2.0 * c.n_layers * c.num_heads_kv * c.head_dim * 2.0;
  return m;
}

namespace {
void check_tokens(std::span<const int32_t> tokens, int32_t vocab) {
  for (std::size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab)
      throw Error("tokens[" + std::to_string(i) + "]", "a token id in [0, " + std::to_string(vocab) + ")",
                  std::to_string(tokens[i]));
}

/// Rows [0, t) of the residual stream → logits of the selected rows (final norm + classifier).
void classify(const Model& m, const float* x, int rows, float* xb, float* logits) {
  const ModelConfig& c = m.config;
  for (int r = 0; r < rows; ++r) rmsnorm(xb + r * c.dim, x + r * c.dim, m.final_norm, c.dim, c.norm_eps);
  matmul(xb, rows, c.dim, m.classifier, c.vocab_size, logits);
}

/// SwiGLU feed-forward with residual, rows [0, t).
void ffn(const Model& m, const LayerWeights& L, int t, float* x, float* xb, float* hb, float* hb2) {
  const ModelConfig& c = m.config;
  for (int r = 0; r < t; ++r) rmsnorm(xb + r * c.dim, x + r * c.dim, L.ffn_norm, c.dim, c.norm_eps);
  matmul(xb, t, c.dim, L.w1, c.hidden_dim, hb);
  matmul(xb, t, c.dim, L.w3, c.hidden_dim, hb2);
  const std::size_t n = static_cast<std::size_t>(t) * c.hidden_dim;
  for (std::size_t i = 0; i < n; ++i) {
    const float g = hb[i];
    hb[i] = g * (1.0f / (1.0f + std::exp(-g))) * hb2[i];
  }
  matmul(hb, t, c.hidden_dim, L.w2, c.dim, xb);
  for (std::size_t i = 0; i < static_cast<std::size_t>(t) * c.dim; ++i) x[i] += xb[i];
}
}  // namespace

void Engine::prefill(int32_t seq, std::span<const int32_t> tokens, std::span<float> logits_out, bool all_logits) {
  const Model& m = model_;
  const ModelConfig& c = m.config;
  if (length(seq) != 0) throw Error("seq", "an empty sequence for prefill", std::to_string(length(seq)) + " cached tokens");
  if (tokens.empty()) throw Error("tokens", "at least one token", "0");
  if (tokens.size() > static_cast<std::size_t>(impl_->max_context))
    throw Error("prompt", "at most max_context = " + std::to_string(impl_->max_context) + " tokens", std::to_string(tokens.size()));
  check_tokens(tokens, c.vocab_size);
  const int t = static_cast<int>(tokens.size());
  const std::size_t want = logits_out.empty() ? 0 : static_cast<std::size_t>(all_logits ? t : 1) * c.vocab_size;
  if (!logits_out.empty() && logits_out.size() != want)
    throw Error("logits_out", std::to_string(want) + " floats", std::to_string(logits_out.size()));
  Impl& s = *impl_;
  s.resize(c, t);
  const int D = c.dim, Qd = c.num_heads * c.head_dim, KVd = c.kv_dim();
  for (int r = 0; r < t; ++r)
    std::memcpy(&s.x[static_cast<std::size_t>(r) * D], m.token_embedding + static_cast<std::size_t>(tokens[static_cast<std::size_t>(r)]) * D,
                sizeof(float) * static_cast<std::size_t>(D));
  AttentionOptions opts;
  opts.causal = true;
  opts.num_threads = s.attention_threads;
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = m.layers[static_cast<std::size_t>(l)];
    for (int r = 0; r < t; ++r) rmsnorm(&s.xb[static_cast<std::size_t>(r) * D], &s.x[static_cast<std::size_t>(r) * D], L.attn_norm, D, c.norm_eps);
    matmul(s.xb.data(), t, D, L.wq, Qd, s.q.data());
    matmul(s.xb.data(), t, D, L.wk, KVd, s.k.data());
    matmul(s.xb.data(), t, D, L.wv, KVd, s.v.data());
    for (int r = 0; r < t; ++r) {
      s.rope(&s.q[static_cast<std::size_t>(r) * Qd], c.num_heads, c.head_dim, r);
      s.rope(&s.k[static_cast<std::size_t>(r) * KVd], c.num_heads_kv, c.head_dim, r);
    }
    auto qv = TensorView::contiguous(s.q.data(), DType::float32, {1, t, c.num_heads, c.head_dim});
    auto kv = TensorView::contiguous(s.k.data(), DType::float32, {1, t, c.num_heads_kv, c.head_dim});
    auto vv = TensorView::contiguous(s.v.data(), DType::float32, {1, t, c.num_heads_kv, c.head_dim});
    auto ov = TensorView::contiguous(s.att.data(), DType::float32, {1, t, c.num_heads, c.head_dim});
    attention_forward(qv, kv, vv, ov, nullptr, opts);
    s.cache.append(seq, l, TensorView::contiguous(s.k.data(), DType::float32, {t, c.num_heads_kv, c.head_dim}),
                   TensorView::contiguous(s.v.data(), DType::float32, {t, c.num_heads_kv, c.head_dim}));
    matmul(s.att.data(), t, Qd, L.wo, D, s.xb.data());
    for (std::size_t i = 0; i < static_cast<std::size_t>(t) * D; ++i) s.x[i] += s.xb[i];
    ffn(m, L, t, s.x.data(), s.xb.data(), s.hb.data(), s.hb2.data());
  }
  if (logits_out.empty()) return;
  const int first = all_logits ? 0 : t - 1;
  classify(m, &s.x[static_cast<std::size_t>(first) * D], t - first, s.xb.data(), logits_out.data());
}

void Engine::extend(int32_t seq, std::span<const int32_t> tokens, std::span<float> logits_out, bool all_logits) {
  const Model& m = model_;
  const ModelConfig& c = m.config;
  const int32_t pos0 = length(seq);
  if (tokens.empty()) throw Error("tokens", "at least one token", "0");
  if (static_cast<int64_t>(pos0) + static_cast<int64_t>(tokens.size()) > impl_->max_context)
    throw Error("tokens", "at most max_context - cached = " + std::to_string(impl_->max_context - pos0) + " tokens",
                std::to_string(tokens.size()) + " (" + std::to_string(pos0) + " already cached)");
  check_tokens(tokens, c.vocab_size);
  const int t = static_cast<int>(tokens.size());
  const std::size_t want = logits_out.empty() ? 0 : static_cast<std::size_t>(all_logits ? t : 1) * c.vocab_size;
  if (!logits_out.empty() && logits_out.size() != want)
    throw Error("logits_out", std::to_string(want) + " floats", std::to_string(logits_out.size()));
  Impl& s = *impl_;
  s.resize(c, t);
  const int D = c.dim, Qd = c.num_heads * c.head_dim, KVd = c.kv_dim();
  for (int r = 0; r < t; ++r)
    std::memcpy(&s.x[static_cast<std::size_t>(r) * D], m.token_embedding + static_cast<std::size_t>(tokens[static_cast<std::size_t>(r)]) * D,
                sizeof(float) * static_cast<std::size_t>(D));
  KVAttentionOptions kv_opts;
  kv_opts.num_threads = s.attention_threads;
  const int64_t ids[1] = {seq};
  const int32_t cu[2] = {0, t};
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = m.layers[static_cast<std::size_t>(l)];
    for (int r = 0; r < t; ++r) rmsnorm(&s.xb[static_cast<std::size_t>(r) * D], &s.x[static_cast<std::size_t>(r) * D], L.attn_norm, D, c.norm_eps);
    matmul(s.xb.data(), t, D, L.wq, Qd, s.q.data());
    matmul(s.xb.data(), t, D, L.wk, KVd, s.k.data());
    matmul(s.xb.data(), t, D, L.wv, KVd, s.v.data());
    for (int r = 0; r < t; ++r) {
      s.rope(&s.q[static_cast<std::size_t>(r) * Qd], c.num_heads, c.head_dim, pos0 + r);
      s.rope(&s.k[static_cast<std::size_t>(r) * KVd], c.num_heads_kv, c.head_dim, pos0 + r);
    }
    s.cache.append(seq, l, TensorView::contiguous(s.k.data(), DType::float32, {t, c.num_heads_kv, c.head_dim}),
                   TensorView::contiguous(s.v.data(), DType::float32, {t, c.num_heads_kv, c.head_dim}));
    s.cache.attention(ids, cu, l, TensorView::contiguous(s.q.data(), DType::float32, {t, c.num_heads, c.head_dim}),
                      TensorView::contiguous(s.att.data(), DType::float32, {t, c.num_heads, c.head_dim}), nullptr,
                      kv_opts);
    matmul(s.att.data(), t, Qd, L.wo, D, s.xb.data());
    for (std::size_t i = 0; i < static_cast<std::size_t>(t) * D; ++i) s.x[i] += s.xb[i];
    ffn(m, L, t, s.x.data(), s.xb.data(), s.hb.data(), s.hb2.data());
  }
  if (logits_out.empty()) return;
  const int first = all_logits ? 0 : t - 1;
  classify(m, &s.x[static_cast<std::size_t>(first) * D], t - first, s.xb.data(), logits_out.data());
}

void Engine::decode(std::span<const int32_t> seqs, std::span<const int32_t> tokens, std::span<float> logits_out) {
  const Model& m = model_;
  const ModelConfig& c = m.config;
  if (seqs.empty()) throw Error("seqs", "at least one sequence", "0");
  if (tokens.size() != seqs.size())
    throw Error("tokens", std::to_string(seqs.size()) + " tokens (one per sequence)", std::to_string(tokens.size()));
  if (logits_out.size() != seqs.size() * static_cast<std::size_t>(c.vocab_size))
    throw Error("logits_out", std::to_string(seqs.size() * static_cast<std::size_t>(c.vocab_size)) + " floats",
                std::to_string(logits_out.size()));
  check_tokens(tokens, c.vocab_size);
  const int b = static_cast<int>(seqs.size());
  std::vector<int32_t> pos(seqs.size());
  std::vector<int64_t> ids(seqs.size());
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    pos[i] = length(seqs[i]);
    ids[i] = seqs[i];
    if (pos[i] >= impl_->max_context)
      throw Error("seqs[" + std::to_string(i) + "]", "a sequence shorter than max_context = " + std::to_string(impl_->max_context),
                  std::to_string(pos[i]) + " cached tokens (context full)");
    for (std::size_t j = 0; j < i; ++j)
      if (seqs[j] == seqs[i]) throw Error("seqs", "distinct sequence ids", "id " + std::to_string(seqs[i]) + " twice");
  }
  Impl& s = *impl_;
  s.resize(c, b);
  const int D = c.dim, Qd = c.num_heads * c.head_dim, KVd = c.kv_dim();
  for (int r = 0; r < b; ++r)
    std::memcpy(&s.x[static_cast<std::size_t>(r) * D], m.token_embedding + static_cast<std::size_t>(tokens[static_cast<std::size_t>(r)]) * D,
                sizeof(float) * static_cast<std::size_t>(D));
  KVAttentionOptions kv_opts;
  kv_opts.num_threads = s.attention_threads;
  std::vector<int32_t> cu(seqs.size() + 1);
  for (int r = 0; r <= b; ++r) cu[static_cast<std::size_t>(r)] = r;
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = m.layers[static_cast<std::size_t>(l)];
    for (int r = 0; r < b; ++r) rmsnorm(&s.xb[static_cast<std::size_t>(r) * D], &s.x[static_cast<std::size_t>(r) * D], L.attn_norm, D, c.norm_eps);
    matmul(s.xb.data(), b, D, L.wq, Qd, s.q.data());
    matmul(s.xb.data(), b, D, L.wk, KVd, s.k.data());
    matmul(s.xb.data(), b, D, L.wv, KVd, s.v.data());
    for (int r = 0; r < b; ++r) {
      s.rope(&s.q[static_cast<std::size_t>(r) * Qd], c.num_heads, c.head_dim, pos[static_cast<std::size_t>(r)]);
      s.rope(&s.k[static_cast<std::size_t>(r) * KVd], c.num_heads_kv, c.head_dim, pos[static_cast<std::size_t>(r)]);
      s.cache.append(ids[static_cast<std::size_t>(r)], l,
                     TensorView::contiguous(&s.k[static_cast<std::size_t>(r) * KVd], DType::float32, {1, c.num_heads_kv, c.head_dim}),
                     TensorView::contiguous(&s.v[static_cast<std::size_t>(r) * KVd], DType::float32, {1, c.num_heads_kv, c.head_dim}));
    }
    s.cache.attention(ids, cu, l, TensorView::contiguous(s.q.data(), DType::float32, {b, c.num_heads, c.head_dim}),
                      TensorView::contiguous(s.att.data(), DType::float32, {b, c.num_heads, c.head_dim}), nullptr,
                      kv_opts);
    matmul(s.att.data(), b, Qd, L.wo, D, s.xb.data());
    for (std::size_t i = 0; i < static_cast<std::size_t>(b) * D; ++i) s.x[i] += s.xb[i];
    ffn(m, L, b, s.x.data(), s.xb.data(), s.hb.data(), s.hb2.data());
  }
  classify(m, s.x.data(), b, s.xb.data(), logits_out.data());
}

}  // namespace flashkv
