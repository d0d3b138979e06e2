// Appends of several sequences at once: kv::append_device_rows (CUDA rows into a device cache: one page-table upload,
// one value check, one write launch; also the single-sequence device append of PagedKVCache::append) and the public
// batched PagedKVCache::append (flashkv/kvcache.hpp). The engine's graph-capturable step append is
// kvcache/api/cache_step.cpp.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/decode_problem.hpp"
#include "core/float16.hpp"
#include "core/validate.hpp"
#include "kvcache/cache/cache_impl.hpp"

namespace flashkv {
namespace kv {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

/// The checks of a device append that do not depend on the rows' values (UnsupportedError / TypeError naming them).
void check_device_append(const PagedKVCache::Impl& m, const DeviceRows& r) {
  const KVCacheConfig& c = m.cfg;
  if (m.regions.has_window() || m.rot_k || m.rot_v) {
    throw UnsupportedError("flashkv: appending CUDA tensors to a cache with sinks, a residual window, KIVI keys (their "
                           "bf16 tail) or rotation is not supported on the device yet (this cache: " +
                           c.k_format.name() + "/" + c.v_format.name() + ", sink_tokens " + str(c.sink_tokens) +
                           ", residual_tokens " + str(c.residual_tokens) + "); append host tensors (quantized on the "
                           "host, uploaded)");
  }
  const bool sixteen = c.k_format == c.v_format && (c.k_format.format == KVFormat::bf16 || c.k_format.format == KVFormat::fp16);
  const DType want = c.k_format.format == KVFormat::fp16 ? DType::float16 : DType::bfloat16;
  if (sixteen && r.dtype != want) {
    throw TypeError("k.dtype", std::string(dtype_name(want)) + " (the cache's format)", dtype_name(r.dtype));
  }
  if (r.device_index != c.device_index) {
    throw TypeError("k.device", "cuda:" + str(c.device_index) + " (the cache's device)", "cuda:" + str(r.device_index));
  }
}

}  // namespace

void check_append_rows(const PagedKVCache::Impl& m, const TensorView& k, const TensorView& v, int rank) {
  const KVCacheConfig& c = m.cfg;
  const char* layout = rank == 3 ? "[n_tokens, num_heads_kv, head_dim]" : "[batch, n_tokens, num_heads_kv, head_dim]";
  core::check_rank_and_layout(k, "k", rank, layout);
  core::check_rank_and_layout(v, "v", rank, layout);
  if (k.dtype != DType::float32 && k.dtype != DType::float16 && k.dtype != DType::bfloat16) {
    throw TypeError("k.dtype", "float32, float16 or bfloat16", dtype_name(k.dtype));
  }
  core::check_dtype(v, "v", k.dtype);
  core::check_same_device(v, "v", k, "k");
  if (k.device != Device::cpu && !(k.device == c.device && c.device != Device::cpu)) {
    throw TypeError("k.device", std::string("cpu") + (c.device != Device::cpu ? " or the cache's device" : ""),
                    device_name(k.device));
  }
  const int r = rank - 3;  // the leading batch dimension, if any
  core::check_dim(k, "k", r + 1, c.num_heads_kv, "num_heads_kv");
  core::check_dim(k, "k", r + 2, c.head_dim, "head_dim");
  if (r == 1) core::check_dim(v, "v", 0, k.shape[0], "batch (= k.shape[0])");
  core::check_dim(v, "v", r, k.shape[r], "n_tokens (= k.shape[" + std::to_string(r) + "])");
  core::check_dim(v, "v", r + 1, c.num_heads_kv, "num_heads_kv");
  core::check_dim(v, "v", r + 2, c.head_dim, "head_dim");
  core::check_data(k, "k");
  core::check_data(v, "v");
}

void append_device_rows(PagedKVCache::Impl& m, std::span<const int64_t> seq_ids, int32_t layer, int64_t n_tokens,
                        const DeviceRows& rows) {
  const KVCacheConfig& c = m.cfg;
  check_device_append(m, rows);
  const int64_t batch = static_cast<int64_t>(seq_ids.size());
  if (batch == 0 || n_tokens == 0) return;
  // pages for every sequence first (all or nothing)
  std::vector<int64_t> need(static_cast<size_t>(batch));
  int64_t extra = 0, stride = 1;
  for (int64_t b = 0; b < batch; ++b) {
    const PagedKVCache::Impl::Seq& s = m.seq(seq_ids[static_cast<size_t>(b)], "seq_ids");
    const int64_t n1 = s.n[static_cast<size_t>(layer)] + n_tokens;
    need[static_cast<size_t>(b)] = (n1 + c.page_size - 1) / c.page_size;
    extra += std::max<int64_t>(0, need[static_cast<size_t>(b)] - static_cast<int64_t>(s.pages.size()));
  }
  m.reserve_pages(extra, "appending " + str(n_tokens) + " tokens to " + str(batch) + " sequence(s) in layer " +
                             str(layer));
  std::vector<size_t> pages_before(static_cast<size_t>(batch));
  std::vector<uint64_t> version_before(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    PagedKVCache::Impl::Seq& s = m.seqs.at(seq_ids[static_cast<size_t>(b)]);
    pages_before[static_cast<size_t>(b)] = s.pages.size();
    version_before[static_cast<size_t>(b)] = s.version;
    while (static_cast<int64_t>(s.pages.size()) < need[static_cast<size_t>(b)]) m.take_page(s);
    stride = std::max<int64_t>(stride, static_cast<int64_t>(s.pages.size()));
  }
  auto give_back = [&] {  // in reverse, so the free list is as before; refilled with 0xFF (cache_impl.hpp: free pages
                          // hold 0xFF), since the write launch may have put the rejected call's rows in them
    for (int64_t b = batch - 1; b >= 0; --b) {
      PagedKVCache::Impl::Seq& s = m.seqs.at(seq_ids[static_cast<size_t>(b)]);
      while (s.pages.size() > pages_before[static_cast<size_t>(b)]) {
        const int64_t page = s.pages.back();
        m.codes.fill(page * m.geom.page_code_bytes(), m.geom.page_code_bytes(), 0xFF);
        m.meta.fill(page * m.geom.page_meta_bytes(), m.geom.page_meta_bytes(), 0xFF);
        m.free_list.push_back(s.pages.back());
        s.pages.pop_back();
      }
      s.version = version_before[static_cast<size_t>(b)];
    }
  };
  try {
    // one upload: lengths [batch], then the page table [batch, stride]
    std::vector<int32_t> host(static_cast<size_t>(batch * (1 + stride)), 0);
    for (int64_t b = 0; b < batch; ++b) {
      const PagedKVCache::Impl::Seq& s = m.seqs.at(seq_ids[static_cast<size_t>(b)]);
      host[static_cast<size_t>(b)] = static_cast<int32_t>(s.n[static_cast<size_t>(layer)]);
      std::copy(s.pages.begin(), s.pages.end(), host.begin() + batch + b * stride);
    }
    kv::Storage tables(c.device, c.device_index, static_cast<int64_t>(host.size()) * 4, 0);
    tables.write(0, host.data(), static_cast<int64_t>(host.size()) * 4);
    core::DecodeProblem p;
    p.batch = batch;
    p.num_heads_kv = c.num_heads_kv;
    p.head_dim = c.head_dim;
    p.seqlen_q = n_tokens;
    p.dtype = rows.dtype;
    p.device = Device::cuda;
    p.device_index = c.device_index;
    p.k_new = rows.k;
    p.v_new = rows.v;
    p.k_new_strides = {rows.k_strides[0], rows.k_strides[1], rows.k_strides[2]};
    p.v_new_strides = {rows.v_strides[0], rows.v_strides[1], rows.v_strides[2]};
    p.kv.device = Device::cuda;
    p.kv.device_index = c.device_index;
    p.kv.page_size = c.page_size;
    p.kv.paged_cache = true;
    const std::string names[2] = {c.k_format.name(), c.v_format.name()};
    for (int half = 0; half < 2; ++half) {
      p.kv.pages[half] = kv::HalfPages::of_pool(m.geom, m.codes.data(), m.meta.data(), layer, half);
      p.kv.format[half] = m.codec(half).format();
      p.kv.format_name[half] = names[half].c_str();
      if (p.kv.format[half].scaling == kv::KVScaling::head_static) p.kv.head_scales[half] = m.codec(half).head_scales().data();
      p.kv.device_head_scales[half] = m.device_head_scales(half);
    }
    const int32_t* dev = reinterpret_cast<const int32_t*>(tables.data());
    p.kv.seqlens = dev;
    p.kv.page_table = dev + batch;
    p.kv.page_table_stride = stride;
    p.kv.max_pages = stride;
    p.kv.capacity = stride * c.page_size;
    p.kv.seqlen_add = n_tokens;
    const core::DecodeBackend& be = core::require_decode_backend(Device::cuda);
    if (be.append == nullptr) throw UnsupportedError("flashkv: the CUDA backend has no KV append");
    be.append(p);  // values checked inside the write launch (an Error: rows may sit past the lengths and in the pages
                   // given back, which are refilled); synchronizes before `tables` is freed
  } catch (...) {
    give_back();
    throw;
  }
  for (int64_t b = 0; b < batch; ++b) {
    PagedKVCache::Impl::Seq& s = m.seqs.at(seq_ids[static_cast<size_t>(b)]);
    s.n[static_cast<size_t>(layer)] += n_tokens;
    s.nq[static_cast<size_t>(layer)] = s.n[static_cast<size_t>(layer)];
  }
}

}  // namespace kv

