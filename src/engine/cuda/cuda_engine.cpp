// The CUDA backend of flashkv::Engine (engine_backend.hpp; EngineOptions::device = cuda): the Llama forward pass of
// src/engine/engine.cpp on one GPU.
//   weights    uploaded once in bf16 (Wq|Wk|Wv fused into one [Qd + 2·KVd, dim] matrix, W1|W3 into [2·hidden, dim]);
//              token embedding and norm weights stay float32; the classifier is bf16 (the embedding's copy if tied)
//   per layer  rmsnorm → bf16 → QKV GEMM (float32 out) → RoPE + split → bf16 q/k/v (fp16 with an fp16 cache) →
//              K/V of every sequence appended into the device PagedKVCache by one launch (copied for bf16 / fp16,
//              quantized on write otherwise; kv::step_append) → attention → Wo GEMM accumulated into the float32
//              residual stream (beta = 1) → rmsnorm → W1|W3 GEMM → SwiGLU → bf16 → W2 GEMM accumulated into the residual
//   attention  prefill (one fresh segment): flashkv::attention_forward (causal, GQA, CUDA) over the un-quantized K/V;
//              extend / decode: the CUDA paged decode over the cache, planned once per call (a decode step's plan once
//              per bucket, step_graphs.hpp) and run per layer from the step's device tables
//   logits     final rmsnorm + classifier GEMM in float32, kept on the device for sample() (sample_kernels.hpp)
// Every call runs on the engine's own stream. Per call the host builds the step's tables (tokens, positions, lengths
// before the append, cu_seqlens_q, page table) in page-locked memory and uploads them with ONE copy; nothing is
// allocated and nothing waits for the device until sample() (one download of the tokens), a requested logits
// download, or the next call. A decode step (every sequence one token) is replayed from a CUDA graph of its bucket
// when EngineOptions::cuda_graphs is on.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/float16.hpp"
#include "core/path_log.hpp"
#include "cuda/check.hpp"
#include "cuda/util.hpp"
#include "engine/cuda/cuda_engine.hpp"
#include "engine/cuda/dev_mem.hpp"
#include "engine/cuda/gemm.hpp"
#include "engine/cuda/layer_kernels.hpp"
#include "engine/cuda/sample_kernels.hpp"
#include "engine/cuda/step_graphs.hpp"
#include "engine/cuda/synthetic_fill.hpp"
#include "engine/engine_backend.hpp"
#include "flashkv/attention.hpp"
#include "flashkv/decode.hpp"
#include "flashkv/error.hpp"
#include "kvcache/api/cache_step.hpp"

