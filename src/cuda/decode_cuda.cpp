// Host side of the CUDA decode path: validation, the num_splits heuristic, workspaces, append + launch.
#include "cuda/decode_cuda.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/validate.hpp"
#include "cuda/check.hpp"
#include "cuda/decode_append.hpp"
#include "cuda/kernels.hpp"
#include "cuda/util.hpp"
#include "flashkv/error.hpp"

namespace flashkv::cuda {
namespace {

constexpr int kDecodeBlockN = 64;   // tokens per key block (sm80::DecodeConfig::kBlockN)
constexpr int kCtasPerSm = 2;       // decode CTAs resident per SM (shared memory bound)

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

void check_aligned(const TensorView& t, const char* name) {
  bool ok = aligned16(t.data);
  for (int i = 0; i + 1 < t.ndim; ++i) ok = ok && t.strides[i] % 8 == 0;
  if (!ok) {
    throw Error(name, "a 16-byte aligned data pointer and strides that are multiples of 8 elements",
                t.describe() + " with unaligned pointer or strides");
  }
}

}  // namespace

int32_t decode_num_splits(int64_t ctas, int64_t num_key_blocks, int64_t cta_slots) {
  if (ctas >= static_cast<int64_t>(0.8 * static_cast<double>(cta_slots)) || num_key_blocks <= 4) return 1;
  const int64_t max_splits = std::min<int64_t>({128, num_key_blocks, cta_slots});
  double best = 0;
  std::vector<double> eff(static_cast<size_t>(max_splits) + 1, 0.0);
  for (int64_t s = 1; s <= max_splits; ++s) {
    const double waves = static_cast<double>(ctas * s) / static_cast<double>(cta_slots);
    eff[s] = waves / std::ceil(waves);
    best = std::max(best, eff[s]);
  }
  for (int64_t s = 1; s <= max_splits; ++s)
    if (eff[s] >= 0.85 * best) return static_cast<int32_t>(s);
  return 1;
}

void decode_attention_cuda(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                           const TensorView* page_table, const TensorView& cache_seqlens, const TensorView* k_new,
                           const TensorView* v_new, const TensorView& out, const TensorView* lse,
                           const DecodeOptions& o) {
  using core::check_dim;
  core::check_rank_and_layout(q, "q", 4, "[batch, seqlen_q, num_heads, head_dim]");
  const int64_t batch = q.shape[0], seqlen_q = q.shape[1], num_heads = q.shape[2], head_dim = q.shape[3];
  if (q.device != Device::cuda) throw TypeError("q", "a cuda tensor", q.describe());
  if (q.dtype != DType::bfloat16 && q.dtype != DType::float16) throw TypeError("q", "bfloat16 or float16", q.describe());
  core::check_rank_and_layout(k_cache, "k_cache", 4,
                              page_table ? "[num_pages, page_size, num_heads_kv, head_dim]"
                                         : "[batch, capacity, num_heads_kv, head_dim]");
  core::check_rank_and_layout(v_cache, "v_cache", 4, "like k_cache");
  const int64_t num_heads_kv = k_cache.shape[2];
  for (int i = 0; i < 4; ++i) check_dim(v_cache, "v_cache", i, k_cache.shape[i], "size (= k_cache)");
  check_dim(k_cache, "k_cache", 3, head_dim, "head_dim (= q.shape[3])");
  if (num_heads_kv == 0 || num_heads % num_heads_kv != 0) {
    throw Error("k_cache", "num_heads_kv dividing num_heads " + std::to_string(num_heads),
                std::to_string(num_heads_kv));
  }
  if (head_dim == 0 || head_dim > 256 || head_dim % 8 != 0) {
    throw Error("q", "head_dim in 8..256, a multiple of 8 (decode path)", std::to_string(head_dim));
  }
  for (const auto& [t, name] : {std::pair{&k_cache, "k_cache"}, std::pair{&v_cache, "v_cache"}, std::pair{&out, "out"}}) {
    core::check_dtype(*t, name, q.dtype);
    core::check_same_device(*t, name, q, "q");
  }
  core::check_rank_and_layout(out, "out", 4, "[batch, seqlen_q, num_heads, head_dim]");
  for (int i = 0; i < 4; ++i) check_dim(out, "out", i, q.shape[i], "size (= q)");
  core::check_rank_and_layout(cache_seqlens, "cache_seqlens", 1, "[batch]");
  core::check_dtype(cache_seqlens, "cache_seqlens", DType::int32);
  core::check_same_device(cache_seqlens, "cache_seqlens", q, "q");
  check_dim(cache_seqlens, "cache_seqlens", 0, batch, "batch (= q.shape[0])");
  int64_t page_size = 0, capacity = 0;
  if (page_table != nullptr) {
    core::check_rank_and_layout(*page_table, "page_table", 2, "[batch, max_pages_per_sequence]");
    core::check_dtype(*page_table, "page_table", DType::int32);
    core::check_same_device(*page_table, "page_table", q, "q");
    check_dim(*page_table, "page_table", 0, batch, "batch (= q.shape[0])");
    page_size = k_cache.shape[1];
    if (page_size < 16 || page_size > 256 || (page_size & (page_size - 1)) != 0) {
      throw Error("k_cache", "page_size (shape[1]) a power of two in [16, 256]", std::to_string(page_size));
    }
    capacity = page_table->shape[1] * page_size;
  } else {
    check_dim(k_cache, "k_cache", 0, batch, "batch (= q.shape[0]) for a cache without page_table");
    capacity = k_cache.shape[1];
  }
  if ((k_new == nullptr) != (v_new == nullptr)) throw Error("v_new", "given together with k_new", "only one of them");
  if (k_new != nullptr) {
    for (const auto& [t, name] : {std::pair{k_new, "k_new"}, std::pair{v_new, "v_new"}}) {
      core::check_rank_and_layout(*t, name, 4, "[batch, seqlen_q, num_heads_kv, head_dim]");
      core::check_dtype(*t, name, q.dtype);
      core::check_same_device(*t, name, q, "q");
      check_dim(*t, name, 0, batch, "batch (= q.shape[0])");
      check_dim(*t, name, 1, seqlen_q, "seqlen (= q.shape[1])");
      check_dim(*t, name, 2, num_heads_kv, "num_heads_kv (= k_cache.shape[2])");
      check_dim(*t, name, 3, head_dim, "head_dim (= q.shape[3])");
    }
  }
  if (lse != nullptr) {
    core::check_rank_and_layout(*lse, "lse", 3, "[batch, num_heads, seqlen_q]");
    core::check_dtype(*lse, "lse", DType::float32);
    core::check_same_device(*lse, "lse", q, "q");
    check_dim(*lse, "lse", 0, batch, "batch"), check_dim(*lse, "lse", 1, num_heads, "num_heads");
    check_dim(*lse, "lse", 2, seqlen_q, "seqlen_q");
  }
  if (o.softcap < 0 || !std::isfinite(o.softcap)) throw Error("softcap", ">= 0 and finite", std::to_string(o.softcap));
  const float scale = o.softmax_scale.value_or(1.f / std::sqrt(static_cast<float>(head_dim)));
  if (!(scale > 0) || !std::isfinite(scale)) throw Error("softmax_scale", "> 0 and finite", std::to_string(scale));
  if (o.num_splits < 0 || o.num_splits > 256) throw Error("num_splits", "0 (auto) .. 256", std::to_string(o.num_splits));
  check_aligned(q, "q"), check_aligned(out, "out"), check_aligned(k_cache, "k_cache"), check_aligned(v_cache, "v_cache");
  const KernelEntry& ke = find_kernel(KernelKind::decode, head_dim, q.dtype);
  if (batch == 0 || seqlen_q == 0 || num_heads == 0) return;
  if (batch > 65535) throw UnsupportedError("flashkv: CUDA decode supports batch <= 65535");

  DeviceGuard guard(q.device_index);
  auto st = static_cast<cudaStream_t>(o.stream);
  DeviceBuffer seqlens(static_cast<size_t>(batch) * 4, st);
  if (k_new != nullptr) {
    AppendParams a;
    a.k_new = static_cast<const uint16_t*>(k_new->data), a.v_new = static_cast<const uint16_t*>(v_new->data);
    a.kn_batch = k_new->strides[0], a.kn_row = k_new->strides[1], a.kn_head = k_new->strides[2];
    a.vn_batch = v_new->strides[0], a.vn_row = v_new->strides[1], a.vn_head = v_new->strides[2];
    a.k_cache = static_cast<uint16_t*>(k_cache.data), a.v_cache = static_cast<uint16_t*>(v_cache.data);
    a.k_page = k_cache.strides[0], a.k_row = k_cache.strides[1], a.k_head = k_cache.strides[2];
    a.v_page = v_cache.strides[0], a.v_row = v_cache.strides[1], a.v_head = v_cache.strides[2];
    a.page_table = page_table ? static_cast<const int32_t*>(page_table->data) : nullptr;
    a.page_table_batch = page_table ? page_table->strides[0] : 0;
    a.page_size_log2 = page_size ? static_cast<int32_t>(std::log2(static_cast<double>(page_size))) : 0;
    a.cache_seqlens = static_cast<const int32_t*>(cache_seqlens.data);
    a.batch = static_cast<int32_t>(batch), a.seqlen_new = static_cast<int32_t>(seqlen_q);
    a.num_heads_kv = static_cast<int32_t>(num_heads_kv), a.head_dim = static_cast<int32_t>(head_dim);
    a.capacity = capacity;
    append_kv(a, st);
  }
  effective_seqlens(static_cast<const int32_t*>(cache_seqlens.data), k_new ? static_cast<int32_t>(seqlen_q) : 0,
                    capacity, seqlens.as<int32_t>(), static_cast<int>(batch), st);

  DecodeParams p;
  p.q = q.data, p.k_cache = k_cache.data, p.v_cache = v_cache.data, p.out = out.data;
  p.lse = lse ? static_cast<float*>(lse->data) : nullptr;
  p.q_s = {q.strides[0], q.strides[1], q.strides[2]};
  p.out_s = {out.strides[0], out.strides[1], out.strides[2]};
  p.k_page = k_cache.strides[0], p.k_row = k_cache.strides[1], p.k_head = k_cache.strides[2];
  p.v_page = v_cache.strides[0], p.v_row = v_cache.strides[1], p.v_head = v_cache.strides[2];
  if (lse) p.lse_batch = lse->strides[0], p.lse_head = lse->strides[1], p.lse_row = lse->strides[2];
  p.page_table = page_table ? static_cast<const int32_t*>(page_table->data) : nullptr;
  p.page_table_batch = page_table ? page_table->strides[0] : 0;
  p.seqlens_k = seqlens.as<int32_t>();
  p.page_size_log2 = page_size ? static_cast<int32_t>(std::log2(static_cast<double>(page_size))) : 0;
  p.batch = static_cast<int32_t>(batch), p.seqlen_q = static_cast<int32_t>(seqlen_q);
  p.num_heads = static_cast<int32_t>(num_heads), p.num_heads_kv = static_cast<int32_t>(num_heads_kv);
  p.head_dim = static_cast<int32_t>(head_dim);
  p.max_seqlen_k = static_cast<int32_t>(std::min<int64_t>(capacity, INT32_MAX));
  p.rows_per_kv_head = static_cast<int32_t>(seqlen_q * (num_heads / num_heads_kv));
  p.causal = o.causal;
  p.softcap = o.softcap > 0;
  p.score_scale = p.softcap ? scale / o.softcap : 1.f;
  p.softmax_scale_log2 = (p.softcap ? o.softcap : scale) * 1.4426950408889634f;
  const int64_t row_tiles = (p.rows_per_kv_head + 15) / 16;
  const int64_t max_k = o.max_seqlen_k > 0 ? std::min<int64_t>(o.max_seqlen_k + (k_new ? seqlen_q : 0), capacity)
                                           : capacity;
  const int64_t key_blocks = (max_k + kDecodeBlockN - 1) / kDecodeBlockN;
  p.num_splits = o.num_splits > 0 ? o.num_splits
                                  : decode_num_splits(batch * num_heads_kv * row_tiles, key_blocks,
                                                      static_cast<int64_t>(num_sms()) * kCtasPerSm);
  if (num_heads_kv * row_tiles > 65535) throw UnsupportedError("flashkv: CUDA decode: too many kv heads x row tiles");
  const int64_t acc_rows = p.num_splits > 1 ? static_cast<int64_t>(p.num_splits) * batch * num_heads * seqlen_q : 0;
  DeviceBuffer o_accum(static_cast<size_t>(acc_rows * ke.head_dim) * 4, st), lse_accum(static_cast<size_t>(acc_rows) * 4, st);
  p.o_accum = o_accum.as<float>();
  p.lse_accum = lse_accum.as<float>();
  reinterpret_cast<DecodeLaunch>(ke.launch)(p, st);
}

}  // namespace flashkv::cuda
