// PagedKVCache internals: the page pool (kv::Storage in host or device memory, laid out by kv::PageGeometry,
// kvcache/page_layout.hpp), the free list, the sequences (page tables, lengths, bf16 window buffers) and the codecs.
// paged_cache.cpp: state, append, dequantize, copies between devices; memory.cpp: accounting; api/decode.cpp reads
// it to build decode problems. Not a public header.
//
// Fresh and freed pages are filled with 0xFF bytes (NaN in every float format, maximal codes / NaN metadata in the
// integer formats) so that a read of an unused slot would show up as NaN in tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "flashkv/kvcache.hpp"
#include "kvcache/cache/storage.hpp"
#include "kvcache/format/codec.hpp"
#include "kvcache/page_layout.hpp"

namespace flashkv {

struct PagedKVCache::Impl {
  struct Seq {
    std::vector<int32_t> pages;  ///< page table: stream slot i lives in pages[i / page_size]
    std::vector<int64_t> n;      ///< [layer] tokens
    std::vector<int64_t> nq;     ///< [layer] quantized tokens (stream slots in use)
    kv::Storage win;             ///< bf16 window buffer (kv::WindowGeometry), on the cache's device
    uint64_t version = 0;        ///< changes whenever `pages` changes (plans check it)
  };

  KVCacheConfig cfg;
  std::unique_ptr<kv::KVCodec> kcodec, vcodec;
  KVFormatBytes kb, vb;
  kv::PageGeometry geom;
  kv::TokenRegions regions;
  kv::WindowGeometry wgeom;
  bool round_bf16 = false;
  bool rot_k = false, rot_v = false;
  std::vector<float> rot_signs;  ///< ±1 diagonal D, [head_dim]
  bool growable = false;         ///< capacity_pages == capacity_bytes == 0: the pool grows on demand

  int64_t num_pages = 0;
  kv::Storage codes, meta;
  /// A device cache's static fp8 scales per kv head ([num_heads_kv] float32) on its device, per half (head_static
  /// formats only; empty otherwise): read by the device append and decode without an upload (graph-capturable).
  kv::Storage head_scales_dev[2];
  std::vector<int32_t> free_list;  ///< stack of free page ids
  std::map<int64_t, Seq> seqs;
  uint64_t next_version = 1;

  explicit Impl(const KVCacheConfig& c);
  /// A copy of `o` with its pool and sequences on `device` (same bytes).
  Impl(const Impl& o, Device device, int32_t device_index);

  Device device() const { return cfg.device; }
  bool on_host() const { return cfg.device == Device::cpu; }
  int32_t gq() const { return regions.gq; }
  int32_t ring_cap() const { return regions.ring_cap(); }
  int64_t win_tokens() const { return regions.window_tokens(); }
  int64_t page_bytes() const { return geom.page_bytes(); }
  int64_t seq_window_bytes() const { return wgeom.elements(cfg.num_layers) * 2; }
  int64_t quant_count(int64_t n) const { return regions.quant_count(n); }
  const kv::KVCodec& codec(int half) const { return half == 0 ? *kcodec : *vcodec; }

  /// Host pointers of a host cache's pool (code row 0 / metadata of one page-head).
  uint8_t* code_ptr(int32_t page, int32_t layer, int half, int32_t head) const {
    return codes.data() + geom.code_offset(page, layer, half, head, 0);
  }
  uint8_t* meta_ptr(int32_t page, int32_t layer, int half, int32_t head) const {
    return meta.data() + geom.meta_offset(page, layer, half, head);
  }
  /// Window buffer of (layer, half, head) of a host cache: win_tokens() rows of head_dim bf16.
  const uint16_t* win_ptr(const Seq& s, int32_t layer, int half, int32_t head) const {
    return reinterpret_cast<const uint16_t*>(s.win.data()) + wgeom.offset(layer, half, head, 0);
  }
  uint16_t* win_ptr(Seq& s, int32_t layer, int half, int32_t head) const {
    return reinterpret_cast<uint16_t*>(s.win.data()) + wgeom.offset(layer, half, head, 0);
  }
  int64_t win_slot(int64_t p) const { return regions.win_slot(p); }

