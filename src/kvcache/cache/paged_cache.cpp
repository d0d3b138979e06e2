// PagedKVCache: pool and free list (kv::Storage on the cache's device, laid out by kv::PageGeometry), sequences,
// quantize-on-write append (sinks / quantized stream / residual ring), dequantize, copies between devices, exact
// memory accounting. Attention: src/kvcache/api/decode.cpp (plan / run). See include/flashkv/kvcache.hpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <string>

#include "core/backend.hpp"
#include "core/decode_problem.hpp"
#include "core/float16.hpp"
#include "core/validate.hpp"
#include "kvcache/cache/cache_impl.hpp"

namespace flashkv {

// ---- Hadamard rotation ----------------------------------------------------------------------------------------------
std::vector<float> hadamard_signs(int32_t n, uint64_t seed) {
  std::vector<float> s(static_cast<size_t>(n));
  uint64_t state = seed;
  for (int32_t i = 0; i < n; ++i) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);  // splitmix64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    s[static_cast<size_t>(i)] = (z & 1) ? -1.0f : 1.0f;
  }
  return s;
}

void hadamard_rotate(float* x, int32_t n, const float* signs, bool inverse) {
  if (!inverse) {
    for (int32_t i = 0; i < n; ++i) x[i] *= signs[i];
  }
  for (int32_t h = 1; h < n; h *= 2) {
    for (int32_t i = 0; i < n; i += 2 * h) {
      for (int32_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  const float norm = 1.0f / std::sqrt(static_cast<float>(n));
  for (int32_t i = 0; i < n; ++i) x[i] *= norm;
  if (inverse) {
    for (int32_t i = 0; i < n; ++i) x[i] *= signs[i];
  }
}

// ---- construction ---------------------------------------------------------------------------------------------------
namespace {
constexpr int64_t kInitialGrowPages = 16;
}  // namespace

PagedKVCache::Impl::Impl(const KVCacheConfig& c) : cfg(c) {
  cfg.validate();
  const int32_t H = cfg.num_heads_kv, d = cfg.head_dim, P = cfg.page_size;
  kcodec = kv::make_codec(cfg.k_format, true, d, P, H, cfg.k_scales);
  vcodec = kv::make_codec(cfg.v_format, false, d, P, H, cfg.v_scales);
  kb = kcodec->bytes();
  vb = vcodec->bytes();
  int32_t g = 1;
  if (cfg.k_format.is_kivi()) g = kb.tokens_per_group;
  if (cfg.v_format.is_kivi()) g = std::max(g, cfg.v_format.group_size > 0 ? cfg.v_format.group_size : 32);
  if (P % g != 0) {
    throw Error("page_size", "a multiple of the quantization group " + std::to_string(g), std::to_string(P));
  }
  regions.sink_tokens = cfg.sink_tokens;
  regions.residual_tokens = cfg.residual_tokens;
  regions.gq = g;
  round_bf16 = regions.has_window();
  rot_k = cfg.rotation == KVRotation::hadamard && cfg.k_format.is_quantized();
  rot_v = cfg.rotation == KVRotation::hadamard && cfg.v_format.is_quantized();
  if (rot_k || rot_v) rot_signs = hadamard_signs(d, cfg.rotation_seed);

  geom.num_layers = cfg.num_layers;
  geom.num_heads_kv = H;
  geom.page_size = P;
  geom.code_bytes[0] = static_cast<int32_t>(kb.code_bytes_per_token_head);
  geom.code_bytes[1] = static_cast<int32_t>(vb.code_bytes_per_token_head);
  geom.meta_bytes_per_page_head[0] = kb.meta_bytes_per_page_head;
  geom.meta_bytes_per_page_head[1] = vb.meta_bytes_per_page_head;
  wgeom.num_heads_kv = H;
  wgeom.head_dim = d;
  wgeom.window_tokens = regions.window_tokens();

  const int64_t pb = page_bytes();
  growable = cfg.capacity_pages == 0 && cfg.capacity_bytes == 0;
  num_pages = growable ? kInitialGrowPages : (cfg.capacity_pages > 0 ? cfg.capacity_pages : cfg.capacity_bytes / pb);
  if (num_pages < 1) {
    throw Error("capacity_bytes", ">= one page (" + std::to_string(pb) + " bytes)", std::to_string(cfg.capacity_bytes));
  }
  if (num_pages > (int64_t{1} << 31) - 1) throw Error("capacity_pages", "< 2^31 pages", std::to_string(num_pages));
  try {
    codes = kv::Storage(cfg.device, cfg.device_index, num_pages * geom.page_code_bytes(), 0xFF);
    meta = kv::Storage(cfg.device, cfg.device_index, num_pages * geom.page_meta_bytes(), 0xFF);
  } catch (const CapacityError&) {
    throw CapacityError("flashkv: cannot reserve the KV page pool: " + std::to_string(num_pages * pb) + " bytes (" +
                        std::to_string(num_pages) + " pages) on " + device_name(cfg.device));
  }
  free_list.reserve(static_cast<size_t>(num_pages));
  for (int64_t p = num_pages - 1; p >= 0; --p) free_list.push_back(static_cast<int32_t>(p));
  upload_head_scales();
}

void PagedKVCache::Impl::upload_head_scales() {
  for (int half = 0; half < 2; ++half) {
    const kv::KVCodec& c = codec(half);
    if (on_host() || c.format().scaling != kv::KVScaling::head_static || c.head_scales().empty()) continue;
    const int64_t bytes = static_cast<int64_t>(c.head_scales().size()) * 4;
    head_scales_dev[half] = kv::Storage(cfg.device, cfg.device_index, bytes, 0);
    head_scales_dev[half].write(0, c.head_scales().data(), bytes);
  }
}

PagedKVCache::Impl::Impl(const Impl& o, Device device, int32_t device_index)
    : cfg(o.cfg), kb(o.kb), vb(o.vb), geom(o.geom), regions(o.regions), wgeom(o.wgeom), round_bf16(o.round_bf16),
      rot_k(o.rot_k), rot_v(o.rot_v), rot_signs(o.rot_signs), growable(o.growable), num_pages(o.num_pages),
      free_list(o.free_list), next_version(o.next_version) {
  cfg.device = device;
  cfg.device_index = device_index;
  cfg.validate();
  kcodec = kv::make_codec(cfg.k_format, true, cfg.head_dim, cfg.page_size, cfg.num_heads_kv, cfg.k_scales);
  vcodec = kv::make_codec(cfg.v_format, false, cfg.head_dim, cfg.page_size, cfg.num_heads_kv, cfg.v_scales);
  codes = kv::Storage(device, device_index, o.codes.bytes(), 0xFF);
  codes.copy_from(o.codes, 0, 0, o.codes.bytes());
  meta = kv::Storage(device, device_index, o.meta.bytes(), 0xFF);
  meta.copy_from(o.meta, 0, 0, o.meta.bytes());
  for (const auto& [id, s] : o.seqs) {
    Seq t;
    t.pages = s.pages;
    t.n = s.n;
    t.nq = s.nq;
    t.version = s.version;
    t.win = kv::Storage(device, device_index, s.win.bytes(), 0);
    t.win.copy_from(s.win, 0, 0, s.win.bytes());
    seqs.emplace(id, std::move(t));
  }
  upload_head_scales();
}

const PagedKVCache::Impl::Seq& PagedKVCache::Impl::seq(int64_t seq_id, const char* arg) const {
  auto it = seqs.find(seq_id);
  if (it == seqs.end()) throw Error(arg, "a registered sequence id", std::to_string(seq_id) + " (unknown)");
  return it->second;
}

void PagedKVCache::Impl::check_layer(int32_t layer) const {
  if (layer < 0 || layer >= cfg.num_layers) {
    throw Error("layer", "0.." + std::to_string(cfg.num_layers - 1), std::to_string(layer));
  }
}

void PagedKVCache::Impl::reserve_pages(int64_t extra, const std::string& what) {
  if (extra <= static_cast<int64_t>(free_list.size())) return;
  if (!growable) {
    throw CapacityError("flashkv: KV cache full: " + what + " needs " + std::to_string(extra) + " new pages, " +
                        std::to_string(free_list.size()) + " free of " + std::to_string(num_pages) +
                        " (cache unchanged)");
  }
  const int64_t need = num_pages + extra - static_cast<int64_t>(free_list.size());
  int64_t target = num_pages;
  while (target < need) target *= 2;
  if (target > (int64_t{1} << 31) - 1) throw CapacityError("flashkv: KV cache pool would exceed 2^31 pages");
  try {
    codes.grow(target * geom.page_code_bytes(), 0xFF);
    meta.grow(target * geom.page_meta_bytes(), 0xFF);
  } catch (const CapacityError&) {
    throw CapacityError("flashkv: KV cache full: " + what + " needs " + std::to_string(extra) +
                        " new pages and the pool cannot grow from " + std::to_string(num_pages) + " to " +
                        std::to_string(target) + " pages (" + std::to_string(target * page_bytes()) +
                        " bytes) on " + device_name(cfg.device) + " (cache unchanged)");
  }
  // new pages go below the existing free ones, so pages are still handed out in ascending order
  std::vector<int32_t> fresh;
  for (int64_t p = target - 1; p >= num_pages; --p) fresh.push_back(static_cast<int32_t>(p));
  free_list.insert(free_list.begin(), fresh.begin(), fresh.end());
  num_pages = target;
}

void PagedKVCache::Impl::take_page(Seq& s) {
  s.pages.push_back(free_list.back());
  free_list.pop_back();
  s.version = next_version++;
}

void PagedKVCache::Impl::decode_range(const Seq& s, int32_t layer, int half, int32_t head, int64_t p0, int64_t p1,
                                      float* out) const {
  const int64_t S = cfg.sink_tokens, d = cfg.head_dim;
  const int64_t nq = s.nq[static_cast<size_t>(layer)];
  if (p0 >= S && p0 < S + nq) {
    const int64_t i = p0 - S;
    const int32_t page = s.pages[static_cast<size_t>(i / cfg.page_size)];
    codec(half).decode(head, code_ptr(page, layer, half, head), meta_ptr(page, layer, half, head),
                       static_cast<int32_t>(i % cfg.page_size), static_cast<int32_t>(p1 - p0), out);
    return;
  }
  const uint16_t* w = win_ptr(s, layer, half, head);
  for (int64_t p = p0; p < p1; ++p) {
    const uint16_t* row = w + win_slot(p) * d;
    float* o = out + (p - p0) * d;
    for (int64_t c = 0; c < d; ++c) o[c] = bf16_to_float(row[c]);
  }
}

// ---- public API -----------------------------------------------------------------------------------------------------
PagedKVCache::PagedKVCache(const KVCacheConfig& config) : impl_(std::make_unique<Impl>(config)) {}
PagedKVCache::~PagedKVCache() = default;
PagedKVCache::PagedKVCache(PagedKVCache&&) noexcept = default;
PagedKVCache& PagedKVCache::operator=(PagedKVCache&&) noexcept = default;

const KVCacheConfig& PagedKVCache::config() const { return impl_->cfg; }
Device PagedKVCache::device() const { return impl_->cfg.device; }
int64_t PagedKVCache::free_pages() const { return static_cast<int64_t>(impl_->free_list.size()); }
int64_t PagedKVCache::page_bytes() const { return impl_->page_bytes(); }

PagedKVCache PagedKVCache::to(Device device, int32_t device_index) const {
  PagedKVCache c(std::unique_ptr<Impl>(new Impl(*impl_, device, device_index)));
  return c;
}

PagedKVCache::PagedKVCache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

void PagedKVCache::add_sequence(int64_t seq_id) {
  Impl& m = *impl_;
  if (seq_id < 0) throw Error("seq_id", ">= 0", std::to_string(seq_id));
  if (m.seqs.count(seq_id)) throw Error("seq_id", "an id not yet registered", std::to_string(seq_id) + " (exists)");
  Impl::Seq s;
  s.n.assign(static_cast<size_t>(m.cfg.num_layers), 0);
  s.nq.assign(static_cast<size_t>(m.cfg.num_layers), 0);
  s.win = kv::Storage(m.cfg.device, m.cfg.device_index, m.seq_window_bytes(), 0);
  s.version = m.next_version++;
  m.seqs.emplace(seq_id, std::move(s));
}

void PagedKVCache::remove_sequence(int64_t seq_id) {
  Impl& m = *impl_;
  (void)m.seq(seq_id);
  Impl::Seq& s = m.seqs.at(seq_id);
  // The freed pages back to 0xFF, one fill per run of consecutive page numbers (a sequence's pages mostly are one run:
  // on a device cache each fill is a memset call, so a 32k-token sequence is a few calls instead of 2 per page).
  std::vector<int32_t> sorted = s.pages;
  std::sort(sorted.begin(), sorted.end());
  for (size_t a = 0; a < sorted.size();) {
    size_t b = a + 1;
    while (b < sorted.size() && sorted[b] == sorted[b - 1] + 1) ++b;
    const int64_t first = sorted[a], count = static_cast<int64_t>(b - a);
    m.codes.fill(first * m.geom.page_code_bytes(), count * m.geom.page_code_bytes(), 0xFF);
    m.meta.fill(first * m.geom.page_meta_bytes(), count * m.geom.page_meta_bytes(), 0xFF);
    a = b;
  }
  for (auto it = s.pages.rbegin(); it != s.pages.rend(); ++it) m.free_list.push_back(*it);
  m.seqs.erase(seq_id);
}

bool PagedKVCache::has_sequence(int64_t seq_id) const { return impl_->seqs.count(seq_id) != 0; }

std::vector<int64_t> PagedKVCache::sequence_ids() const {
  std::vector<int64_t> ids;
  for (const auto& [id, s] : impl_->seqs) ids.push_back(id);
  return ids;
}

int64_t PagedKVCache::seq_len(int64_t seq_id, int32_t layer) const {
  const Impl::Seq& s = impl_->seq(seq_id);
  impl_->check_layer(layer);
  return s.n[static_cast<size_t>(layer)];
}

namespace {
float load_elem(const TensorView& t, int64_t i, int64_t h, int64_t c) {
  const int64_t off = i * t.strides[0] + h * t.strides[1] + c * t.strides[2];
  switch (t.dtype) {
    case DType::float32: return static_cast<const float*>(t.data)[off];
    case DType::float16: return fp16_to_float(static_cast<const uint16_t*>(t.data)[off]);
    default: return bf16_to_float(static_cast<const uint16_t*>(t.data)[off]);
  }
}
/// Formats that store fp16 (codes or scale / min metadata) need |x| <= 65504 (format/traits.hpp).
bool needs_fp16_range(const kv::KVHalfFormat& f) {
  return f.code == kv::KVCode::f16 || f.scaling == kv::KVScaling::token_affine ||
         f.scaling == kv::KVScaling::channel_affine;
}
}  // namespace

void PagedKVCache::append(int64_t seq_id, int32_t layer, const TensorView& k, const TensorView& v) {
  Impl& m = *impl_;
  const KVCacheConfig& c = m.cfg;
  (void)m.seq(seq_id);
  m.check_layer(layer);
  const int64_t H = c.num_heads_kv, d = c.head_dim, P = c.page_size, S = c.sink_tokens;
  kv::check_append_rows(m, k, v, 3);
  const int64_t N = k.shape[0];
  if (N == 0) return;
  if (k.device != Device::cpu) {
    kv::DeviceRows rows;
    rows.k = k.data, rows.v = v.data, rows.dtype = k.dtype, rows.device_index = k.device_index;
    rows.k_strides[1] = k.strides[0], rows.k_strides[2] = k.strides[1];
    rows.v_strides[1] = v.strides[0], rows.v_strides[2] = v.strides[1];
    kv::append_device_rows(m, {&seq_id, 1}, layer, N, rows);
    return;
  }

  // 1. Stage: float, rotated (quantized halves), bf16-rounded when the config has a 16-bit window. Validate values.
  std::vector<float> staged(static_cast<size_t>(2 * N * H * d));
  for (int half = 0; half < 2; ++half) {
    const TensorView& t = half == 0 ? k : v;
    const bool rot = half == 0 ? m.rot_k : m.rot_v;
    const bool limit = needs_fp16_range(m.codec(half).format()) || m.round_bf16;
    const float lim = needs_fp16_range(m.codec(half).format()) ? 65504.0f : 3.0e38f;
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t h = 0; h < H; ++h) {
        float* row = staged.data() + ((half * N + i) * H + h) * d;
        for (int64_t e = 0; e < d; ++e) {
          const float x = load_elem(t, i, h, e);
          if (!std::isfinite(x) || (limit && std::fabs(x) > lim)) {
            throw Error(half == 0 ? "k" : "v",
                        "finite values" + std::string(lim < 1e6f ? " with |x| <= 65504 (fp16 range of this format)" : ""),
                        std::to_string(x) + " at [" + std::to_string(i) + ", " + std::to_string(h) + ", " +
                            std::to_string(e) + "]");
          }
          row[e] = x;
        }
        if (rot) hadamard_rotate(row, static_cast<int32_t>(d), m.rot_signs.data(), false);
        if (m.round_bf16) {
          for (int64_t e = 0; e < d; ++e) row[e] = bf16_to_float(float_to_bf16(row[e]));
        }
      }
    }
  }

  // 2. Capacity: pages this append needs (checked, and a growing pool grown, before anything is modified).
  Impl::Seq& s = m.seqs.at(seq_id);
  const int64_t n0 = s.n[static_cast<size_t>(layer)], n1 = n0 + N;
  const int64_t q0 = s.nq[static_cast<size_t>(layer)], q1 = m.quant_count(n1);
  const int64_t need = (q1 + P - 1) / P;
  const int64_t extra = need - static_cast<int64_t>(s.pages.size());
  m.reserve_pages(extra, "appending " + std::to_string(N) + " tokens to sequence " + std::to_string(seq_id) +
                             " layer " + std::to_string(layer));
  for (int64_t e = 0; e < extra; ++e) m.take_page(s);

  // 3. Quantize stream slots [q0, q1) (positions S + q0 ..): old tokens come from the ring, new ones from `staged`.
  //    A device cache encodes into a host copy of the page-head and uploads exactly the rows and metadata written.
  const int64_t nquant = q1 - q0;
  if (nquant > 0) {
    std::vector<float> rows(static_cast<size_t>(nquant * d));
    std::vector<uint16_t> ring_row(static_cast<size_t>(d));
    for (int half = 0; half < 2; ++half) {
      const kv::KVCodec& codec = m.codec(half);
      const kv::KVHalfFormat& f = codec.format();
      std::vector<uint8_t> ph_codes, ph_meta;
      if (!m.on_host()) {
        ph_codes.resize(static_cast<size_t>(f.code_bytes) * static_cast<size_t>(P));
        ph_meta.resize(static_cast<size_t>(std::max<int64_t>(f.meta_bytes_per_page_head(static_cast<int32_t>(P)), 1)));
      }
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t j = 0; j < nquant; ++j) {
          const int64_t p = S + q0 + j;
          float* dst = rows.data() + j * d;
          if (p < n0) {
            const int64_t off = m.wgeom.offset(layer, half, static_cast<int32_t>(h), m.win_slot(p)) * 2;
            s.win.read(off, ring_row.data(), d * 2);
            for (int64_t e = 0; e < d; ++e) dst[e] = bf16_to_float(ring_row[static_cast<size_t>(e)]);
          } else {
            std::memcpy(dst, staged.data() + ((half * N + (p - n0)) * H + h) * d, static_cast<size_t>(d) * 4);
          }
        }
        int64_t j = 0;  // encode page by page
        while (j < nquant) {
          const int64_t slot_stream = q0 + j;
          const int32_t slot = static_cast<int32_t>(slot_stream % P);
          const int32_t cnt = static_cast<int32_t>(std::min(nquant - j, P - slot));
          const int32_t page = s.pages[static_cast<size_t>(slot_stream / P)];
          if (m.on_host()) {
            codec.encode(static_cast<int32_t>(h), rows.data() + j * d, cnt, m.code_ptr(page, layer, half, static_cast<int32_t>(h)),
                         m.meta_ptr(page, layer, half, static_cast<int32_t>(h)), slot);
          } else {
            codec.encode(static_cast<int32_t>(h), rows.data() + j * d, cnt, ph_codes.data(), ph_meta.data(), slot);
            const int64_t co = m.geom.code_offset(page, layer, half, static_cast<int32_t>(h), slot);
            m.codes.write(co, ph_codes.data() + static_cast<int64_t>(slot) * f.code_bytes,
                          static_cast<int64_t>(cnt) * f.code_bytes);
            const int64_t m0 = f.meta_offset(slot), m1 = f.meta_offset(slot + cnt - 1) + f.meta_bytes_per_unit;
            if (m1 > m0) {
              m.meta.write(m.geom.meta_offset(page, layer, half, static_cast<int32_t>(h)) + m0, ph_meta.data() + m0, m1 - m0);
            }
          }
          j += cnt;
        }
      }
    }
  }

  // 4. Window: new tokens that are sinks or stay in the residual ring.
  std::vector<uint16_t> row16(static_cast<size_t>(d));
  for (int64_t p = n0; p < n1; ++p) {
    if (p >= S && p < S + q1) continue;  // quantized
    for (int half = 0; half < 2; ++half) {
      for (int64_t h = 0; h < H; ++h) {
        const float* src = staged.data() + ((half * N + (p - n0)) * H + h) * d;
        for (int64_t e = 0; e < d; ++e) row16[static_cast<size_t>(e)] = float_to_bf16(src[e]);
        s.win.write(m.wgeom.offset(layer, half, static_cast<int32_t>(h), m.win_slot(p)) * 2, row16.data(), d * 2);
      }
    }
  }
  s.n[static_cast<size_t>(layer)] = n1;
  s.nq[static_cast<size_t>(layer)] = q1;
}

