// The inference engine: Llama forward pass on the CPU over a batch of "segments" (consecutive tokens of one sequence).
//   prefill  one segment at position 0: flashkv::attention_forward (exact tiled causal attention, FA2 order) over the
//            fresh float32 K/V, then K/V written into the PagedKVCache (quantize-on-write);
//   extend   one segment anywhere: K/V written into the cache first, then the segment's queries attend over the cache
//            (PagedKVCache::attention, causal, bottom-right aligned) — chunked prefill through the (quantized) cache;
//   decode   one token for each of B sequences, through the cache like extend.
// Matrix products: cblas_sgemm over all rows of the batch (cblas_sgemv for a single row), threaded by OpenBLAS.
// EngineOptions::bf16_activations rounds the activations to 16 bits where the CUDA engine does (its arithmetic
// emulated on the CPU); float32 otherwise.
// The Engine itself (argument checks, sequence ids, page budget) dispatches to a backend (engine_backend.hpp): the CPU
// one here, or the CUDA one (src/engine/cuda/) when EngineOptions::device is cuda.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "core/float16.hpp"
#include "engine/blas.hpp"
#include "engine/engine_backend.hpp"
#include "engine/synthetic_kv.hpp"
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

/// Y[T, out] = X[T, in] · Wᵀ with W row-major [out, in]: OpenBLAS (engine_detail::blas(); its own threads).
void matmul(const float* x, int t, int in, const float* w, int out, float* y) {
  const engine_detail::Blas& b = engine_detail::blas();
  if (t == 1)
    b.sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.0f, w, in, x, 1, 0.0f, y, 1);
  else
    b.sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
}

/// out = x / sqrt(mean(x²) + eps) · weight, per row of `dim` elements (sum of squares accumulated in double).
void rmsnorm(float* out, const float* x, const float* weight, int dim, float eps) {
  double ss = 0.0;
  for (int i = 0; i < dim; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / dim + static_cast<double>(eps)));
  for (int i = 0; i < dim; ++i) out[i] = weight[i] * (inv * x[i]);
}

void check_tokens(std::span<const int32_t> tokens, int32_t vocab) {
  for (std::size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab)
      throw Error("tokens[" + std::to_string(i) + "]", "a token id in [0, " + std::to_string(vocab) + ")",
                  std::to_string(tokens[i]));
}

using Segment = engine_detail::Segment;

/// The CPU backend: float32 weights from the Model, OpenBLAS, the host PagedKVCache.
class CpuEngine final : public engine_detail::EngineBackend {
 public:
  CpuEngine(const Model& m, const KVCacheConfig& kc, int32_t ctx, bool bf16_activations)
      : model(m), context(ctx), kvc(kc), round16(bf16_activations), fp16_qkv(kc.k_format.format == KVFormat::fp16) {
    engine_detail::rope_tables(m.config, context, rope_cos, rope_sin);
  }
  PagedKVCache& cache() override { return kvc; }
  const PagedKVCache& cache() const override { return kvc; }

  void run(std::span<const Segment> segs, std::span<const int32_t> tokens, bool fresh, int32_t first, int32_t rows,
           std::span<float> logits_out) override {
    forward(model, segs, tokens, fresh);
    last_logits.resize(static_cast<std::size_t>(rows) * model.config.vocab_size);
    classify(model, first, rows, last_logits.data());
    if (!logits_out.empty()) std::copy(last_logits.begin(), last_logits.end(), logits_out.begin());
  }