namespace flashkv::engine_cuda {
namespace {

using cuda::check_cuda;
using engine_detail::Segment;

DevMem upload_f32(const float* h, size_t n) {
  DevMem d(n * 4);
  check_cuda(cudaMemcpy(d.as<void>(), h, n * 4, cudaMemcpyHostToDevice), "engine: upload weights");
  check_cuda(cudaStreamSynchronize(nullptr), "engine: upload weights");  // the DMA done before any stream reads it
  return d;
}

/// Row blocks (each [rows_i, cols] float32, row-major) stacked and rounded to bf16 on the host (OpenMP: an 8B model's
/// 7.5e9 values take ~20 s on one core), then uploaded.
DevMem upload_bf16(std::initializer_list<std::pair<const float*, size_t>> blocks) {
  size_t n = 0;
  for (const auto& b : blocks) n += b.second;
  std::unique_ptr<uint16_t[]> h(new uint16_t[n]);  // not zero-filled: the parallel loop writes (and faults in) it
  size_t o = 0;
  for (const auto& b : blocks) {
    uint16_t* dst = h.get() + o;
    const float* src = b.first;
    const int64_t m = static_cast<int64_t>(b.second);
#pragma omp parallel for schedule(static) if (m > (1 << 20))
    for (int64_t i = 0; i < m; ++i) dst[i] = float_to_bf16(src[i]);
    o += b.second;
  }
  DevMem d(n * 2);
  check_cuda(cudaMemcpy(d.as<void>(), h.get(), n * 2, cudaMemcpyHostToDevice), "engine: upload weights");
  check_cuda(cudaStreamSynchronize(nullptr), "engine: upload weights");  // the DMA done before any stream reads it
  return d;
}

struct LayerDev {
  DevMem attn_norm, wqkv, wo, ffn_norm, w13, w2;
};

std::string half_name(const KVFormatSpec& f) { return f.name(); }

/// The engine's stream: non-blocking (no implicit ordering with the legacy default stream, so that another thread's
/// work there cannot break a capture). The device cache's own memory operations (the pool's fill at construction and
/// of freed pages, the weight uploads) run on the legacy stream: wait_for_legacy() orders our later work after them
/// without blocking the host; the engine waits for its own stream before it frees pages.
class Stream {
 public:
  Stream() = default;
  ~Stream() {
    if (legacy_done_ != nullptr) cudaEventDestroy(legacy_done_);
    if (s_ != nullptr) cudaStreamDestroy(s_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  void create() {
    check_cuda(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "engine: create stream");
    check_cuda(cudaEventCreateWithFlags(&legacy_done_, cudaEventDisableTiming), "engine: create event");
  }
  cudaStream_t get() const { return s_; }
  void wait_for_legacy() {
    check_cuda(cudaEventRecord(legacy_done_, cudaStreamLegacy), "engine: order after the legacy stream");
    check_cuda(cudaStreamWaitEvent(s_, legacy_done_, 0), "engine: order after the legacy stream");
  }

 private:
  cudaStream_t s_ = nullptr;
  cudaEvent_t legacy_done_ = nullptr;
};

/// Activation buffers for up to `rows` rows.
struct Activations {
  int rows = 0;
  DevMem x, xb, qkv, q, k, v, att, gu, hb;
  void reserve(const ModelConfig& c, int t) {
    if (t <= rows) return;
    const size_t T = static_cast<size_t>(t), D = c.dim, H = c.hidden_dim, KVd = c.kv_dim();
    const size_t Qd = static_cast<size_t>(c.num_heads) * c.head_dim;
    x = DevMem(T * D * 4);
    xb = DevMem(T * std::max(D, Qd) * 2);
    qkv = DevMem(T * (Qd + 2 * KVd) * 4);
    q = DevMem(T * Qd * 2);
    k = DevMem(T * KVd * 2);
    v = DevMem(T * KVd * 2);
    att = DevMem(T * Qd * 2);
    gu = DevMem(T * 2 * H * 4);
    hb = DevMem(T * H * 2);
    rows = t;
  }
};

/// One call's shape and its tables on the device (int32 views into the engine's table buffer).
struct Step {
  int rows = 0, batch = 0, n_new = 0;  ///< token rows, sequences, tokens per sequence (rows = batch · n_new)
  bool fresh = false;                  ///< prefill: attention_forward over the fresh K/V
  int first = 0, out_rows = 0;         ///< logit rows [first, first + out_rows)
  int64_t stride = 0, max_k = 0;       ///< page-table stride; longest sequence after the append
  const int32_t *tokens = nullptr, *pos = nullptr, *seqlens = nullptr, *cu_q = nullptr, *page_table = nullptr;
  kv::StepTables tables() const { return {seqlens, cu_q, page_table, stride}; }
};

class CudaEngine final : public engine_detail::EngineBackend {
 public:
  CudaEngine(const Model& m, const KVCacheConfig& kc, int32_t context, int32_t max_sequences, const EngineOptions& eo)
      : model_(m), device_(kc.device_index), context_(context), max_sequences_(max_sequences), kv_(checked(kc)),
        graphs_(eo.cuda_graphs) {
    cuda::DeviceGuard guard(device_);
    stream_.create();
    const ModelConfig& c = m.config;
    blas_ = std::make_unique<Blas>(stream_.get());  // cuBLAS loaded here: UnsupportedError if absent
    fp16_ = kc.k_format.format == KVFormat::fp16;
    att_dtype_ = fp16_ ? DType::float16 : DType::bfloat16;
    probe_decode(c);
    const size_t D = c.dim, H = c.hidden_dim, V = c.vocab_size, KVd = c.kv_dim(), Qd = size_t(c.num_heads) * c.head_dim;
    embedding_ = upload_f32(m.token_embedding, V * D);
    classifier_ = upload_bf16({{m.classifier, V * D}});
    final_norm_ = upload_f32(m.final_norm, D);
    for (const LayerWeights& L : m.layers) {
      LayerDev d;
      d.attn_norm = upload_f32(L.attn_norm, D);
      d.wqkv = upload_bf16({{L.wq, Qd * D}, {L.wk, KVd * D}, {L.wv, KVd * D}});
      d.wo = upload_bf16({{L.wo, D * Qd}});
      d.ffn_norm = upload_f32(L.ffn_norm, D);
      d.w13 = upload_bf16({{L.w1, H * D}, {L.w3, H * D}});
      d.w2 = upload_bf16({{L.w2, D * H}});
      layers_.push_back(std::move(d));
    }
    std::vector<float> cs, sn;
    engine_detail::rope_tables(c, context, cs, sn);
    rope_cos_ = upload_f32(cs.data(), cs.size());
    rope_sin_ = upload_f32(sn.data(), sn.size());
    // Decode steps use their own fixed buffers (captured graphs point at them); prefill / extend grow theirs.
    decode_act_.reserve(c, max_sequences_);
    decode_logits_ = DevMem(static_cast<size_t>(max_sequences_) * V * 4);
    stream_.wait_for_legacy();  // the weight uploads and the pool's 0xFF fill ran on the legacy stream
    // The step tables: [tokens rows][pos rows][seqlens batch][cu_q batch + 1][page_table batch · stride].
    max_pages_ = (context_ + kc.page_size - 1) / kc.page_size;
    const int64_t rows = std::max(context_, max_sequences_);
    table_ints_ = static_cast<size_t>(2 * rows + 2 * int64_t{max_sequences_} + 1 + int64_t{max_sequences_} * max_pages_);
    tables_dev_ = DevMem(table_ints_ * 4);
    tables_host_ = PinnedMem(table_ints_ * 4);
    bad_bytes_ = static_cast<size_t>(c.n_layers) * 2 * sizeof(unsigned long long);
    bad_dev_ = DevMem(bad_bytes_);
    bad_host_ = PinnedMem(bad_bytes_);
  }

  ~CudaEngine() override {
    cuda::DeviceGuard guard(device_);
    cudaStreamSynchronize(stream_.get());
    graphs_.clear();  // before the stream their plans free their workspace on
  }

  PagedKVCache& cache() override { return kv_; }
  const PagedKVCache& cache() const override { return kv_; }

  void run(std::span<const Segment> segs, std::span<const int32_t> tokens, bool fresh, int32_t first, int32_t rows,
           std::span<float> logits_out) override;
  std::vector<int32_t> sample(std::span<Sampler* const> samplers, int32_t row0) override;
  void remove_sequence(int32_t seq) override {
    cuda::DeviceGuard guard(device_);
    check_cuda(cudaStreamSynchronize(stream_.get()), "engine: wait before freeing pages");
    busy_ = false;  // any unchecked K / V flags stay pending for the next call
    kv_.remove_sequence(seq);
    stream_.wait_for_legacy();  // the cache fills the freed pages on the legacy stream: later steps come after
  }
  CudaGraphStats cuda_graph_stats() const override { return graphs_.stats(); }
  void append_synthetic(int32_t seq, int32_t pos0, int32_t n, uint64_t seed) override;

 private:
  /// The device cache's config, or UnsupportedError for what the device engine cannot run.
  static KVCacheConfig checked(const KVCacheConfig& kc) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      (void)cudaGetLastError();
      throw UnsupportedError("flashkv: options.device = cuda: no CUDA device is present");
    }
    if (kc.device_index < 0 || kc.device_index >= n)
      throw Error("options.device_index", "a CUDA device in [0, " + std::to_string(n) + ")",
                  std::to_string(kc.device_index));
    const std::string spec = "kv_cache_dtype k=" + half_name(kc.k_format) + " v=" + half_name(kc.v_format);
    if (kc.sink_tokens > 0 || kc.residual_tokens > 0 || kc.rotation != KVRotation::none || kc.k_format.is_kivi() ||
        kc.v_format.is_kivi())
      throw UnsupportedError("flashkv: the CUDA engine does not decode sinks, residual windows, KIVI or Hadamard "
                             "rotation yet (" + spec + ", sinks " + std::to_string(kc.sink_tokens) + ", residual " +
                             std::to_string(kc.residual_tokens) + "); use --device cpu for them");
    const bool k16 = kc.k_format.format == KVFormat::bf16 || kc.k_format.format == KVFormat::fp16;
    const bool v16 = kc.v_format.format == KVFormat::bf16 || kc.v_format.format == KVFormat::fp16;
    if (kc.k_format.format == KVFormat::fp32 || kc.v_format.format == KVFormat::fp32 ||
        ((k16 || v16) && !(kc.k_format == kc.v_format)))
      throw UnsupportedError("flashkv: the CUDA engine decodes bf16 / fp16 caches (the same type for K and V) or "
                             "quantized ones; " + spec + " is not (use kv_cache_dtype bf16)");
    return kc;
  }

