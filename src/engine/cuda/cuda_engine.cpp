// The CUDA backend of flashkv::Engine (engine_backend.hpp; EngineOptions::device = cuda): the Llama forward pass of
// src/engine/engine.cpp on one GPU.
//   weights    uploaded once in bf16 (Wq|Wk|Wv fused into one [Qd + 2·KVd, dim] matrix, W1|W3 into [2·hidden, dim]);
//              token embedding and norm weights stay float32; the classifier is bf16 (the embedding's copy if tied)
//   per layer  rmsnorm → bf16 → QKV GEMM (float32 out) → RoPE + split → bf16 q/k/v (fp16 with an fp16 cache) →
//              attention → Wo GEMM accumulated into the float32 residual stream (beta = 1) → rmsnorm → W1|W3 GEMM →
//              SwiGLU → bf16 → W2 GEMM accumulated into the residual
//   attention  prefill (one fresh segment): flashkv::attention_forward (causal, GQA, CUDA) over the un-quantized K/V,
//              then K/V appended to the device PagedKVCache (copied for bf16 / fp16, quantized on the device otherwise);
//              extend / decode: K/V appended first, then plan_decode once per call (layer 0) and run_decode per layer
//   logits     final rmsnorm + classifier GEMM in float32, kept on the device for sample() (sample_kernels.hpp)
// Everything runs on the legacy default stream, in order.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/float16.hpp"
#include "cuda/check.hpp"
#include "cuda/util.hpp"
#include "engine/cuda/cuda_engine.hpp"
#include "engine/cuda/gemm.hpp"
#include "engine/cuda/layer_kernels.hpp"
#include "engine/cuda/sample_kernels.hpp"
#include "engine/cuda/synthetic_fill.hpp"
#include "engine/engine_backend.hpp"
#include "flashkv/attention.hpp"
#include "flashkv/decode.hpp"
#include "flashkv/error.hpp"