  std::vector<int32_t> sample(std::span<Sampler* const> samplers, int32_t row0) override {
    const std::size_t V = static_cast<std::size_t>(model.config.vocab_size);
    std::vector<int32_t> out(samplers.size());
    for (std::size_t i = 0; i < samplers.size(); ++i)
      out[i] = samplers[i]->sample(std::span<const float>(last_logits).subspan((row0 + i) * V, V));
    return out;
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

  /// EngineOptions::bf16_activations: n values rounded in place to bf16 (fp16: to float16), as the CUDA engine stores
  /// them; nothing otherwise.
  void round_bf16(float* p, std::size_t n) const {
    if (!round16) return;
    for (std::size_t i = 0; i < n; ++i) p[i] = bf16_to_float(float_to_bf16(p[i]));
  }
  /// q / k / v and the attention output: the CUDA engine's attention dtype (fp16 with an fp16 cache, bf16 otherwise).
  void round_attention_dtype(float* p, std::size_t n) const {
    if (!round16) return;
    if (!fp16_qkv) return round_bf16(p, n);
    for (std::size_t i = 0; i < n; ++i) p[i] = fp16_to_float(float_to_fp16(p[i]));
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

  /// The forward pass over all rows of `segs` (tokens in row order). fresh_attention: a single segment at position 0
  /// attended with attention_forward before its K/V go into the cache; otherwise K/V are appended first and every
  /// row attends over the cache. Leaves the final residual stream in x.
  void forward(const Model& m, std::span<const Segment> segs, std::span<const int32_t> tokens, bool fresh_attention) {
    const ModelConfig& c = m.config;
    const int t = static_cast<int>(tokens.size());
    resize(c, t);
    const int D = c.dim, Qd = c.num_heads * c.head_dim, KVd = c.kv_dim(), H = c.hidden_dim;
    for (int r = 0; r < t; ++r)
      std::memcpy(&x[static_cast<std::size_t>(r) * D],
                  m.token_embedding + static_cast<std::size_t>(tokens[static_cast<std::size_t>(r)]) * D,
                  sizeof(float) * static_cast<std::size_t>(D));
    std::vector<int64_t> ids(segs.size());
    std::vector<int32_t> cu(segs.size() + 1, 0);
    for (std::size_t i = 0; i < segs.size(); ++i) {
      ids[i] = segs[i].seq;
      cu[i + 1] = cu[i] + segs[i].n;
    }
    // Attention runs on the calling thread unless one call is >= 8 GFLOP (long prompts, thousands of tokens). Idle
    // OpenMP workers spin without yielding and starve OpenBLAS's threads (the matmuls): measured on the shared 2-core
    // machine, OpenMP attention made decode at 2k-4k context 5-10x slower (1.1 vs 6.9 tok/s) and 512-token chunks
    // over a 2k history 20% slower, while a single thread loses at most 2x on the attention share when the machine is
    // idle.
    double attn_flops = 0;
    for (const Segment& s : segs) attn_flops += 4.0 * c.num_heads * c.head_dim * s.n * static_cast<double>(s.pos0 + s.n);
    const int32_t attention_threads = attn_flops < 8e9 ? 1 : 0;
    AttentionOptions opts;
    opts.causal = true;
    opts.num_threads = attention_threads;
    KVAttentionOptions kv_opts;
    kv_opts.causal = true;
    kv_opts.num_threads = attention_threads;
    for (int32_t l = 0; l < c.n_layers; ++l) {
      const LayerWeights& L = m.layers[static_cast<std::size_t>(l)];
      for (int r = 0; r < t; ++r)
        rmsnorm(&xb[static_cast<std::size_t>(r) * D], &x[static_cast<std::size_t>(r) * D], L.attn_norm, D, c.norm_eps);
      round_bf16(xb.data(), static_cast<std::size_t>(t) * D);
      matmul(xb.data(), t, D, L.wq, Qd, q.data());
      matmul(xb.data(), t, D, L.wk, KVd, k.data());
      matmul(xb.data(), t, D, L.wv, KVd, v.data());
      for (const Segment& s : segs)
        for (int i = 0; i < s.n; ++i) {
          const std::size_t r = static_cast<std::size_t>(s.row0 + i);
          rope(&q[r * Qd], c.num_heads, c.head_dim, s.pos0 + i);
          rope(&k[r * KVd], c.num_heads_kv, c.head_dim, s.pos0 + i);
        }
      round_attention_dtype(q.data(), static_cast<std::size_t>(t) * Qd);
      round_attention_dtype(k.data(), static_cast<std::size_t>(t) * KVd);
      round_attention_dtype(v.data(), static_cast<std::size_t>(t) * KVd);
      auto kv_rows = [&](std::vector<float>& buf, const Segment& s) {
        return TensorView::contiguous(&buf[static_cast<std::size_t>(s.row0) * KVd], DType::float32,
                                      {s.n, c.num_heads_kv, c.head_dim});
      };
      if (fresh_attention) {
        auto qv = TensorView::contiguous(q.data(), DType::float32, {1, t, c.num_heads, c.head_dim});
        auto kv = TensorView::contiguous(k.data(), DType::float32, {1, t, c.num_heads_kv, c.head_dim});
        auto vv = TensorView::contiguous(v.data(), DType::float32, {1, t, c.num_heads_kv, c.head_dim});
        auto ov = TensorView::contiguous(att.data(), DType::float32, {1, t, c.num_heads, c.head_dim});
        attention_forward(qv, kv, vv, ov, nullptr, opts);
        kvc.append(segs[0].seq, l, kv_rows(k, segs[0]), kv_rows(v, segs[0]));
      } else {
        for (const Segment& s : segs) kvc.append(s.seq, l, kv_rows(k, s), kv_rows(v, s));
        kvc.attention(ids, cu, l, TensorView::contiguous(q.data(), DType::float32, {t, c.num_heads, c.head_dim}),
                        TensorView::contiguous(att.data(), DType::float32, {t, c.num_heads, c.head_dim}), nullptr,
                        kv_opts);
      }
      round_attention_dtype(att.data(), static_cast<std::size_t>(t) * Qd);
      round_bf16(att.data(), static_cast<std::size_t>(t) * Qd);  // fp16 output: converted to bf16 for Wo
      matmul(att.data(), t, Qd, L.wo, D, xb.data());
      for (std::size_t i = 0; i < static_cast<std::size_t>(t) * D; ++i) x[i] += xb[i];
      // SwiGLU feed-forward with residual.
      for (int r = 0; r < t; ++r)
        rmsnorm(&xb[static_cast<std::size_t>(r) * D], &x[static_cast<std::size_t>(r) * D], L.ffn_norm, D, c.norm_eps);
      round_bf16(xb.data(), static_cast<std::size_t>(t) * D);
      matmul(xb.data(), t, D, L.w1, H, hb.data());
      matmul(xb.data(), t, D, L.w3, H, hb2.data());
      const std::size_t n = static_cast<std::size_t>(t) * H;
      for (std::size_t i = 0; i < n; ++i) {
        const float g = hb[i];
        hb[i] = g * (1.0f / (1.0f + std::exp(-g))) * hb2[i];
      }
      round_bf16(hb.data(), n);
      matmul(hb.data(), t, H, L.w2, D, xb.data());
      for (std::size_t i = 0; i < static_cast<std::size_t>(t) * D; ++i) x[i] += xb[i];
    }
  }

  /// Logits of rows [first, first + rows) of x (final norm + classifier) into `logits`.
  void classify(const Model& m, int first, int rows, float* logits) {
    const ModelConfig& c = m.config;
    const std::size_t D = static_cast<std::size_t>(c.dim);
    for (int r = 0; r < rows; ++r)
      rmsnorm(&xb[static_cast<std::size_t>(r) * D], &x[static_cast<std::size_t>(first + r) * D], m.final_norm, c.dim,
              c.norm_eps);
    round_bf16(xb.data(), static_cast<std::size_t>(rows) * D);
    matmul(xb.data(), rows, c.dim, m.classifier, c.vocab_size, logits);
  }

  const Model& model;
  int32_t context;
  PagedKVCache kvc;
  bool round16;   ///< EngineOptions::bf16_activations
  bool fp16_qkv;  ///< an fp16 cache: q / k / v / attention output in float16 (as the CUDA engine) when round16
  std::vector<float> rope_cos, rope_sin;
  std::vector<float> x, xb, q, k, v, att, hb, hb2;
  std::vector<float> last_logits;  ///< [rows, vocab] of the last run
};

std::atomic<engine_detail::CudaEngineFactory> g_cuda_factory{nullptr};

}  // namespace

namespace engine_detail {
void EngineBackend::append_synthetic(int32_t seq, int32_t pos0, int32_t n, uint64_t seed) {
  const KVCacheConfig& c = cache().config();
  const int32_t H = c.num_heads_kv, d = c.head_dim, L = c.num_layers;
  const int32_t chunk = std::min(n, 4096);
  std::vector<float> k(static_cast<std::size_t>(chunk) * H * d), v(k.size());
  for (int32_t p0 = 0; p0 < n; p0 += chunk) {
    const int32_t m = std::min(chunk, n - p0);
    for (int32_t l = 0; l < L; ++l) {
      std::size_t i = 0;
      for (int32_t t = 0; t < m; ++t)
        for (int32_t h = 0; h < H; ++h)
          for (int32_t e = 0; e < d; ++e, ++i) {
            k[i] = synthetic_kv_value(seed, 0, l, pos0 + p0 + t, h, e, L, H, d);
            v[i] = synthetic_kv_value(seed, 1, l, pos0 + p0 + t, h, e, L, H, d);
          }
      cache().append(seq, l, TensorView::contiguous(k.data(), DType::float32, {m, H, d}),
                     TensorView::contiguous(v.data(), DType::float32, {m, H, d}));
    }
  }
}

void register_cuda_engine(CudaEngineFactory factory) { g_cuda_factory.store(factory); }
CudaEngineFactory cuda_engine_factory() { return g_cuda_factory.load(); }

void rope_tables(const ModelConfig& c, int32_t context, std::vector<float>& cos_out, std::vector<float>& sin_out) {
  // angle pos · theta^(−2i/head_dim) in double, then cos / sin rounded to float.
  const int half = c.head_dim / 2;
  cos_out.assign(static_cast<std::size_t>(context) * half, 0.0f);
  sin_out.assign(cos_out.size(), 0.0f);
  for (int i = 0; i < half; ++i) {
    const double freq = std::pow(static_cast<double>(c.rope_theta), -2.0 * i / c.head_dim);
    for (int pos = 0; pos < context; ++pos) {
      const double val = pos * freq;
      cos_out[static_cast<std::size_t>(pos) * half + i] = static_cast<float>(std::cos(val));
      sin_out[static_cast<std::size_t>(pos) * half + i] = static_cast<float>(std::sin(val));
    }
  }
}
}  // namespace engine_detail

/// The engine's bookkeeping over its backend.
struct Engine::Impl {
  int32_t context = 0;
  int32_t page_size = 0;
  int32_t sinks = 0, residual = 0, group = 1;  ///< the cache's windows and KIVI group (pages_for)
  std::vector<bool> live;
  std::unique_ptr<engine_detail::EngineBackend> backend;
  int32_t kept_rows = 0;  ///< logit rows of the last call (0 before any)
  int32_t sample_row0 = 0;
  PagedKVCache& cache() { return backend->cache(); }