  /// Plans a decode over an empty probe sequence, so that a format / head dim the device decode lacks is an
  /// UnsupportedError now (naming it), not in the first decode step.
  void probe_decode(const ModelConfig& c) {
    const int64_t probe = INT32_MAX;  // never an Engine id
    kv_.add_sequence(probe);
    try {
      DecodeOptions o;
      o.causal = true;
      o.q_dtype = att_dtype_;
      const int64_t ids[1] = {probe};
      const int32_t cu[2] = {0, 1};
      (void)plan_decode(kv_, ids, cu, c.num_heads, 0, o);
    } catch (...) {
      kv_.remove_sequence(probe);
      throw;
    }
    kv_.remove_sequence(probe);
  }

  TensorView dev_view(void* p, DType t, std::initializer_list<int64_t> shape) const {
    return TensorView::contiguous(p, t, shape, Device::cuda, device_);
  }

  /// Waits for the previous call's work and reports the non-finite K / V it found (settle / check_flags).
  void settle() {
    if (busy_) {
      check_cuda(cudaStreamSynchronize(stream_.get()), "engine: previous step");
      busy_ = false;
    }
    check_flags();
  }
  void check_flags();
  /// Every launch of one forward pass on the stream (eager, or under capture): see the file comment.
  void issue_forward(const Step& st, Activations& a, float* logits, DecodePlan* plan);
  /// The bucket plan / graph of a decode step, and its launch.
  void run_decode_step(const Step& st);

