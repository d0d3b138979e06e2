// Engine steps over device tables (cache_step.hpp).
#include "kvcache/api/cache_step.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/decode_problem.hpp"
#include "core/path_log.hpp"
#include "core/validate.hpp"
#include "kvcache/api/plan_impl.hpp"

namespace flashkv::kv {
namespace {

using Impl = PagedKVCache::Impl;

std::string str(int64_t v) { return std::to_string(v); }

void check_step_cache(const Impl& m) {
  const KVCacheConfig& c = m.cfg;
  if (m.on_host() || m.regions.has_window() || m.rot_k || m.rot_v) {
    throw UnsupportedError("flashkv: engine steps over device tables need a device cache without sinks, residual "
                           "window, KIVI keys or rotation (this cache: " + c.k_format.name() + "/" +
                           c.v_format.name() + " on " + device_name(c.device) + ", sink_tokens " +
                           str(c.sink_tokens) + ", residual_tokens " + str(c.residual_tokens) + ")");
  }
}

/// The sizes, formats and pages-independent description of a step problem (no tables, no layer).
core::DecodeProblem step_problem(const Impl& m, int64_t batch, int64_t n_new, DType dtype, void* stream) {
  const KVCacheConfig& c = m.cfg;
  core::DecodeProblem p;
  p.batch = batch;
  p.num_heads_kv = c.num_heads_kv;
  p.head_dim = c.head_dim;
  p.seqlen_q = n_new;
  p.dtype = dtype;
  p.device = p.kv.device = c.device;
  p.device_index = p.kv.device_index = c.device_index;
  p.stream = stream;
  core::DecodeKV& kv = p.kv;
  kv.page_size = c.page_size;
  kv.paged_cache = true;
  for (int half = 0; half < 2; ++half) {
    kv.format[half] = m.codec(half).format();
    if (kv.format[half].scaling == KVScaling::head_static) kv.head_scales[half] = m.codec(half).head_scales().data();
    kv.device_head_scales[half] = m.device_head_scales(half);
  }
  kv.seqlen_add = n_new;
  return p;
}

void bind_tables(core::DecodeProblem& p, const Impl& m, const StepTables& t) {
  if (t.stride < 1) throw Error("tables.stride", ">= 1 pages", str(t.stride));
  p.kv.seqlens = t.seqlens;
  p.kv.page_table = t.page_table;
  p.kv.page_table_stride = t.stride;
  p.kv.max_pages = t.stride;
  p.kv.capacity = t.stride * m.cfg.page_size;
  p.cu_seqlens_q = t.cu_seqlens_q;
}

const core::DecodeBackend& backend(const Impl& m) { return core::require_decode_backend(m.cfg.device); }

}  // namespace

int64_t step_reserve(PagedKVCache& cache, std::span<const int64_t> seq_ids, int64_t n_new) {
  Impl& m = CacheAccess::impl(cache);
  check_step_cache(m);
  if (n_new < 1) throw Error("n_new", ">= 1 tokens per sequence", str(n_new));
  const int64_t P = m.cfg.page_size;
  std::vector<int64_t> need(seq_ids.size());
  int64_t extra = 0;
  for (size_t b = 0; b < seq_ids.size(); ++b) {
    const Impl::Seq& s = m.seq(seq_ids[b], "seq_ids");
    for (size_t j = 0; j < b; ++j)
      if (seq_ids[j] == seq_ids[b]) throw Error("seq_ids", "distinct sequence ids", "id " + str(seq_ids[b]) + " twice");
    const int64_t n = s.n[0];
    for (size_t l = 1; l < s.n.size(); ++l)
      if (s.n[l] != n)
        throw Error("seq_ids", "sequences of the same length in every layer (an engine step)",
                    "sequence " + str(seq_ids[b]) + ": " + str(n) + " tokens in layer 0, " + str(s.n[l]) +
                        " in layer " + str(static_cast<int64_t>(l)));
    need[b] = (n + n_new + P - 1) / P;
    extra += std::max<int64_t>(0, need[b] - static_cast<int64_t>(s.pages.size()));
  }
  m.reserve_pages(extra, "a step growing " + str(static_cast<int64_t>(seq_ids.size())) + " sequence(s) by " +
                             str(n_new) + " tokens");
  int64_t max_pages = 1;
  for (size_t b = 0; b < seq_ids.size(); ++b) {
    Impl::Seq& s = m.seqs.at(seq_ids[b]);
    while (static_cast<int64_t>(s.pages.size()) < need[b]) m.take_page(s);
    max_pages = std::max<int64_t>(max_pages, static_cast<int64_t>(s.pages.size()));
  }
  return max_pages;
}

void step_host_tables(const PagedKVCache& cache, std::span<const int64_t> seq_ids, int64_t n_new, int64_t stride,
                      int32_t* seqlens, int32_t* cu_seqlens_q, int32_t* page_table) {
  const Impl& m = CacheAccess::impl(cache);
  cu_seqlens_q[0] = 0;
  for (size_t b = 0; b < seq_ids.size(); ++b) {
    const Impl::Seq& s = m.seq(seq_ids[b], "seq_ids");
    if (static_cast<int64_t>(s.pages.size()) > stride)
      throw Error("stride", ">= " + str(static_cast<int64_t>(s.pages.size())) + " pages (sequence " + str(seq_ids[b]) +
                                "'s)", str(stride));
    seqlens[b] = static_cast<int32_t>(s.n[0]);
    cu_seqlens_q[b + 1] = static_cast<int32_t>(static_cast<int64_t>(b + 1) * n_new);
    int32_t* row = page_table + static_cast<int64_t>(b) * stride;
    std::copy(s.pages.begin(), s.pages.end(), row);
    std::fill(row + s.pages.size(), row + stride, 0);
  }
}

void step_append(const PagedKVCache& cache, const StepTables& tables, int64_t batch, int64_t n_new, int32_t layer,
                 const StepRows& rows, unsigned long long* bad, void* stream) {
  const Impl& m = CacheAccess::impl(cache);
  check_step_cache(m);
  m.check_layer(layer);
  const KVCacheConfig& c = m.cfg;
  const bool sixteen = c.k_format == c.v_format && (c.k_format.format == KVFormat::bf16 || c.k_format.format == KVFormat::fp16);
  const DType want = c.k_format.format == KVFormat::fp16 ? DType::float16 : DType::bfloat16;
  if (sixteen && rows.dtype != want)
    throw TypeError("rows.dtype", std::string(dtype_name(want)) + " (the cache's format)", dtype_name(rows.dtype));
  core::DecodeProblem p = step_problem(m, batch, n_new, rows.dtype, stream);
  bind_tables(p, m, tables);
  bind_layer(p, m, layer);
  p.k_new = rows.k;
  p.v_new = rows.v;
  p.k_new_strides = p.v_new_strides = {rows.batch_stride, rows.row_stride, rows.head_stride};
  const std::string names[2] = {c.k_format.name(), c.v_format.name()};
  p.kv.format_name[0] = names[0].c_str();
  p.kv.format_name[1] = names[1].c_str();
  const core::DecodeBackend& be = backend(m);
  if (be.append_step == nullptr) throw UnsupportedError("flashkv: the device backend has no step append");
  be.append_step(p, bad);
}

void step_commit(PagedKVCache& cache, std::span<const int64_t> seq_ids, int64_t n_new) {
  Impl& m = CacheAccess::impl(cache);
  for (int64_t id : seq_ids) {
    Impl::Seq& s = m.seqs.at(id);
    for (size_t l = 0; l < s.n.size(); ++l) {
      s.n[l] += n_new;
      s.nq[l] = m.quant_count(s.n[l]);
    }
  }
}

DecodePlan plan_step_decode(const PagedKVCache& cache, const StepTables& tables, int64_t batch, int64_t n_new,
                            int64_t num_heads, int64_t max_seqlen_k, DType q_dtype, void* stream) {
  const Impl& m = CacheAccess::impl(cache);
  check_step_cache(m);
  if (num_heads < 1 || num_heads % m.cfg.num_heads_kv != 0)
    throw Error("num_heads", "a positive multiple of num_heads_kv " + str(m.cfg.num_heads_kv), str(num_heads));
  auto plan = std::make_unique<DecodePlan::Impl>();
  plan->cache = &m;
  plan->step = true;
  plan->cu_seqlens_q.resize(static_cast<size_t>(batch + 1));
  for (int64_t b = 0; b <= batch; ++b) plan->cu_seqlens_q[static_cast<size_t>(b)] = static_cast<int32_t>(b * n_new);
  for (int half = 0; half < 2; ++half) {
    plan->format_names[half] = (half == 0 ? m.cfg.k_format : m.cfg.v_format).name();
    plan->head_scales[half] = m.codec(half).head_scales();
  }
  core::DecodeProblem& p = plan->proto;
  p = step_problem(m, batch, n_new, q_dtype, stream);
  for (int half = 0; half < 2; ++half) {
    p.kv.format_name[half] = plan->format_names[half].c_str();
    if (p.kv.format[half].scaling == KVScaling::head_static) p.kv.head_scales[half] = plan->head_scales[half].data();
  }
  p.num_heads = num_heads;
  p.is_varlen = true;
  p.total_q = batch * n_new;
  p.max_seqlen_q = n_new;
  p.host_cu_seqlens_q = plan->cu_seqlens_q.data();
  p.max_seqlen_k = max_seqlen_k;
  DecodeOptions o;
  o.causal = true;
  o.stream = stream;
  core::apply_decode_options(o, p);
  bind_tables(p, m, tables);
  bind_layer(p, m, 0);
  plan->work = plan_on_device(p);
  DecodePlan out;
  out.impl_ = std::move(plan);
  return out;
}

int32_t step_decode_splits(const PagedKVCache& cache, int64_t batch, int64_t n_new, int64_t num_heads,
                           int64_t max_seqlen_k, DType q_dtype) {
  const Impl& m = CacheAccess::impl(cache);
  check_step_cache(m);
  core::DecodeProblem p = step_problem(m, batch, n_new, q_dtype, nullptr);
  const std::string names[2] = {m.cfg.k_format.name(), m.cfg.v_format.name()};
  p.kv.format_name[0] = names[0].c_str();
  p.kv.format_name[1] = names[1].c_str();
  p.num_heads = num_heads;
  p.max_seqlen_q = n_new;
  p.max_seqlen_k = max_seqlen_k;
  const core::DecodeBackend& be = backend(m);
  if (be.num_splits == nullptr) throw UnsupportedError("flashkv: the device backend has no split query");
  return be.num_splits(p);
}

void run_step_decode(const PagedKVCache& cache, DecodePlan& plan, int32_t layer, const TensorView& q,
                     const TensorView& out) {
  if (!plan.valid() || !plan.impl_->step) throw Error("plan", "a plan from plan_step_decode", "another plan");
  DecodePlan::Impl& pl = *plan.impl_;
  const Impl& m = CacheAccess::impl(cache);
  if (pl.cache != &m) throw Error("plan", "a plan made for this cache", "a plan of another cache");
  m.check_layer(layer);
  if (q.dtype != pl.proto.dtype)
    throw TypeError("q.dtype", std::string(dtype_name(pl.proto.dtype)) + " (the step plan's)", dtype_name(q.dtype));
  core::DecodeProblem p = pl.proto;
  core::bind_decode_io(p, q, out, nullptr);
  bind_layer(p, m, layer);
  core::record_path(pl.work->path());
  pl.work->run(p);
}

}  // namespace flashkv::kv