  /// Pages a sequence of `len` tokens holds: its quantized stream n_q = round_down(max(0, len − S − R), Gq) in pages
  /// of page_size (flashkv/kvcache.hpp, TOKENS AND WINDOWS).
  int64_t pages_for(int64_t len) const {
    int64_t nq = std::max<int64_t>(0, len - sinks - residual);
    nq -= nq % group;
    return (nq + page_size - 1) / page_size;
  }
  /// CapacityError unless the pool has the pages that growing each (seq, from, to) needs — before anything runs.
  void reserve(std::span<const Segment> segs) {
    int64_t need = 0;
    for (const Segment& s : segs) need += pages_for(s.pos0 + s.n) - pages_for(s.pos0);
    const int64_t free = cache().free_pages();
    if (need > free)
      throw CapacityError("flashkv: the engine's KV pool lacks pages: this call needs " + std::to_string(need) +
                          " new pages of " + std::to_string(page_size) + " tokens, " + std::to_string(free) +
                          " are free (remove a sequence or raise kv_capacity_pages); nothing computed or written");
  }
};

KVCacheConfig kv_cache_config(const ModelConfig& c, const KVCacheSpec& spec) {
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
  return kc;
}

namespace {
KVCacheConfig make_cache_config(const Model& m, const KVCacheSpec& spec, int32_t max_sequences, int32_t context,
                                const EngineOptions& o) {
  if (max_sequences < 1) throw Error("max_sequences", ">= 1", std::to_string(max_sequences));
  const ModelConfig& c = m.config;
  if (context < 1 || context > c.seq_len)
    throw Error("max_context", "a context in [1, " + std::to_string(c.seq_len) + "] (the model's) or 0",
                std::to_string(context));
  if (o.kv_capacity_pages < 0)
    throw Error("options.kv_capacity_pages", ">= 0 (0 = enough for every sequence)", std::to_string(o.kv_capacity_pages));
  if (o.device != Device::cpu && o.device != Device::cuda)
    throw Error("options.device", "cpu or cuda", std::to_string(static_cast<int>(o.device)));
  KVCacheConfig kc = kv_cache_config(c, spec);
  const int64_t pages_per_seq = (context + spec.page_size - 1) / std::max(1, spec.page_size) + 1;
  kc.capacity_pages = o.kv_capacity_pages > 0 ? o.kv_capacity_pages : pages_per_seq * max_sequences;
  kc.device = o.device;
  kc.device_index = o.device_index;
  kc.validate();
  return kc;
}
}  // namespace

Engine::Engine(const Model& model, const KVCacheSpec& spec, int32_t max_sequences, int32_t max_context,
               const EngineOptions& options)
    : model_(model), spec_(spec), options_(options), impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.context = max_context == 0 ? model.config.seq_len : max_context;
  const KVCacheConfig kc = make_cache_config(model, spec, max_sequences, m.context, options);
  m.page_size = kc.page_size;
  m.sinks = kc.sink_tokens;
  m.residual = kc.residual_tokens;
  m.group = kc.k_format.is_kivi() || kc.v_format.is_kivi()
                ? (kc.k_format.is_kivi() ? kc.k_format.group_size : kc.v_format.group_size)
                : 1;
  if (m.group == 0) m.group = 32;  // KIVI default G (kvcache.hpp)
  m.live.assign(static_cast<std::size_t>(max_sequences), false);
  if (options.device == Device::cuda) {
    const engine_detail::CudaEngineFactory make = engine_detail::cuda_engine_factory();
    if (make == nullptr)
      throw UnsupportedError("flashkv: options.device = cuda needs a library built with the CUDA backend "
                             "(FLASHKV_CUDA=ON); this build has none");
    m.backend = make(model, kc, m.context, max_sequences, options);
  } else {
    engine_detail::blas();  // load OpenBLAS now: a missing library is an error here, not in the first forward
    m.backend = std::make_unique<CpuEngine>(model, kc, m.context, options.bf16_activations);
  }
}