void PagedKVCache::dequantize(int64_t seq_id, int32_t layer, const TensorView& k_out, const TensorView& v_out) const {
  if (!impl_->on_host()) {  // read back: a host copy of the cache decodes the same bytes
    to(Device::cpu).dequantize(seq_id, layer, k_out, v_out);
    return;
  }
  const Impl& m = *impl_;
  const Impl::Seq& s = m.seq(seq_id);
  m.check_layer(layer);
  const int64_t n = s.n[static_cast<size_t>(layer)], H = m.cfg.num_heads_kv, d = m.cfg.head_dim;
  for (int half = 0; half < 2; ++half) {
    const TensorView& t = half == 0 ? k_out : v_out;
    const char* name = half == 0 ? "k_out" : "v_out";
    core::check_rank_and_layout(t, name, 3, "[seq_len, num_heads_kv, head_dim]");
    core::check_dtype(t, name, DType::float32);
    if (t.device != Device::cpu) throw TypeError(std::string(name) + ".device", "cpu", device_name(t.device));
    core::check_dim(t, name, 0, n, "seq_len");
    core::check_dim(t, name, 1, H, "num_heads_kv");
    core::check_dim(t, name, 2, d, "head_dim");
    core::check_data(t, name);
  }
  std::vector<float> tile(static_cast<size_t>(m.cfg.page_size + std::max<int64_t>(m.win_tokens(), 1)) *
                          static_cast<size_t>(d));
  for (int half = 0; half < 2; ++half) {
    const TensorView& t = half == 0 ? k_out : v_out;
    const bool rot = half == 0 ? m.rot_k : m.rot_v;
    for (int64_t h = 0; h < H; ++h) {
      m.for_each_tile(s, layer, 0, n, m.cfg.page_size, [&](int64_t t0, int64_t t1) {
        m.decode_range(s, layer, half, static_cast<int32_t>(h), t0, t1, tile.data());
        for (int64_t p = t0; p < t1; ++p) {
          float* row = tile.data() + (p - t0) * d;
          if (rot) hadamard_rotate(row, static_cast<int32_t>(d), m.rot_signs.data(), true);
          float* dst = static_cast<float*>(t.data) + p * t.strides[0] + h * t.strides[1];
          for (int64_t e = 0; e < d; ++e) dst[e * t.strides[2]] = row[e];
        }
      });
    }
  }
}

