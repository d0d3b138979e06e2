// The ONE page layout of the KV cache, for the host and the device (g++ C++20 and nvcc C++17; header-only, no flashkv
// types). PagedKVCache writes its pages with it (host or device memory, same bytes), the CPU attention and the CUDA
// decode read them with it.
//
// PAGE POOL (PageGeometry): page p holds page_size token slots of EVERY layer, K and V, codes and metadata:
//   codes pool  [page][layer][half: K then V][kv-head][slot][code_bytes[half]]        (PageGeometry::code_offset)
//   meta pool   [page][layer][half: K then V][kv-head][meta_bytes_per_page_head[half]] (PageGeometry::meta_offset)
//   so one (page, layer, half, head) block — a "page-head" — is page_size contiguous rows of codes plus its metadata
//   (format/traits.hpp says what a row and the metadata hold). A sequence's page table lists its pages in order:
//   stream slot i of a sequence lives in page page_table[i / page_size], slot i % page_size.
// STRIDED VIEW (HalfPages): the kernels address one half of one layer as base + page·page_stride + head·head_stride +
//   slot·slot_stride (bytes), which is the pool above (HalfPages::of_pool) and also any vLLM / flash-attn style
//   [num_pages, page_size, num_heads_kv, head_dim] 16-bit tensor pair (slot_stride = num_heads_kv·head_dim·2): a bf16
//   or fp16 cache is the 16-bit instance of the layout, with no metadata.
// TOKEN REGIONS (TokenRegions): position p of a sequence with n tokens is
//   a sink        p < S                                        (bf16, window buffer slot p)
//   quantized     S <= p < S + n_q, n_q = quant_count(n)       (pages, stream slot p − S)
//   residual      S + n_q <= p < n                              (bf16, window buffer ring slot win_slot(p))
//   with S = sink_tokens, n_q = round_down(max(0, n − S − residual_tokens), gq) (gq = G when a half is KIVI, else 1),
//   ring capacity = residual_tokens + gq − 1. Without windows (S = R = 0, gq = 1) every token is in the pages.
// WINDOW BUFFER (WindowGeometry): per sequence, bf16 [layer][half][kv-head][S + ring_cap][head_dim].
#pragma once

#include <cstdint>

#include "core/host_device.hpp"

namespace flashkv::kv {

struct PageGeometry {
  int32_t num_layers = 1;
  int32_t num_heads_kv = 1;
  int32_t page_size = 16;
  int32_t code_bytes[2] = {0, 0};               ///< bytes of one token-head row of codes, K and V
  int64_t meta_bytes_per_page_head[2] = {0, 0};  ///< metadata bytes of one page-head, K and V

  FLASHKV_HD int64_t layer_code_bytes() const {
    return static_cast<int64_t>(num_heads_kv) * page_size * (code_bytes[0] + code_bytes[1]);
  }
  FLASHKV_HD int64_t layer_meta_bytes() const {
    return static_cast<int64_t>(num_heads_kv) * (meta_bytes_per_page_head[0] + meta_bytes_per_page_head[1]);
  }
  FLASHKV_HD int64_t page_code_bytes() const { return num_layers * layer_code_bytes(); }
  FLASHKV_HD int64_t page_meta_bytes() const { return num_layers * layer_meta_bytes(); }
  FLASHKV_HD int64_t page_bytes() const { return page_code_bytes() + page_meta_bytes(); }

  /// Byte offset of the first code row of (layer, half) in a page, from the page's start in the codes pool.
  FLASHKV_HD int64_t half_code_offset(int32_t layer, int half) const {
    return layer * layer_code_bytes() +
           (half == 0 ? 0 : static_cast<int64_t>(num_heads_kv) * page_size * code_bytes[0]);
  }
  FLASHKV_HD int64_t half_meta_offset(int32_t layer, int half) const {
    return layer * layer_meta_bytes() + (half == 0 ? 0 : static_cast<int64_t>(num_heads_kv) * meta_bytes_per_page_head[0]);
  }
  /// Byte offset of the code row (page, layer, half, head, slot) from the codes pool's base.
  FLASHKV_HD int64_t code_offset(int64_t page, int32_t layer, int half, int32_t head, int32_t slot) const {
    return page * page_code_bytes() + half_code_offset(layer, half) +
           (static_cast<int64_t>(head) * page_size + slot) * code_bytes[half];
  }
  /// Byte offset of the metadata of page-head (page, layer, half, head) from the meta pool's base.
  FLASHKV_HD int64_t meta_offset(int64_t page, int32_t layer, int half, int32_t head) const {
    return page * page_meta_bytes() + half_meta_offset(layer, half) + head * meta_bytes_per_page_head[half];
  }
};

/// One half (K or V) of one layer as byte strides. Row (page, head, slot) = codes + page·page_stride + head·head_stride
/// + slot·slot_stride; its page-head metadata = meta + page·meta_page_stride + head·meta_head_stride.
struct HalfPages {
  const uint8_t* codes = nullptr;
  const uint8_t* meta = nullptr;
  int64_t page_stride = 0, head_stride = 0, slot_stride = 0;
  int64_t meta_page_stride = 0, meta_head_stride = 0;