std::string engine_blas_info() {
  const engine_detail::Blas& b = engine_detail::blas();
  return b.info + " | " + b.library;
}
Engine::~Engine() = default;

int32_t Engine::max_context() const { return impl_->context; }

int32_t Engine::add_sequence() {
  for (std::size_t i = 0; i < impl_->live.size(); ++i) {
    if (!impl_->live[i]) {
      impl_->cache().add_sequence(static_cast<int64_t>(i));
      impl_->live[i] = true;
      return static_cast<int32_t>(i);
    }
  }
  throw CapacityError("flashkv: engine holds its maximum of " + std::to_string(impl_->live.size()) + " sequences");
}

void Engine::remove_sequence(int32_t seq) {
  if (seq < 0 || static_cast<std::size_t>(seq) >= impl_->live.size() || !impl_->live[static_cast<std::size_t>(seq)])
    throw Error("seq", "a live sequence id", std::to_string(seq));
  impl_->backend->remove_sequence(seq);
  impl_->live[static_cast<std::size_t>(seq)] = false;
}

CudaGraphStats Engine::cuda_graph_stats() const { return impl_->backend->cuda_graph_stats(); }

int32_t Engine::length(int32_t seq) const {
  if (seq < 0 || static_cast<std::size_t>(seq) >= impl_->live.size() || !impl_->live[static_cast<std::size_t>(seq)])
    throw Error("seq", "a live sequence id", std::to_string(seq));
  return static_cast<int32_t>(impl_->backend->cache().seq_len(seq, 0));
}