KVMemoryReport PagedKVCache::memory_report() const {
  const Impl& m = *impl_;
  const KVCacheConfig& c = m.cfg;
  KVMemoryReport r;
  r.page_bytes = m.page_bytes();
  r.pages_total = m.num_pages;
  r.pages_free = static_cast<int64_t>(m.free_list.size());
  r.pages_used = r.pages_total - r.pages_free;
  r.pool_bytes = r.pages_total * r.page_bytes;
  r.num_sequences = static_cast<int64_t>(m.seqs.size());
  const int64_t H = c.num_heads_kv;
  for (const auto& [id, s] : m.seqs) {
    for (int32_t l = 0; l < c.num_layers; ++l) {
      const int64_t nq = s.nq[static_cast<size_t>(l)];
      r.token_layers += s.n[static_cast<size_t>(l)];
      r.code_bytes += nq * H * (m.kb.code_bytes_per_token_head + m.vb.code_bytes_per_token_head);
      r.metadata_bytes += H * (nq / m.kb.tokens_per_group * m.kb.meta_bytes_per_group +
                               nq / m.vb.tokens_per_group * m.vb.meta_bytes_per_group);
    }
    r.residual_bytes += m.seq_window_bytes();
  }
  r.num_tokens = r.token_layers / c.num_layers;
  r.slack_bytes = r.pages_used * r.page_bytes - r.code_bytes - r.metadata_bytes;
  r.total_bytes = r.code_bytes + r.metadata_bytes + r.residual_bytes + r.slack_bytes;
  if (r.token_layers > 0) {
    r.bits_per_element = static_cast<double>(r.total_bytes) * 8.0 /
                         (2.0 * static_cast<double>(r.token_layers) * H * c.head_dim);
    r.ratio_vs_bf16 = 16.0 / r.bits_per_element;
  }
  return r;
}

}  // namespace flashkv
