// Validation of the decode entry points (flashkv/decode.hpp) into a core::DecodeProblem (decode_problem.hpp): every
// check listed there, once, before anything runs. Same error style as validate.cpp (Error naming the argument with
// expected vs actual, TypeError for dtype / device, CapacityError for lengths past the capacity).
#include <algorithm>
#include <climits>
#include <cmath>
#include <string>

#include "core/validate.hpp"
#include "flashkv/error.hpp"

namespace flashkv::core {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

int64_t elem_size(DType t) { return t == DType::float32 ? 4 : 2; }

kv::KVFormatId format_of(DType t) {
  return t == DType::float32 ? kv::KVFormatId::fp32 : (t == DType::float16 ? kv::KVFormatId::fp16 : kv::KVFormatId::bf16);
}

void check_io_dtype(const TensorView& q) {
  if (q.dtype != DType::float32 && q.dtype != DType::float16 && q.dtype != DType::bfloat16) {
    throw TypeError("q", "float32, float16 or bfloat16", dtype_name(q.dtype));
  }
}

}  // namespace

void apply_decode_options(const DecodeOptions& o, DecodeProblem& p) {
  const float scale = o.softmax_scale.value_or(1.0f / std::sqrt(static_cast<float>(p.head_dim)));
  if (!std::isfinite(scale) || scale <= 0.0f) throw Error("options.softmax_scale", "finite and > 0", std::to_string(scale));
  if (o.window_size_left < -1) throw Error("options.window_size_left", ">= -1", str(o.window_size_left));
  if (!std::isfinite(o.softcap) || o.softcap < 0.0f) throw Error("options.softcap", "finite and >= 0", std::to_string(o.softcap));
  if (o.num_splits < 0 || o.num_splits > 1024) throw Error("options.num_splits", "0 (auto) .. 1024", str(o.num_splits));
  if (o.num_threads < 0) throw Error("options.num_threads", ">= 0 (0 = OpenMP default)", str(o.num_threads));
  if (o.max_seqlen_k < 0) throw Error("options.max_seqlen_k", ">= 0 (0 = none)", str(o.max_seqlen_k));
  p.softmax_scale = scale;
  p.causal = o.causal;
  p.window_size_left = o.window_size_left;
  p.softcap = o.softcap;
  p.num_splits = o.num_splits;
  p.num_threads = o.num_threads;
  p.stream = o.stream;
}