KVMemory Engine::memory() const {
  const KVMemoryReport r = impl_->backend->cache().memory_report();
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
void check_chunk(const Engine& e, int32_t cached, std::span<const int32_t> tokens, std::span<float> logits_out,
                 bool all_logits) {
  const ModelConfig& c = e.model().config;
  if (tokens.empty()) throw Error("tokens", "at least one token", "0");
  if (static_cast<int64_t>(cached) + static_cast<int64_t>(tokens.size()) > e.max_context())
    throw Error("tokens", "at most " + std::to_string(e.max_context() - cached) + " tokens (context " +
                              std::to_string(e.max_context()) + ", " + std::to_string(cached) + " cached)",
                std::to_string(tokens.size()));
  check_tokens(tokens, c.vocab_size);
  const std::size_t want = logits_out.empty() ? 0 : (all_logits ? tokens.size() : 1) * static_cast<std::size_t>(c.vocab_size);
  if (!logits_out.empty() && logits_out.size() != want)
    throw Error("logits_out", std::to_string(want) + " floats", std::to_string(logits_out.size()));
}
}  // namespace

void Engine::prefill(int32_t seq, std::span<const int32_t> tokens, std::span<float> logits_out, bool all_logits) {
  if (length(seq) != 0) throw Error("seq", "an empty sequence for prefill", std::to_string(length(seq)) + " cached tokens");
  if (tokens.size() > static_cast<std::size_t>(max_context()))
    throw Error("prompt", "at most " + std::to_string(max_context()) + " tokens (the context)", std::to_string(tokens.size()));
  check_chunk(*this, 0, tokens, logits_out, all_logits);
  const int t = static_cast<int>(tokens.size());
  const Segment seg{seq, 0, t, 0};
  impl_->reserve({&seg, 1});
  const int first = all_logits && !logits_out.empty() ? 0 : t - 1;
  impl_->kept_rows = 0;
  impl_->backend->run({&seg, 1}, tokens, /*fresh=*/true, first, t - first, logits_out);
  impl_->kept_rows = t - first;
  impl_->sample_row0 = t - first - 1;
}