  const Model& model_;
  int32_t device_;
  int32_t context_, max_sequences_;
  Stream stream_;  // declared before everything that frees memory in stream order on it
  PagedKVCache kv_;
  bool fp16_ = false;
  DType att_dtype_ = DType::bfloat16;
  std::unique_ptr<Blas> blas_;
  DevMem embedding_, classifier_, final_norm_, rope_cos_, rope_sin_;
  std::vector<LayerDev> layers_;
  Activations decode_act_, prefill_act_;
  DevMem decode_logits_, prefill_logits_;
  const float* logits_ = nullptr;  ///< the last call's logit rows (decode_logits_ or prefill_logits_)
  int64_t max_pages_ = 0;          ///< pages of a sequence at full context: the page table's widest stride
  size_t table_ints_ = 0;
  DevMem tables_dev_;
  PinnedMem tables_host_;
  size_t bad_bytes_ = 0;
  DevMem bad_dev_;                 ///< [layer][K, V] smallest flat index of a value the cache cannot store
  PinnedMem bad_host_;             ///< its copy, downloaded at the end of every call
  bool busy_ = false;              ///< a call's work may still be running
  bool flags_pending_ = false;     ///< bad_host_ holds an unchecked call's flags
  std::vector<int64_t> last_ids_;  ///< that call's sequences (row order), for the error message
  int last_n_new_ = 0;
  DevMem synthetic_;               ///< K then V staging of append_synthetic (grown on demand)
  SampleWorkspace sample_ws_;
  StepGraphs graphs_;
};

void CudaEngine::check_flags() {
  if (!flags_pending_) return;
  flags_pending_ = false;
  const ModelConfig& c = model_.config;
  const auto* bad = bad_host_.as<unsigned long long>();
  for (int32_t l = 0; l < c.n_layers; ++l) {
    for (int half = 0; half < 2; ++half) {
      const unsigned long long flat = bad[2 * l + half];
      if (flat == ~0ull) continue;
      const int64_t d = c.head_dim, hk = c.num_heads_kv, f = static_cast<int64_t>(flat);
      const int64_t ch = f % d, h = (f / d) % hk, i = (f / (d * hk)) % last_n_new_, b = f / (d * hk * last_n_new_);
      const std::string seq = b < static_cast<int64_t>(last_ids_.size()) ? std::to_string(last_ids_[b]) : "?";
      throw Error(half == 0 ? "k" : "v",
                  "finite values the KV cache can store (the CUDA engine checks the K / V it appends)",
                  "a non-finite value (or one beyond the fp16 range of this format) in layer " + std::to_string(l) +
                      ", sequence " + seq + ", new token " + std::to_string(i) + ", kv head " + std::to_string(h) +
                      ", channel " + std::to_string(ch) + " of the previous prefill / extend / decode");
    }
  }
}

void CudaEngine::issue_forward(const Step& st, Activations& a, float* logits, DecodePlan* plan) {
  const ModelConfig& c = model_.config;
  cudaStream_t s = stream_.get();
  const int t = st.rows;
  const int D = c.dim, H = c.hidden_dim, hd = c.head_dim, Hq = c.num_heads, Hk = c.num_heads_kv;
  const int Qd = Hq * hd, KVd = c.kv_dim();
  auto* bad = bad_dev_.as<unsigned long long>();
  check_cuda(cudaMemsetAsync(bad, 0xFF, bad_bytes_, s), "engine: reset the K/V checks");
  embed_rows(embedding_.as<float>(), st.tokens, t, D, a.x.as<float>(), s);
  const kv::StepTables tables = st.tables();
  kv::StepRows kv_rows;
  kv_rows.k = a.k.as<void>(), kv_rows.v = a.v.as<void>(), kv_rows.dtype = att_dtype_;
  kv_rows.batch_stride = int64_t{st.n_new} * KVd, kv_rows.row_stride = KVd, kv_rows.head_stride = hd;
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const LayerDev& L = layers_[static_cast<size_t>(l)];
    rmsnorm_bf16(a.x.as<float>(), L.attn_norm.as<float>(), t, D, c.norm_eps, a.xb.as<uint16_t>(), s);
    blas_->matmul(a.xb.as<uint16_t>(), t, D, L.wqkv.as<uint16_t>(), Qd + 2 * KVd, a.qkv.as<float>(), 0.0f);
    rope_split(a.qkv.as<float>(), st.pos, rope_cos_.as<float>(), rope_sin_.as<float>(), t, Hq, Hk, hd, fp16_,
               a.q.as<uint16_t>(), a.k.as<uint16_t>(), a.v.as<uint16_t>(), s);
    kv::step_append(kv_, tables, st.batch, st.n_new, l, kv_rows, bad + 2 * l, s);
    if (st.fresh) {
      AttentionOptions o;
      o.causal = true;
      o.stream = s;
      attention_forward(dev_view(a.q.as<void>(), att_dtype_, {1, t, Hq, hd}),
                        dev_view(a.k.as<void>(), att_dtype_, {1, t, Hk, hd}),
                        dev_view(a.v.as<void>(), att_dtype_, {1, t, Hk, hd}),
                        dev_view(a.att.as<void>(), att_dtype_, {1, t, Hq, hd}), nullptr, o);
    } else {
      kv::run_step_decode(kv_, *plan, l, dev_view(a.q.as<void>(), att_dtype_, {t, Hq, hd}),
                          dev_view(a.att.as<void>(), att_dtype_, {t, Hq, hd}));
    }
    const uint16_t* att_bf16 = a.att.as<uint16_t>();
    if (fp16_) {  // the Wo GEMM reads bf16
      fp16_to_bf16(a.att.as<uint16_t>(), static_cast<int64_t>(t) * Qd, a.xb.as<uint16_t>(), s);
      att_bf16 = a.xb.as<uint16_t>();
    }
    blas_->matmul(att_bf16, t, Qd, L.wo.as<uint16_t>(), D, a.x.as<float>(), 1.0f);
    rmsnorm_bf16(a.x.as<float>(), L.ffn_norm.as<float>(), t, D, c.norm_eps, a.xb.as<uint16_t>(), s);
    blas_->matmul(a.xb.as<uint16_t>(), t, D, L.w13.as<uint16_t>(), 2 * H, a.gu.as<float>(), 0.0f);
    swiglu_bf16(a.gu.as<float>(), t, H, a.hb.as<uint16_t>(), s);
    blas_->matmul(a.hb.as<uint16_t>(), t, H, L.w2.as<uint16_t>(), D, a.x.as<float>(), 1.0f);
  }
  rmsnorm_bf16(a.x.as<float>() + static_cast<size_t>(st.first) * D, final_norm_.as<float>(), st.out_rows, D,
               c.norm_eps, a.xb.as<uint16_t>(), s);
  blas_->matmul(a.xb.as<uint16_t>(), st.out_rows, D, classifier_.as<uint16_t>(), c.vocab_size, logits, 0.0f);
  check_cuda(cudaMemcpyAsync(bad_host_.as<void>(), bad, bad_bytes_, cudaMemcpyDeviceToHost, s),
             "engine: download the K/V checks");
}

void CudaEngine::run_decode_step(const Step& st) {
  const ModelConfig& c = model_.config;
  const int32_t splits = kv::step_decode_splits(kv_, st.batch, 1, c.num_heads, st.max_k, att_dtype_);
  const StepKey key{st.batch, st.stride, splits};
  StepBucket* b = graphs_.find(key);
  if (b == nullptr) {
    DecodePlan plan = kv::plan_step_decode(kv_, st.tables(), st.batch, 1, c.num_heads, st.max_k, att_dtype_,
                                           stream_.get());
    if (plan.num_splits() != splits)  // the key must name the plan it stands for
      throw Error("flashkv: CUDA engine: step plan with " + std::to_string(plan.num_splits()) + " splits for a bucket of " +
                  std::to_string(splits), Status::internal);
    b = &graphs_.add(key, std::move(plan));
  }
  if (graphs_.wants_capture(*b)) {
    graphs_.capture(*b, stream_.get(), [&] { issue_forward(st, decode_act_, decode_logits_.as<float>(), &b->plan); });
  }
  if (b->exec != nullptr) {
    graphs_.launch(*b, stream_.get());
    if (core::path_log_enabled())
      core::record_path("engine cuda decode: graph replay (" + key.describe() + ")");
  } else {
    issue_forward(st, decode_act_, decode_logits_.as<float>(), &b->plan);
    graphs_.count_eager();
  }
}

void CudaEngine::run(std::span<const Segment> segs, std::span<const int32_t> tokens, bool fresh, int32_t first,
                     int32_t rows, std::span<float> logits_out) {
  cuda::DeviceGuard guard(device_);
  settle();  // the previous call's work is done: its tables' staging may be rewritten, its checks are read
  const ModelConfig& c = model_.config;
  Step st;
  st.rows = static_cast<int>(tokens.size());
  st.batch = static_cast<int>(segs.size());
  st.fresh = fresh;
  st.first = first;
  st.out_rows = rows;
  const bool decode = !fresh && std::all_of(segs.begin(), segs.end(), [](const Segment& s) { return s.n == 1; });
  if (!decode && st.batch != 1)
    throw Error("flashkv: CUDA engine: a call of several sequences must be a decode step (one token each)",
                Status::internal);
  st.n_new = decode ? 1 : segs[0].n;
  last_ids_.resize(segs.size());
  for (size_t i = 0; i < segs.size(); ++i) {
    last_ids_[i] = segs[i].seq;
    if (segs[i].row0 != static_cast<int32_t>(i) * st.n_new)
      throw Error("flashkv: CUDA engine: segments must be in row order", Status::internal);
  }
  last_n_new_ = st.n_new;
  // Host side of the step: pages, then the tables in one page-locked block and one upload.
  const int64_t pages = kv::step_reserve(kv_, last_ids_, st.n_new);
  if (decode) {  // a power-of-two bucket of the longest page list (fewer distinct graphs), at most a full context's
    st.stride = 1;
    while (st.stride < pages) st.stride *= 2;
    st.stride = std::min(st.stride, std::max(max_pages_, pages));
  } else {
    st.stride = pages;
  }
  int32_t* h = tables_host_.as<int32_t>();
  int32_t* tok_h = h;
  int32_t* pos_h = tok_h + st.rows;
  int32_t* len_h = pos_h + st.rows;
  int32_t* cu_h = len_h + st.batch;
  int32_t* table_h = cu_h + st.batch + 1;
  const size_t used = static_cast<size_t>(table_h - h) + static_cast<size_t>(st.batch * st.stride);
  if (used > table_ints_) throw Error("flashkv: CUDA engine: step tables overflow", Status::internal);
  std::copy(tokens.begin(), tokens.end(), tok_h);
  for (const Segment& s : segs)
    for (int i = 0; i < s.n; ++i) pos_h[s.row0 + i] = s.pos0 + i;
  kv::step_host_tables(kv_, last_ids_, st.n_new, st.stride, len_h, cu_h, table_h);
  for (int b = 0; b < st.batch; ++b) st.max_k = std::max<int64_t>(st.max_k, int64_t{len_h[b]} + st.n_new);
  const int32_t* d = tables_dev_.as<int32_t>();
  st.tokens = d, st.pos = d + (pos_h - h), st.seqlens = d + (len_h - h), st.cu_q = d + (cu_h - h);
  st.page_table = d + (table_h - h);
  cudaStream_t s = stream_.get();
  check_cuda(cudaMemcpyAsync(tables_dev_.as<void>(), h, used * 4, cudaMemcpyHostToDevice, s), "engine: upload tables");
  busy_ = true;
  const size_t V = static_cast<size_t>(c.vocab_size);
  if (decode) {
    run_decode_step(st);
    logits_ = decode_logits_.as<float>();
  } else {
    prefill_act_.reserve(c, st.rows);
    if (prefill_logits_.bytes() < static_cast<size_t>(rows) * V * 4)
      prefill_logits_ = DevMem(static_cast<size_t>(rows) * V * 4);
    DecodePlan plan;
    if (!fresh) plan = kv::plan_step_decode(kv_, st.tables(), 1, st.n_new, c.num_heads, st.max_k, att_dtype_, s);
    issue_forward(st, prefill_act_, prefill_logits_.as<float>(), fresh ? nullptr : &plan);
    logits_ = prefill_logits_.as<float>();
  }
  flags_pending_ = true;
  kv::step_commit(kv_, last_ids_, st.n_new);
  if (!logits_out.empty()) {
    check_cuda(cudaMemcpyAsync(logits_out.data(), logits_, logits_out.size() * 4, cudaMemcpyDeviceToHost, s),
               "engine: download logits");
    settle();
  }
}

std::vector<int32_t> CudaEngine::sample(std::span<Sampler* const> samplers, int32_t row0) {
  cuda::DeviceGuard guard(device_);
  std::vector<RowSampling> p(samplers.size());
  for (size_t i = 0; i < samplers.size(); ++i) {
    const SamplerConfig& sc = samplers[i]->config();
    p[i].temperature = sc.temperature;
    p[i].top_k = sc.top_k;
    p[i].top_p = sc.top_p;
    p[i].u = sc.temperature > 0.0f ? samplers[i]->next_uniform() : 0.0f;  // the CPU sampler's draws, in order
  }
  const size_t V = static_cast<size_t>(model_.config.vocab_size);
  std::vector<int32_t> out = sample_rows(logits_ + static_cast<size_t>(row0) * V, static_cast<int64_t>(V), p.data(),
                                         static_cast<int>(p.size()), sample_ws_, stream_.get());
  busy_ = false;  // sample_rows synchronized the stream
  check_flags();
  return out;
}

/// Synthetic K/V staged on the device in the attention dtype (the 16-bit caches take only their own type) and appended
/// through the device PagedKVCache's append (synchronous, on the legacy stream: the staging is waited for first), up
/// to 32768 tokens per layer and call.
void CudaEngine::append_synthetic(int32_t seq, int32_t pos0, int32_t n, uint64_t seed) {
  cuda::DeviceGuard guard(device_);
  settle();  // nothing of ours still runs when the cache is written off our stream
  const ModelConfig& c = model_.config;
  const int Hk = c.num_heads_kv, hd = c.head_dim;
  const int chunk = std::min(n, 32768);
  const size_t half_bytes = static_cast<size_t>(chunk) * Hk * hd * 2;
  if (synthetic_.bytes() < 2 * half_bytes) synthetic_ = DevMem(2 * half_bytes);
  uint16_t* k = synthetic_.as<uint16_t>();
  uint16_t* v = k + half_bytes / 2;
  for (int p = 0; p < n; p += chunk) {
    const int m = std::min(chunk, n - p);
    for (int32_t l = 0; l < c.n_layers; ++l) {
      synthetic_kv(seed, l, c.n_layers, static_cast<int64_t>(pos0) + p, m, Hk, hd, fp16_, k, v, stream_.get());
      check_cuda(cudaStreamSynchronize(stream_.get()), "engine: synthetic K/V");
      kv_.append(seq, l, dev_view(k, att_dtype_, {m, Hk, hd}), dev_view(v, att_dtype_, {m, Hk, hd}));
    }
  }
}

std::unique_ptr<engine_detail::EngineBackend> make_cuda_engine(const Model& m, const KVCacheConfig& kc,
                                                               int32_t context, int32_t max_sequences,
                                                               const EngineOptions& options) {
  return std::make_unique<CudaEngine>(m, kc, context, max_sequences, options);
}

const bool kRegistered = (engine_detail::register_cuda_engine(&make_cuda_engine), true);

}  // namespace

bool cuda_engine_registered() { return kRegistered; }

}  // namespace flashkv::engine_cuda