namespace flashkv::engine_cuda {
namespace {

using cuda::check_cuda;
using engine_detail::Segment;

/// Device memory owned by the engine (cudaMalloc / cudaFree).
class DevMem {
 public:
  DevMem() = default;
  explicit DevMem(size_t bytes) : bytes_(bytes) {
    if (bytes > 0 && cudaMalloc(&p_, bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      p_ = nullptr;
      throw CapacityError("flashkv: CUDA engine: cannot allocate " + std::to_string(bytes) + " bytes of device memory");
    }
  }
  ~DevMem() {
    if (p_ != nullptr) cudaFree(p_);
  }
  DevMem(DevMem&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr, o.bytes_ = 0; }
  DevMem& operator=(DevMem&& o) noexcept {
    std::swap(p_, o.p_), std::swap(bytes_, o.bytes_);
    return *this;
  }
  template <class T>
  T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

DevMem upload_f32(const float* h, size_t n) {
  DevMem d(n * 4);
  check_cuda(cudaMemcpy(d.as<void>(), h, n * 4, cudaMemcpyHostToDevice), "engine: upload weights");
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
  return d;
}

struct LayerDev {
  DevMem attn_norm, wqkv, wo, ffn_norm, w13, w2;
};

std::string half_name(const KVFormatSpec& f) { return f.name(); }

class CudaEngine final : public engine_detail::EngineBackend {
 public:
  CudaEngine(const Model& m, const KVCacheConfig& kc, int32_t context)
      : model_(m), device_(kc.device_index), kv_(checked(kc)) {
    cuda::DeviceGuard guard(device_);
    const ModelConfig& c = m.config;
    blas_ = std::make_unique<Blas>();  // on the engine's device (cuBLAS loaded here: UnsupportedError if absent)
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
  }

  PagedKVCache& cache() override { return kv_; }
  const PagedKVCache& cache() const override { return kv_; }

  void run(std::span<const Segment> segs, std::span<const int32_t> tokens, bool fresh, int32_t first, int32_t rows,
           std::span<float> logits_out) override;
  std::vector<int32_t> sample(std::span<Sampler* const> samplers, int32_t row0) override;
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

  /// Grows the activation buffers to `t` rows.
  void reserve_rows(int t) {
    if (t <= cap_rows_) return;
    const ModelConfig& c = model_.config;
    const size_t T = static_cast<size_t>(t), D = c.dim, H = c.hidden_dim, KVd = c.kv_dim();
    const size_t Qd = static_cast<size_t>(c.num_heads) * c.head_dim;
    x_ = DevMem(T * D * 4);
    xb_ = DevMem(T * std::max(D, Qd) * 2);
    qkv_ = DevMem(T * (Qd + 2 * KVd) * 4);
    q_ = DevMem(T * Qd * 2);
    k_ = DevMem(T * KVd * 2);
    v_ = DevMem(T * KVd * 2);
    att_ = DevMem(T * Qd * 2);
    gu_ = DevMem(T * 2 * H * 4);
    hb_ = DevMem(T * H * 2);
    ids_ = DevMem(T * 2 * 4);  // tokens, then positions
    cap_rows_ = t;
  }

  TensorView dev_view(void* p, DType t, std::initializer_list<int64_t> shape) const {
    return TensorView::contiguous(p, t, shape, Device::cuda, device_);
  }

  const Model& model_;
  int32_t device_;
  PagedKVCache kv_;
  bool fp16_ = false;
  DType att_dtype_ = DType::bfloat16;
  std::unique_ptr<Blas> blas_;
  DevMem embedding_, classifier_, final_norm_, rope_cos_, rope_sin_;
  std::vector<LayerDev> layers_;
  int cap_rows_ = 0;
  DevMem x_, xb_, qkv_, q_, k_, v_, att_, gu_, hb_, ids_;
  DevMem logits_;
  DevMem synthetic_;  ///< K then V staging of append_synthetic (grown on demand)
  int32_t logit_rows_ = 0;
  SampleWorkspace sample_ws_;
};

void CudaEngine::run(std::span<const Segment> segs, std::span<const int32_t> tokens, bool fresh, int32_t first,
                     int32_t rows, std::span<float> logits_out) {
  cuda::DeviceGuard guard(device_);
  const ModelConfig& c = model_.config;
  const int t = static_cast<int>(tokens.size());
  reserve_rows(t);
  const int D = c.dim, H = c.hidden_dim, hd = c.head_dim, Hq = c.num_heads, Hk = c.num_heads_kv;
  const int Qd = Hq * hd, KVd = c.kv_dim();
  std::vector<int32_t> host_ids(static_cast<size_t>(2 * t));
  std::copy(tokens.begin(), tokens.end(), host_ids.begin());
  for (const Segment& s : segs)
    for (int i = 0; i < s.n; ++i) host_ids[static_cast<size_t>(t + s.row0 + i)] = s.pos0 + i;
  check_cuda(cudaMemcpy(ids_.as<void>(), host_ids.data(), host_ids.size() * 4, cudaMemcpyHostToDevice),
             "engine: upload tokens");
  const int32_t* d_tokens = ids_.as<int32_t>();
  const int32_t* d_pos = d_tokens + t;
  embed_rows(embedding_.as<float>(), d_tokens, t, D, x_.as<float>(), nullptr);

  std::vector<int64_t> seq_ids(segs.size());
  std::vector<int32_t> cu(segs.size() + 1, 0);
  for (size_t i = 0; i < segs.size(); ++i) {
    seq_ids[i] = segs[i].seq;
    cu[i + 1] = cu[i] + segs[i].n;
  }
  DecodePlan plan;
  const size_t e16 = 2;
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const LayerDev& L = layers_[static_cast<size_t>(l)];
    rmsnorm_bf16(x_.as<float>(), L.attn_norm.as<float>(), t, D, c.norm_eps, xb_.as<uint16_t>(), nullptr);
    blas_->matmul(xb_.as<uint16_t>(), t, D, L.wqkv.as<uint16_t>(), Qd + 2 * KVd, qkv_.as<float>(), 0.0f);
    rope_split(qkv_.as<float>(), d_pos, rope_cos_.as<float>(), rope_sin_.as<float>(), t, Hq, Hk, hd, fp16_,
               q_.as<uint16_t>(), k_.as<uint16_t>(), v_.as<uint16_t>(), nullptr);
    auto kv_rows = [&](const DevMem& buf, const Segment& s) {
      return dev_view(buf.as<char>() + static_cast<size_t>(s.row0) * KVd * e16, att_dtype_, {s.n, Hk, hd});
    };
    if (fresh) {
      AttentionOptions o;
      o.causal = true;
      attention_forward(dev_view(q_.as<void>(), att_dtype_, {1, t, Hq, hd}),
                        dev_view(k_.as<void>(), att_dtype_, {1, t, Hk, hd}),
                        dev_view(v_.as<void>(), att_dtype_, {1, t, Hk, hd}),
                        dev_view(att_.as<void>(), att_dtype_, {1, t, Hq, hd}), nullptr, o);
      kv_.append(segs[0].seq, l, kv_rows(k_, segs[0]), kv_rows(v_, segs[0]));
    } else {
      for (const Segment& s : segs) kv_.append(s.seq, l, kv_rows(k_, s), kv_rows(v_, s));
      if (l == 0) {
        DecodeOptions o;
        o.causal = true;
        o.q_dtype = att_dtype_;
        plan = plan_decode(kv_, seq_ids, cu, Hq, 0, o);
      }
      run_decode(kv_, plan, l, dev_view(q_.as<void>(), att_dtype_, {t, Hq, hd}),
                 dev_view(att_.as<void>(), att_dtype_, {t, Hq, hd}), nullptr);
    }
    const uint16_t* att_bf16 = att_.as<uint16_t>();
    if (fp16_) {  // the Wo GEMM reads bf16
      fp16_to_bf16(att_.as<uint16_t>(), static_cast<int64_t>(t) * Qd, xb_.as<uint16_t>(), nullptr);
      att_bf16 = xb_.as<uint16_t>();
    }
    blas_->matmul(att_bf16, t, Qd, L.wo.as<uint16_t>(), D, x_.as<float>(), 1.0f);
    rmsnorm_bf16(x_.as<float>(), L.ffn_norm.as<float>(), t, D, c.norm_eps, xb_.as<uint16_t>(), nullptr);
    blas_->matmul(xb_.as<uint16_t>(), t, D, L.w13.as<uint16_t>(), 2 * H, gu_.as<float>(), 0.0f);
    swiglu_bf16(gu_.as<float>(), t, H, hb_.as<uint16_t>(), nullptr);
    blas_->matmul(hb_.as<uint16_t>(), t, H, L.w2.as<uint16_t>(), D, x_.as<float>(), 1.0f);
  }
  const size_t V = static_cast<size_t>(c.vocab_size);
  if (logits_.bytes() < static_cast<size_t>(rows) * V * 4) logits_ = DevMem(static_cast<size_t>(rows) * V * 4);
  rmsnorm_bf16(x_.as<float>() + static_cast<size_t>(first) * D, final_norm_.as<float>(), rows, D, c.norm_eps,
               xb_.as<uint16_t>(), nullptr);
  blas_->matmul(xb_.as<uint16_t>(), rows, D, classifier_.as<uint16_t>(), c.vocab_size, logits_.as<float>(), 0.0f);
  logit_rows_ = rows;
  if (!logits_out.empty()) {
    check_cuda(cudaMemcpy(logits_out.data(), logits_.as<void>(), logits_out.size() * 4, cudaMemcpyDeviceToHost),
               "engine: download logits");
  } else {
    check_cuda(cudaDeviceSynchronize(), "engine: forward");
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
  return sample_rows(logits_.as<float>() + static_cast<size_t>(row0) * V, static_cast<int64_t>(V), p.data(),
                     static_cast<int>(p.size()), sample_ws_, nullptr);
}

/// Synthetic K/V staged on the device in the attention dtype (the 16-bit caches take only their own type) and appended
/// through the device PagedKVCache's append, up to 32768 tokens per layer and call.
void CudaEngine::append_synthetic(int32_t seq, int32_t pos0, int32_t n, uint64_t seed) {
  cuda::DeviceGuard guard(device_);
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
      synthetic_kv(seed, l, c.n_layers, static_cast<int64_t>(pos0) + p, m, Hk, hd, fp16_, k, v, nullptr);
      kv_.append(seq, l, dev_view(k, att_dtype_, {m, Hk, hd}), dev_view(v, att_dtype_, {m, Hk, hd}));
    }
  }
}

std::unique_ptr<engine_detail::EngineBackend> make_cuda_engine(const Model& m, const KVCacheConfig& kc,
                                                               int32_t context) {
  return std::make_unique<CudaEngine>(m, kc, context);
}

const bool kRegistered = (engine_detail::register_cuda_engine(&make_cuda_engine), true);

}  // namespace

bool cuda_engine_registered() { return kRegistered; }

}  // namespace flashkv::engine_cuda