DecodeProblem make_decode_problem(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                                  const TensorView* page_table, const TensorView& cache_seqlens,
                                  const TensorView* k_new, const TensorView* v_new, const TensorView& out,
                                  const TensorView* lse, const DecodeOptions& options,
                                  std::vector<int64_t>& host_seqlens_k) {
  DecodeProblem p;
  check_rank_and_layout(q, "q", 4, "[batch, seqlen_q, num_heads, head_dim]");
  check_io_dtype(q);
  p.batch = q.shape[0];
  p.seqlen_q = p.max_seqlen_q = q.shape[1];
  p.num_heads = q.shape[2];
  p.head_dim = q.shape[3];
  p.total_q = p.batch * p.seqlen_q;
  if (p.head_dim < 1 || p.head_dim > kMaxHeadDim) throw Error("q", "head_dim in [1, " + str(kMaxHeadDim) + "]", str(p.head_dim));
  const bool paged = page_table != nullptr;
  check_rank_and_layout(k_cache, "k_cache", 4,
                        paged ? "[num_pages, page_size, num_heads_kv, head_dim]" : "[batch, capacity, num_heads_kv, head_dim]");
  check_rank_and_layout(v_cache, "v_cache", 4, "like k_cache");
  for (int i = 0; i < 4; ++i) check_dim(v_cache, "v_cache", i, k_cache.shape[i], "size", "(= k_cache)");
  p.num_heads_kv = k_cache.shape[2];
  check_dim(k_cache, "k_cache", 3, p.head_dim, "head_dim", "(= q.shape[3])");
  if (p.num_heads_kv < 1 || p.num_heads % p.num_heads_kv != 0) {
    throw Error("k_cache", "num_heads_kv (shape[2]) dividing num_heads = " + str(p.num_heads), str(p.num_heads_kv));
  }
  for (const auto* t : {&k_cache, &v_cache, &out}) {
    const char* name = t == &k_cache ? "k_cache" : (t == &v_cache ? "v_cache" : "out");
    check_dtype(*t, name, q.dtype);
    check_same_device(*t, name, q, "q");
  }
  check_rank_and_layout(out, "out", 4, "[batch, seqlen_q, num_heads, head_dim]");
  for (int i = 0; i < 4; ++i) check_dim(out, "out", i, q.shape[i], "size", "(= q)");
  check_rank_and_layout(cache_seqlens, "cache_seqlens", 1, "[batch]");
  check_dtype(cache_seqlens, "cache_seqlens", DType::int32);
  check_same_device(cache_seqlens, "cache_seqlens", q, "q");
  check_dim(cache_seqlens, "cache_seqlens", 0, p.batch, "batch", "(= q.shape[0])");
  int64_t page_size = 0, max_pages = 0, capacity = 0;
  if (paged) {
    check_rank_and_layout(*page_table, "page_table", 2, "[batch, max_pages_per_sequence]");
    check_dtype(*page_table, "page_table", DType::int32);
    check_same_device(*page_table, "page_table", q, "q");
    check_dim(*page_table, "page_table", 0, p.batch, "batch", "(= q.shape[0])");
    page_size = k_cache.shape[1];
    if (page_size < 16 || page_size > 256 || (page_size & (page_size - 1)) != 0) {
      throw Error("k_cache", "page_size (shape[1]) a power of two in [16, 256]", str(page_size));
    }
    max_pages = page_table->shape[1];
    capacity = max_pages * page_size;
  } else {
    check_dim(k_cache, "k_cache", 0, p.batch, "batch", "(= q.shape[0]) for a cache without page_table");
    capacity = k_cache.shape[1];
    page_size = capacity;
    max_pages = 1;
  }
  if ((k_new == nullptr) != (v_new == nullptr)) {
    throw Error(k_new == nullptr ? "k_new" : "v_new", "given together with " + std::string(k_new == nullptr ? "v_new" : "k_new"),
                "only one of them");
  }
  if (k_new != nullptr) {
    for (const TensorView* t : {k_new, v_new}) {
      const char* name = t == k_new ? "k_new" : "v_new";
      check_rank_and_layout(*t, name, 4, "[batch, seqlen_q, num_heads_kv, head_dim]");
      check_dtype(*t, name, q.dtype);
      check_same_device(*t, name, q, "q");
      check_dim(*t, name, 0, p.batch, "batch", "(= q.shape[0])");
      check_dim(*t, name, 1, p.seqlen_q, "seqlen_new", "(= q.shape[1])");
      check_dim(*t, name, 2, p.num_heads_kv, "num_heads_kv", "(= k_cache.shape[2])");
      check_dim(*t, name, 3, p.head_dim, "head_dim", "(= q.shape[3])");
      check_data(*t, name);
    }
    p.k_new = k_new->data;
    p.v_new = v_new->data;
    p.k_new_strides = {k_new->strides[0], k_new->strides[1], k_new->strides[2]};
    p.v_new_strides = {v_new->strides[0], v_new->strides[1], v_new->strides[2]};
  }
  if (lse != nullptr) {
    check_rank_and_layout(*lse, "lse", 3, "[batch, num_heads, seqlen_q]");
    check_dtype(*lse, "lse", DType::float32);
    check_same_device(*lse, "lse", q, "q");
    check_dim(*lse, "lse", 0, p.batch, "batch");
    check_dim(*lse, "lse", 1, p.num_heads, "num_heads");
    check_dim(*lse, "lse", 2, p.seqlen_q, "seqlen_q");
    check_data(*lse, "lse");
    p.lse = static_cast<float*>(lse->data);
    p.lse_strides = {lse->strides[0], lse->strides[1], lse->strides[2]};
  }
  check_data(q, "q");
  check_data(out, "out");
  check_data(k_cache, "k_cache");
  check_data(v_cache, "v_cache");
  check_data(cache_seqlens, "cache_seqlens");
  if (paged) check_data(*page_table, "page_table");
  apply_decode_options(options, p);

  p.dtype = q.dtype;
  p.device = q.device;
  p.device_index = q.device_index;
  p.q = q.data;
  p.out = out.data;
  p.q_strides = {q.strides[0], q.strides[1], q.strides[2]};
  p.out_strides = {out.strides[0], out.strides[1], out.strides[2]};

  DecodeKV& kv = p.kv;
  kv.device = q.device;
  kv.device_index = q.device_index;
  kv.page_size = static_cast<int32_t>(std::min<int64_t>(page_size, INT32_MAX));
  const int64_t es = elem_size(q.dtype);
  for (int half = 0; half < 2; ++half) {
    const TensorView& t = half == 0 ? k_cache : v_cache;
    kv.format[half] = kv::describe(format_of(q.dtype), false, 0, half == 0, static_cast<int32_t>(p.head_dim));
    kv.format_name[half] = q.dtype == DType::float32 ? "fp32" : (q.dtype == DType::float16 ? "fp16" : "bf16");
    kv::HalfPages& h = kv.pages[half];
    h.codes = static_cast<const uint8_t*>(t.data);
    h.page_stride = t.strides[0] * es;
    h.slot_stride = t.strides[1] * es;
    h.head_stride = t.strides[2] * es;
  }
  kv.page_table = paged ? static_cast<const int32_t*>(page_table->data) : nullptr;
  kv.page_table_stride = paged ? page_table->strides[0] : 0;
  kv.max_pages = max_pages;
  kv.capacity = capacity;
  kv.seqlens = static_cast<const int32_t*>(cache_seqlens.data);
  kv.seqlen_add = k_new != nullptr ? p.seqlen_q : 0;
  const int64_t add = kv.seqlen_add;
  if (options.max_seqlen_k > 0) {
    if (options.max_seqlen_k + add > capacity) {
      throw CapacityError("flashkv: paged decode past the cache capacity: options.max_seqlen_k " +
                          str(options.max_seqlen_k) + (add ? " + " + str(add) + " appended tokens" : std::string()) +
                          " > capacity " + str(capacity) + " tokens per sequence (" +
                          (paged ? str(max_pages) + " pages of " + str(page_size) : std::string("contiguous cache")) +
                          "); nothing written");
    }
    kv.promised_max_seqlen = options.max_seqlen_k;
  }
  p.max_seqlen_k = options.max_seqlen_k > 0 ? options.max_seqlen_k + add : capacity;

  if (q.device == Device::cpu) {  // the lengths are readable here: check them exactly
    host_seqlens_k.assign(static_cast<size_t>(p.batch), 0);
    const int32_t* lens = kv.seqlens;
    int64_t mx = 0;
    const int64_t num_pages = k_cache.shape[0];
    for (int64_t b = 0; b < p.batch; ++b) {
      const int64_t n = lens[b * cache_seqlens.strides[0]];
      if (n < 0) throw Error("cache_seqlens", "values >= 0", "cache_seqlens[" + str(b) + "] = " + str(n));
      if (n + add > capacity) {
        throw CapacityError("flashkv: paged decode past the cache capacity: sequence " + str(b) + " has " + str(n) +
                            " cached tokens" + (add ? " + " + str(add) + " appended" : std::string()) + " > capacity " +
                            str(capacity) + " tokens (" +
                            (paged ? str(max_pages) + " pages of " + str(page_size) : std::string("contiguous cache")) +
                            "); nothing written");
      }
      if (paged) {
        const int32_t* row = kv.page_table + b * kv.page_table_stride;
        for (int64_t j = 0; j < (n + add + page_size - 1) / page_size; ++j) {
          const int64_t id = row[j * page_table->strides[1]];
          if (id < 0 || id >= num_pages) {
            throw Error("page_table", "page ids in [0, " + str(num_pages) + ") (num_pages = k_cache.shape[0])",
                        "page_table[" + str(b) + "][" + str(j) + "] = " + str(id));
          }
        }
      }
      host_seqlens_k[static_cast<size_t>(b)] = n + add;
      mx = std::max(mx, n + add);
    }
    kv.host_seqlens_k = host_seqlens_k.data();
    p.max_seqlen_k = mx;
  }
  return p;
}