namespace {
/// Element (b, i, h, c) of a rank-4 host tensor as float.
float load4(const TensorView& t, int64_t b, int64_t i, int64_t h, int64_t c) {
  const int64_t off = b * t.strides[0] + i * t.strides[1] + h * t.strides[2] + c * t.strides[3];
  if (t.dtype == DType::float32) return static_cast<const float*>(t.data)[off];
  const uint16_t bits = static_cast<const uint16_t*>(t.data)[off];
  return t.dtype == DType::bfloat16 ? bf16_to_float(bits) : fp16_to_float(bits);
}
}  // namespace

void PagedKVCache::append(std::span<const int64_t> seq_ids, int32_t layer, const TensorView& k, const TensorView& v) {
  Impl& m = *impl_;
  const KVCacheConfig& c = m.cfg;
  m.check_layer(layer);
  kv::check_append_rows(m, k, v, 4);
  const int64_t batch = static_cast<int64_t>(seq_ids.size());
  core::check_dim(k, "k", 0, batch, "batch (= seq_ids.size())");
  for (int64_t b = 0; b < batch; ++b) {
    (void)m.seq(seq_ids[static_cast<size_t>(b)], "seq_ids");
    for (int64_t j = 0; j < b; ++j)
      if (seq_ids[static_cast<size_t>(j)] == seq_ids[static_cast<size_t>(b)])
        throw Error("seq_ids", "distinct sequence ids", "id " + std::to_string(seq_ids[static_cast<size_t>(b)]) + " twice");
  }
  const int64_t N = k.shape[1];
  if (N == 0 || batch == 0) return;
  if (k.device != Device::cpu) {
    kv::DeviceRows rows;
    rows.k = k.data, rows.v = v.data, rows.dtype = k.dtype, rows.device_index = k.device_index;
    for (int i = 0; i < 3; ++i) rows.k_strides[i] = k.strides[i], rows.v_strides[i] = v.strides[i];
    kv::append_device_rows(m, seq_ids, layer, N, rows);
    return;
  }
  // Host tensors: every check of the per-block appends first (pages for all blocks, every value), then the blocks in
  // turn — none of which can fail any more.
  int64_t extra = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const Impl::Seq& s = m.seq(seq_ids[static_cast<size_t>(b)]);
    const int64_t q1 = m.quant_count(s.n[static_cast<size_t>(layer)] + N);
    extra += std::max<int64_t>(0, (q1 + c.page_size - 1) / c.page_size - static_cast<int64_t>(s.pages.size()));
  }
  m.reserve_pages(extra, "appending " + std::to_string(N) + " tokens to " + std::to_string(batch) +
                             " sequences in layer " + std::to_string(layer));
  for (int half = 0; half < 2; ++half) {
    const TensorView& t = half == 0 ? k : v;
    const kv::KVHalfFormat& f = m.codec(half).format();
    const bool fp16 = f.code == kv::KVCode::f16 || f.scaling == kv::KVScaling::token_affine ||
                      f.scaling == kv::KVScaling::channel_affine;
    const float lim = fp16 ? 65504.0f : 3.0e38f;
    const bool limit = fp16 || m.round_bf16;
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t i = 0; i < N; ++i)
        for (int64_t h = 0; h < c.num_heads_kv; ++h)
          for (int64_t e = 0; e < c.head_dim; ++e) {
            const float x = load4(t, b, i, h, e);
            if (!std::isfinite(x) || (limit && std::fabs(x) > lim)) {
              throw Error(half == 0 ? "k" : "v",
                          "finite values" + std::string(fp16 ? " with |x| <= 65504 (fp16 range of this format)" : ""),
                          std::to_string(x) + " at [" + std::to_string(b) + ", " + std::to_string(i) + ", " +
                              std::to_string(h) + ", " + std::to_string(e) + "]");
            }
          }
  }
  for (int64_t b = 0; b < batch; ++b) {
    TensorView kb = TensorView::contiguous(nullptr, k.dtype, {N, c.num_heads_kv, c.head_dim}, k.device, k.device_index);
    TensorView vb = kb;
    const int64_t es = k.dtype == DType::float32 ? 4 : 2;
    kb.data = static_cast<char*>(k.data) + b * k.strides[0] * es;
    vb.data = static_cast<char*>(v.data) + b * v.strides[0] * es;
    for (int d = 0; d < 3; ++d) kb.strides[d] = k.strides[d + 1], vb.strides[d] = v.strides[d + 1];
    append(seq_ids[static_cast<size_t>(b)], layer, kb, vb);
  }
}

}  // namespace flashkv
