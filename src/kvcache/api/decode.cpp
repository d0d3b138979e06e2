// Public decode API (flashkv/decode.hpp) and PagedKVCache::attention: validate once into a core::DecodeProblem, plan
// on the problem's device (the CPU plan of src/kvcache/attention/, or the registered device backend's plan hook,
// core::DecodeBackend), run, record the kernel path. Never a silent fallback to another device.
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "core/backend.hpp"
#include "core/path_log.hpp"
#include "core/validate.hpp"
#include "flashkv/decode.hpp"
#include "flashkv/kvcache.hpp"
#include "kvcache/api/plan_impl.hpp"
#include "kvcache/attention/cpu_decode.hpp"
#include "kvcache/cache/cache_impl.hpp"

namespace flashkv {

DecodePlan::DecodePlan() = default;
DecodePlan::~DecodePlan() = default;
DecodePlan::DecodePlan(DecodePlan&&) noexcept = default;
DecodePlan& DecodePlan::operator=(DecodePlan&&) noexcept = default;
bool DecodePlan::valid() const { return impl_ != nullptr && impl_->work != nullptr; }
int64_t DecodePlan::batch() const { return valid() ? impl_->proto.batch : 0; }
int32_t DecodePlan::num_splits() const { return valid() ? impl_->work->num_splits() : 0; }
std::string DecodePlan::path() const { return valid() ? impl_->work->path() : std::string(); }

namespace kv {

std::unique_ptr<core::DecodeWork> plan_on_device(const core::DecodeProblem& p) {
  if (p.kv.device == Device::cpu) return kv::plan_cpu_decode(p);
  return core::require_decode_backend(p.kv.device).plan(p);
}

void bind_layer(core::DecodeProblem& p, const PagedKVCache::Impl& m, int32_t layer) {
  p.kv.layer = layer;
  for (int half = 0; half < 2; ++half) {
    p.kv.pages[half] = kv::HalfPages::of_pool(m.geom, m.codes.data(), m.meta.data(), layer, half);
  }
}

}  // namespace kv

using kv::bind_layer;
using kv::plan_on_device;

DecodePlan plan_decode(const PagedKVCache& cache, std::span<const int64_t> seq_ids,
                       std::span<const int32_t> cu_seqlens_q, int64_t num_heads, int32_t layer,
                       const DecodeOptions& options) {
  const PagedKVCache::Impl& m = *cache.impl_;
  m.check_layer(layer);
  if (num_heads < 1 || num_heads % m.cfg.num_heads_kv != 0) {
    throw Error("num_heads", "a positive multiple of num_heads_kv " + std::to_string(m.cfg.num_heads_kv),
                std::to_string(num_heads));
  }
  const int64_t batch = static_cast<int64_t>(seq_ids.size());
  if (static_cast<int64_t>(cu_seqlens_q.size()) != batch + 1) {
    throw Error("cu_seqlens_q", "batch + 1 = " + std::to_string(batch + 1) + " entries",
                std::to_string(cu_seqlens_q.size()));
  }
  if (cu_seqlens_q[0] != 0) throw Error("cu_seqlens_q", "cu_seqlens_q[0] == 0", std::to_string(cu_seqlens_q[0]));
  auto plan = std::make_unique<DecodePlan::Impl>();
  plan->cache = &m;
  plan->seq_ids.assign(seq_ids.begin(), seq_ids.end());
  plan->cu_seqlens_q.assign(cu_seqlens_q.begin(), cu_seqlens_q.end());
  int64_t max_pages = 1, max_q = 0, max_k = 0;
  for (int64_t b = 0; b < batch; ++b) {
    if (cu_seqlens_q[b + 1] < cu_seqlens_q[b]) {
      throw Error("cu_seqlens_q", "non-decreasing values", "cu_seqlens_q[" + std::to_string(b + 1) + "] = " +
                  std::to_string(cu_seqlens_q[b + 1]) + " < " + std::to_string(cu_seqlens_q[b]));
    }
    const PagedKVCache::Impl::Seq& s = m.seq(seq_ids[b], "seq_ids");
    max_pages = std::max<int64_t>(max_pages, static_cast<int64_t>(s.pages.size()));
    plan->seqlens_k.push_back(s.n[static_cast<size_t>(layer)]);
    plan->versions.push_back(s.version);
    plan->window_bases.push_back(reinterpret_cast<const uint16_t*>(s.win.data()));
    max_q = std::max<int64_t>(max_q, cu_seqlens_q[b + 1] - cu_seqlens_q[b]);
    max_k = std::max(max_k, s.n[static_cast<size_t>(layer)]);
  }
  plan->page_table.assign(static_cast<size_t>(batch * max_pages), 0);
  for (int64_t b = 0; b < batch; ++b) {
    const auto& pages = m.seq(seq_ids[b]).pages;
    std::copy(pages.begin(), pages.end(), plan->page_table.begin() + b * max_pages);
  }
  for (int half = 0; half < 2; ++half) {
    const kv::KVCodec& c = m.codec(half);
    if (c.format().scaling == kv::KVScaling::head_static) plan->head_scales[half] = c.head_scales();
    plan->format_names[half] = (half == 0 ? m.cfg.k_format : m.cfg.v_format).name();
  }

  core::DecodeProblem& p = plan->proto;
  p.batch = batch;
  p.num_heads_kv = m.cfg.num_heads_kv;
  p.num_heads = num_heads;
  p.head_dim = m.cfg.head_dim;
  p.is_varlen = true;
  p.total_q = cu_seqlens_q[batch];
  p.max_seqlen_q = max_q;
  p.host_cu_seqlens_q = plan->cu_seqlens_q.data();
  p.max_seqlen_k = max_k;
  core::apply_decode_options(options, p);
  if (options.q_dtype) {
    const DType t = *options.q_dtype;
    if (t != DType::float32 && t != DType::float16 && t != DType::bfloat16) {
      throw TypeError("options.q_dtype", "float32, float16 or bfloat16", dtype_name(t));
    }
    p.dtype = t;
  } else if (!m.on_host()) {  // the CUDA decode computes in 16-bit: the cache's own type, else bfloat16
    p.dtype = m.codec(0).format().code == kv::KVCode::f16 ? DType::float16 : DType::bfloat16;
  } else {
    p.dtype = DType::float32;
  }
  p.device = p.kv.device = m.cfg.device;
  p.device_index = p.kv.device_index = m.cfg.device_index;
  core::DecodeKV& kv = p.kv;
  kv.page_size = m.cfg.page_size;
  for (int half = 0; half < 2; ++half) {
    kv.format[half] = m.codec(half).format();
    kv.head_scales[half] = plan->head_scales[half].empty() ? nullptr : plan->head_scales[half].data();
    kv.device_head_scales[half] = m.device_head_scales(half);
    kv.format_name[half] = plan->format_names[half].c_str();
  }
  kv.paged_cache = true;
  kv.regions = m.regions;
  kv.window = m.wgeom;
  kv.window_bases = m.regions.has_window() ? plan->window_bases.data() : nullptr;
  kv.rot_signs = m.rot_signs.empty() ? nullptr : m.rot_signs.data();
  kv.rot_k = m.rot_k;
  kv.rot_v = m.rot_v;
  kv.host_page_table = plan->page_table.data();
  kv.page_table = m.on_host() ? plan->page_table.data() : nullptr;  // a device plan uploads it
  kv.page_table_stride = max_pages;
  kv.max_pages = max_pages;
  kv.capacity = max_pages * m.cfg.page_size;
  kv.host_seqlens_k = plan->seqlens_k.data();
  bind_layer(p, m, layer);
  plan->work = plan_on_device(p);
  DecodePlan out;
  out.impl_ = std::move(plan);
  return out;
}

void run_decode(const PagedKVCache& cache, DecodePlan& plan, int32_t layer, const TensorView& q, const TensorView& out,
                const TensorView* lse) {
  if (!plan.valid()) throw Error("plan", "a plan from plan_decode", "an empty DecodePlan");
  DecodePlan::Impl& pl = *plan.impl_;
  const PagedKVCache::Impl& m = *cache.impl_;
  if (pl.cache != &m) throw Error("plan", "a plan made for this cache", "a plan of another cache");
  if (pl.step) throw Error("plan", "a plan from plan_decode", "a step plan (kv::plan_step_decode; run_step_decode runs it)");
  m.check_layer(layer);
  for (size_t b = 0; b < pl.seq_ids.size(); ++b) {
    const PagedKVCache::Impl::Seq& s = m.seq(pl.seq_ids[b], "seq_ids");
    const int64_t n = s.n[static_cast<size_t>(layer)];
    if (n != pl.seqlens_k[b] || s.version != pl.versions[b]) {
      throw Error("plan", "the key lengths and pages it was made for (re-plan after appends that change them)",
                  "sequence " + std::to_string(pl.seq_ids[b]) + " has " + std::to_string(n) + " tokens in layer " +
                      std::to_string(layer) + ", planned " + std::to_string(pl.seqlens_k[b]) +
                      (s.version != pl.versions[b] ? " (its pages changed)" : ""));
    }
  }
  core::DecodeProblem p = pl.proto;
  if (!m.on_host() && q.dtype != pl.proto.dtype) {
    throw TypeError("q.dtype", std::string(dtype_name(pl.proto.dtype)) +
                                   " (the dtype this CUDA plan was made for: DecodeOptions::q_dtype)",
                    dtype_name(q.dtype));
  }
  core::bind_decode_io(p, q, out, lse);
  bind_layer(p, m, layer);
  core::record_path(pl.work->path());
  pl.work->run(p);
}

void PagedKVCache::attention(std::span<const int64_t> seq_ids, std::span<const int32_t> cu_seqlens_q, int32_t layer,
                             const TensorView& q, const TensorView& out, const TensorView* lse,
                             const KVAttentionOptions& options) const {
  core::check_rank_and_layout(q, "q", 3, "[total_q, num_heads, head_dim]");
  const int64_t hkv = impl_->cfg.num_heads_kv;
  if (q.shape[1] < 1 || q.shape[1] % hkv != 0) {
    throw Error("q", "num_heads (shape[1]) a positive multiple of num_heads_kv " + std::to_string(hkv),
                std::to_string(q.shape[1]));
  }
  if (q.dtype != DType::float32 && q.dtype != DType::float16 && q.dtype != DType::bfloat16) {
    throw TypeError("q.dtype", "float32, float16 or bfloat16", dtype_name(q.dtype));
  }
  KVAttentionOptions o = options;
  o.q_dtype = q.dtype;
  DecodePlan plan = plan_decode(*this, seq_ids, cu_seqlens_q, q.shape[1], layer, o);
  run_decode(*this, plan, layer, q, out, lse);
}

void paged_decode(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                  const TensorView* page_table, const TensorView& cache_seqlens, const TensorView* k_new,
                  const TensorView* v_new, const TensorView& out, const TensorView* lse, const DecodeOptions& options) {
  std::vector<int64_t> host_seqlens;
  const core::DecodeProblem p = core::make_decode_problem(q, k_cache, v_cache, page_table, cache_seqlens, k_new, v_new,
                                                          out, lse, options, host_seqlens);
  if (p.batch == 0 || p.num_heads == 0) return;
  std::unique_ptr<core::DecodeWork> work = plan_on_device(p);
  core::record_path(work->path());
  work->run(p);
}

}  // namespace flashkv