void bind_decode_io(DecodeProblem& p, const TensorView& q, const TensorView& out, const TensorView* lse) {
  check_rank_and_layout(q, "q", 3, "[total_q, num_heads, head_dim]");
  if (q.dtype != DType::float32 && q.dtype != DType::float16 && q.dtype != DType::bfloat16) {
    throw TypeError("q.dtype", "float32, float16 or bfloat16", dtype_name(q.dtype));
  }
  if (q.device != p.kv.device || (q.device != Device::cpu && q.device_index != p.kv.device_index)) {
    throw TypeError("q.device", std::string(device_name(p.kv.device)) + " (the cache's device)", device_name(q.device));
  }
  if (q.shape[0] != p.total_q) {
    throw Error("cu_seqlens_q", "last entry == q.shape[0] = " + str(q.shape[0]), str(p.total_q));
  }
  check_dim(q, "q", 2, p.head_dim, "head_dim", "(of the cache)");
  if (q.shape[1] != p.num_heads) {
    throw Error("q", "num_heads (shape[1]) " + str(p.num_heads) + " (as planned)", str(q.shape[1]));
  }
  check_rank_and_layout(out, "out", 3, "[total_q, num_heads, head_dim]");
  check_dtype(out, "out", q.dtype);
  check_same_device(out, "out", q, "q");
  check_dim(out, "out", 0, p.total_q, "total_q");
  check_dim(out, "out", 1, p.num_heads, "num_heads");
  check_dim(out, "out", 2, p.head_dim, "head_dim");
  check_data(q, "q");
  check_data(out, "out");
  p.dtype = q.dtype;
  p.device = q.device;
  p.device_index = q.device_index;
  p.q = q.data;
  p.out = out.data;
  p.q_strides = {0, q.strides[0], q.strides[1]};
  p.out_strides = {0, out.strides[0], out.strides[1]};
  p.lse = nullptr;
  if (lse != nullptr) {
    if (lse->ndim != 2) throw Error("lse", "2 dimensions [num_heads, total_q]", lse->describe());
    check_dtype(*lse, "lse", DType::float32);
    check_same_device(*lse, "lse", q, "q");
    check_dim(*lse, "lse", 0, p.num_heads, "num_heads");
    check_dim(*lse, "lse", 1, p.total_q, "total_q");
    check_data(*lse, "lse");
    p.lse = static_cast<float*>(lse->data);
    p.lse_strides = {0, lse->strides[0], lse->strides[1]};
  }
}

}  // namespace flashkv::core