void Engine::extend(int32_t seq, std::span<const int32_t> tokens, std::span<float> logits_out, bool all_logits) {
  const int32_t cached = length(seq);
  check_chunk(*this, cached, tokens, logits_out, all_logits);
  const int t = static_cast<int>(tokens.size());
  const Segment seg{seq, cached, t, 0};
  impl_->reserve({&seg, 1});
  const int first = all_logits && !logits_out.empty() ? 0 : t - 1;
  impl_->kept_rows = 0;
  impl_->backend->run({&seg, 1}, tokens, /*fresh=*/false, first, t - first, logits_out);
  impl_->kept_rows = t - first;
  impl_->sample_row0 = t - first - 1;
}

void Engine::decode(std::span<const int32_t> seqs, std::span<const int32_t> tokens, std::span<float> logits_out) {
  const ModelConfig& c = model_.config;
  if (seqs.empty()) throw Error("seqs", "at least one sequence", "0");
  if (tokens.size() != seqs.size())
    throw Error("tokens", std::to_string(seqs.size()) + " tokens (one per sequence)", std::to_string(tokens.size()));
  if (!logits_out.empty() && logits_out.size() != seqs.size() * static_cast<std::size_t>(c.vocab_size))
    throw Error("logits_out", std::to_string(seqs.size() * static_cast<std::size_t>(c.vocab_size)) + " floats (or none)",
                std::to_string(logits_out.size()));
  check_tokens(tokens, c.vocab_size);
  std::vector<Segment> segs(seqs.size());
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    const int32_t pos = length(seqs[i]);
    if (pos >= max_context())
      throw Error("seqs[" + std::to_string(i) + "]", "a sequence shorter than the context " + std::to_string(max_context()),
                  std::to_string(pos) + " cached tokens (context full)");
    for (std::size_t j = 0; j < i; ++j)
      if (seqs[j] == seqs[i]) throw Error("seqs", "distinct sequence ids", "id " + std::to_string(seqs[i]) + " twice");
    segs[i] = {seqs[i], pos, 1, static_cast<int32_t>(i)};
  }
  impl_->reserve(segs);
  const int32_t rows = static_cast<int32_t>(seqs.size());
  impl_->kept_rows = 0;
  impl_->backend->run(segs, tokens, /*fresh=*/false, 0, rows, logits_out);
  impl_->kept_rows = rows;
  impl_->sample_row0 = 0;
}

void Engine::append_synthetic(int32_t seq, int32_t n_tokens, uint64_t seed) {
  const int32_t cached = length(seq);
  if (n_tokens < 1 || static_cast<int64_t>(cached) + n_tokens > max_context())
    throw Error("n_tokens", "1.." + std::to_string(max_context() - cached) + " tokens (context " +
                                std::to_string(max_context()) + ", " + std::to_string(cached) + " cached)",
                std::to_string(n_tokens));
  const Segment seg{seq, cached, n_tokens, 0};
  impl_->reserve({&seg, 1});
  impl_->kept_rows = 0;
  impl_->backend->append_synthetic(seq, cached, n_tokens, seed);
}

std::vector<int32_t> Engine::sample(std::span<Sampler* const> samplers) {
  const int32_t rows = impl_->kept_rows - impl_->sample_row0;
  if (impl_->kept_rows == 0) throw Error("samplers", "a prefill / extend / decode call before sample()", "none");
  if (samplers.size() != static_cast<std::size_t>(rows))
    throw Error("samplers", std::to_string(rows) + " samplers (one per logit row of the last call)",
                std::to_string(samplers.size()));
  for (std::size_t i = 0; i < samplers.size(); ++i)
    if (samplers[i] == nullptr) throw Error("samplers[" + std::to_string(i) + "]", "a sampler", "null");
  return impl_->backend->sample(samplers, impl_->sample_row0);
}

}  // namespace flashkv