  FLASHKV_HD const uint8_t* row(int64_t page, int32_t head, int32_t slot) const {
    return codes + page * page_stride + head * head_stride + slot * slot_stride;
  }
  /// The page-head's first row (slot 0).
  FLASHKV_HD const uint8_t* page_head(int64_t page, int32_t head) const {
    return codes + page * page_stride + head * head_stride;
  }
  FLASHKV_HD const uint8_t* page_head_meta(int64_t page, int32_t head) const {
    return meta + page * meta_page_stride + head * meta_head_stride;
  }
  /// Rows of one page-head are contiguous (the pool; slot_stride == code_bytes).
  FLASHKV_HD bool rows_contiguous(int32_t code_bytes) const { return slot_stride == code_bytes; }

  /// (layer, half) of a PagedKVCache pool with bases `codes_pool` / `meta_pool`.
  FLASHKV_HD static HalfPages of_pool(const PageGeometry& g, const uint8_t* codes_pool, const uint8_t* meta_pool,
                                      int32_t layer, int half) {
    HalfPages h;
    h.codes = codes_pool + g.half_code_offset(layer, half);
    h.meta = meta_pool != nullptr ? meta_pool + g.half_meta_offset(layer, half) : nullptr;
    h.page_stride = g.page_code_bytes();
    h.head_stride = static_cast<int64_t>(g.page_size) * g.code_bytes[half];
    h.slot_stride = g.code_bytes[half];
    h.meta_page_stride = g.page_meta_bytes();
    h.meta_head_stride = g.meta_bytes_per_page_head[half];
    return h;
  }
};

struct TokenRegions {
  int32_t sink_tokens = 0;      ///< S
  int32_t residual_tokens = 0;  ///< R
  int32_t gq = 1;               ///< tokens quantized together (G if a half is KIVI, else 1)

  FLASHKV_HD int32_t ring_cap() const { return residual_tokens + gq - 1; }
  FLASHKV_HD int64_t window_tokens() const { return static_cast<int64_t>(sink_tokens) + ring_cap(); }
  FLASHKV_HD bool has_window() const { return window_tokens() > 0; }
  /// Quantized (paged) tokens of a sequence of n tokens.
  FLASHKV_HD int64_t quant_count(int64_t n) const {
    const int64_t q = n - sink_tokens - residual_tokens;
    return q <= 0 ? 0 : q / gq * gq;
  }
  /// Window-buffer slot of a sink or residual position p.
  FLASHKV_HD int64_t win_slot(int64_t p) const {
    return p < sink_tokens ? p : sink_tokens + (p - sink_tokens) % ring_cap();
  }
  /// Splits key positions [p0, p1) of a sequence of n tokens into tiles that stay inside one region — the sinks, one
  /// page of the quantized stream (page_size 0: no page boundaries, a contiguous cache), a contiguous run of the
  /// residual ring — and hold at most max_tile tokens; calls fn(t0, t1) for each in order. Host code.
  template <class F>
  void for_each_tile(int64_t n, int64_t page_size, int64_t p0, int64_t p1, int64_t max_tile, F&& fn) const {
    const int64_t S = sink_tokens, nq = quant_count(n), ring = ring_cap();
    int64_t p = p0;
    while (p < p1) {
      int64_t end;
      if (p < S) {
        end = S;
      } else if (p < S + nq) {
        end = page_size > 0 ? S + ((p - S) / page_size + 1) * page_size : S + nq;
        if (end > S + nq) end = S + nq;
      } else {
        end = p + (ring - (p - S) % ring);  // ring slots are contiguous until the ring wraps
      }
      if (end > p1) end = p1;
      if (end > p + max_tile) end = p + max_tile;
      fn(p, end);
      p = end;
    }
  }
  /// Pages a sequence of n tokens holds.
  FLASHKV_HD int64_t pages_for(int64_t n, int32_t page_size) const {
    return (quant_count(n) + page_size - 1) / page_size;
  }
};

struct WindowGeometry {
  int32_t num_heads_kv = 1;
  int32_t head_dim = 0;
  int64_t window_tokens = 0;  ///< S + ring capacity
  /// Element (bf16) offset of row `slot` of (layer, half, head) in a sequence's window buffer.
  FLASHKV_HD int64_t offset(int32_t layer, int half, int32_t head, int64_t slot) const {
    return ((static_cast<int64_t>(layer) * 2 + half) * num_heads_kv + head) * window_tokens * head_dim +
           slot * head_dim;
  }
  FLASHKV_HD int64_t elements(int32_t num_layers) const {
    return static_cast<int64_t>(num_layers) * 2 * num_heads_kv * window_tokens * head_dim;
  }
};

}  // namespace flashkv::kv
