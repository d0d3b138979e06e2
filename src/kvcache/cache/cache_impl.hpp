// PagedKVCache internals shared by paged_cache.cpp (state, append, dequantize, accounting) and cache_attention.cpp
// (attention over packed pages). Not a public header.
//
// STORAGE
//   codes pool: [page][layer][K: head][slot][code_bytes_k] then [V: head][slot][code_bytes_v]
//   meta pool (parallel per-page array): [page][layer][K: head][meta_bytes_per_page_head_k] then V likewise
//   per-sequence window buffer (bf16): [layer][K|V][head][sink_tokens + ring_cap][head_dim]; position p < S sits in
//   slot p, a residual position p in slot S + (p − S) mod ring_cap.
// Fresh and freed pages are filled with 0xFF bytes (NaN in every float format, maximal codes / NaN metadata in the
// integer formats) so that a read of an unused slot would show up as NaN in tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "flashkv/kvcache.hpp"
#include "kvcache/format/codec.hpp"

namespace flashkv {

struct PagedKVCache::Impl {
  struct Seq {
    std::vector<int32_t> pages;  ///< page table: stream slot i lives in pages[i / page_size]
    std::vector<int64_t> n;      ///< [layer] tokens
    std::vector<int64_t> nq;     ///< [layer] quantized tokens (stream slots in use)
    std::vector<uint16_t> win;   ///< bf16 window buffer (layout above)
  };

  KVCacheConfig cfg;
  std::unique_ptr<kv::KVCodec> kcodec, vcodec;
  KVFormatBytes kb, vb;
  int32_t gq = 1;        ///< tokens quantized together (G if a half is KIVI, else 1)
  int32_t ring_cap = 0;  ///< residual ring capacity = residual_tokens + gq − 1
  bool round_bf16 = false;
  bool rot_k = false, rot_v = false;
  std::vector<float> rot_signs;  ///< ±1 diagonal D, [head_dim]

  int64_t num_pages = 0;
  int64_t layer_code_bytes = 0, layer_meta_bytes = 0;  ///< per page and layer
  std::unique_ptr<uint8_t[]> codes, meta;
  std::vector<int32_t> free_list;  ///< stack of free page ids
  std::map<int64_t, Seq> seqs;

  explicit Impl(const KVCacheConfig& c);

  int64_t win_tokens() const { return cfg.sink_tokens + ring_cap; }
  int64_t page_bytes() const { return cfg.num_layers * (layer_code_bytes + layer_meta_bytes); }
  int64_t seq_window_bytes() const {
    return static_cast<int64_t>(cfg.num_layers) * 2 * cfg.num_heads_kv * win_tokens() * cfg.head_dim * 2;
  }
  /// Quantized stream length for n tokens.
  int64_t quant_count(int64_t n) const {
    const int64_t q = n - cfg.sink_tokens - cfg.residual_tokens;
    return q <= 0 ? 0 : q / gq * gq;
  }

  uint8_t* code_ptr(int32_t page, int32_t layer, int half, int32_t head) const {
    const int64_t P = cfg.page_size;
    uint8_t* base = codes.get() + (static_cast<int64_t>(page) * cfg.num_layers + layer) * layer_code_bytes;
    if (half == 0) return base + static_cast<int64_t>(head) * P * kb.code_bytes_per_token_head;
    return base + cfg.num_heads_kv * P * kb.code_bytes_per_token_head +
           static_cast<int64_t>(head) * P * vb.code_bytes_per_token_head;
  }
  uint8_t* meta_ptr(int32_t page, int32_t layer, int half, int32_t head) const {
    uint8_t* base = meta.get() + (static_cast<int64_t>(page) * cfg.num_layers + layer) * layer_meta_bytes;
    if (half == 0) return base + static_cast<int64_t>(head) * kb.meta_bytes_per_page_head;
    return base + cfg.num_heads_kv * kb.meta_bytes_per_page_head + static_cast<int64_t>(head) * vb.meta_bytes_per_page_head;
  }
  /// Window buffer of (layer, half, head): win_tokens() rows of head_dim bf16.
  const uint16_t* win_ptr(const Seq& s, int32_t layer, int half, int32_t head) const {
    return s.win.data() + ((static_cast<int64_t>(layer) * 2 + half) * cfg.num_heads_kv + head) * win_tokens() * cfg.head_dim;
  }
  uint16_t* win_ptr(Seq& s, int32_t layer, int half, int32_t head) const {
    return s.win.data() + ((static_cast<int64_t>(layer) * 2 + half) * cfg.num_heads_kv + head) * win_tokens() * cfg.head_dim;
  }
  /// Window slot of position p (p < S: sink slot; else ring slot).
  int64_t win_slot(int64_t p) const {
    return p < cfg.sink_tokens ? p : cfg.sink_tokens + (p - cfg.sink_tokens) % ring_cap;
  }

  const Seq& seq(int64_t seq_id, const char* arg = "seq_id") const;
  void check_layer(int32_t layer) const;

  /// Decodes positions [p0, p1) of (seq, layer, half, head) into out [p1 − p0][head_dim] float, in the stored
  /// (rotated) basis. The range must lie inside one region: sinks, one page of the quantized stream, or residual.
  void decode_range(const Seq& s, int32_t layer, int half, int32_t head, int64_t p0, int64_t p1, float* out) const;
  /// decode_range in the codec's factored form (kv::FactoredTile); window tiles come back fully decoded (group 0).
  void decode_range_factored(const Seq& s, int32_t layer, int half, int32_t head, int64_t p0, int64_t p1,
                             kv::FactoredTile& t) const;
  /// Splits [p0, p1) into region/page-aligned tiles of at most max_tile tokens and calls fn(t0, t1) for each.
  template <class F>
  void for_each_tile(const Seq& s, int32_t layer, int64_t p0, int64_t p1, int64_t max_tile, F&& fn) const {
    const int64_t S = cfg.sink_tokens;
    const int64_t nq = s.nq[static_cast<size_t>(layer)];
    int64_t p = p0;
    while (p < p1) {
      int64_t end;
      if (p < S) {
        end = S;
      } else if (p < S + nq) {
        const int64_t i = p - S;
        end = S + (i / cfg.page_size + 1) * cfg.page_size;
        if (end > S + nq) end = S + nq;
      } else {
        // residual: ring slots are contiguous until the ring wraps
        const int64_t slot = (p - S) % ring_cap;
        end = p + (ring_cap - slot);
      }
      if (end > p1) end = p1;
      if (end > p + max_tile) end = p + max_tile;
      fn(p, end);
      p = end;
    }
  }
};

/// In-place randomized Walsh–Hadamard rotation x ← H·D·x / sqrt(n) (forward) or its inverse D·H·x / sqrt(n);
/// n a power of two, signs the ±1 diagonal D.
void hadamard_rotate(float* x, int32_t n, const float* signs, bool inverse);
/// ±1 signs from a seed (splitmix64), deterministic across platforms.
std::vector<float> hadamard_signs(int32_t n, uint64_t seed);

}  // namespace flashkv