  const Seq& seq(int64_t seq_id, const char* arg = "seq_id") const;
  void check_layer(int32_t layer) const;
  /// Makes `extra` more pages free (grows a growable pool, else CapacityError naming `what`).
  void reserve_pages(int64_t extra, const std::string& what);
  /// Takes a page from the free list for sequence s.
  void take_page(Seq& s);
  /// Fills head_scales_dev from the codecs (device caches; construction and to()).
  void upload_head_scales();
  /// head_scales_dev[half] as a device pointer, or nullptr.
  const float* device_head_scales(int half) const {
    return head_scales_dev[half].bytes() > 0 ? reinterpret_cast<const float*>(head_scales_dev[half].data()) : nullptr;
  }

  /// Decodes positions [p0, p1) of (seq, layer, half, head) of a host cache into out [p1 − p0][head_dim] float, in the
  /// stored (rotated) basis. The range must lie inside one region: sinks, one page of the quantized stream, residual.
  void decode_range(const Seq& s, int32_t layer, int half, int32_t head, int64_t p0, int64_t p1, float* out) const;
  /// Splits [p0, p1) of (seq, layer) into region/page-aligned tiles of at most max_tile tokens (kv::TokenRegions).
  template <class F>
  void for_each_tile(const Seq& s, int32_t layer, int64_t p0, int64_t p1, int64_t max_tile, F&& fn) const {
    regions.for_each_tile(s.n[static_cast<size_t>(layer)], cfg.page_size, p0, p1, max_tile, fn);
  }
};

namespace kv {

/// Internal code's access to a PagedKVCache's state (the step API, kvcache/api/cache_step.hpp; tests).
struct CacheAccess {
  static PagedKVCache::Impl& impl(PagedKVCache& c) { return *c.impl_; }
  static const PagedKVCache::Impl& impl(const PagedKVCache& c) { return *c.impl_; }
};

/// The checks of append() (rank 3: k / v [n_tokens, Hk, d]) and of the batched append (rank 4: [batch, n_tokens, Hk,
/// d]) that do not need the values: layout, dtypes, devices, shapes (Error / TypeError naming k / v).
void check_append_rows(const PagedKVCache::Impl& m, const TensorView& k, const TensorView& v, int rank);

/// CUDA rows of a device append: k / v [batch, n_tokens, num_heads_kv, head_dim] with element strides (batch, row,
/// head; the last dimension contiguous), of `dtype` on device `device_index`.
struct DeviceRows {
  const void* k = nullptr;
  const void* v = nullptr;
  DType dtype = DType::bfloat16;
  int32_t device_index = 0;
  int64_t k_strides[3] = {0, 0, 0}, v_strides[3] = {0, 0, 0};
};

/// Appends `n_tokens` rows to each sequence seq_ids[b] (registered, distinct) in `layer` of a device cache without
/// windows, KIVI keys or rotation: pages taken for all of them first (CapacityError, nothing changed), one upload of
/// the page table and lengths, the values checked on the device (Error naming k / v and the element, nothing written
/// and the pages given back), then one launch writes every row (copied for a 16-bit cache fed its dtype, quantized on
/// the device otherwise). Synchronous. UnsupportedError / TypeError naming what the device append cannot take.
void append_device_rows(PagedKVCache::Impl& m, std::span<const int64_t> seq_ids, int32_t layer, int64_t n_tokens,
                        const DeviceRows& rows);

}  // namespace kv

/// In-place randomized Walsh–Hadamard rotation x ← H·D·x / sqrt(n) (forward) or its inverse D·H·x / sqrt(n);
/// n a power of two, signs the ±1 diagonal D.
void hadamard_rotate(float* x, int32_t n, const float* signs, bool inverse);
/// ±1 signs from a seed (splitmix64), deterministic across platforms.
std::vector<float> hadamard_signs(int32_t n, uint64_t seed);

}  // namespace flashkv
