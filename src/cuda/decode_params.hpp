// Kernel parameters of the CUDA split-KV decode (src/cuda/sm80/decode_kernel.cuh), filled by the decode plan
// (src/cuda/decode_cuda.cpp) from a validated core::DecodeProblem. The K / V pages are addressed exactly as
// kvcache/page_layout.hpp's kv::HalfPages (one PagedKVCache layer, or a [num_pages, page_size, num_heads_kv, head_dim]
// tensor pair), in ELEMENTS: row (page, head, slot) = k_cache + page·k_page + head·k_head + slot·k_row. Quantized
// pages (the decode_quant instantiations, sm80/decode_kv_source.cuh) are addressed in BYTES (the element is the byte)
// and carry their metadata pools and kv::KVHalfFormat per half.
#pragma once

#include <cstdint>

#include "kvcache/format/traits.hpp"

namespace flashkv::cuda {

struct TensorStrides;

/// Metadata bytes per token the quantized decode stages for scaling `s` at head dim `d` (token_affine: channel groups
/// of >= 32 channels, the smallest the kv_cache_dtype grammar offers: sized so that int8 at head_dim 128 fits 3 CTAs
/// per SM); a format needing more is rejected by the plan.
FLASHKV_HD constexpr int quant_meta_max(kv::KVScaling s, int64_t d) {
  return s == kv::KVScaling::token_f32 ? 4
                                       : (s == kv::KVScaling::token_affine ? static_cast<int>((d >= 32 ? d / 32 : 1) * 4) : 0);
}

/// True when the fused split-KV combine of num_splits partials (common/decode_combine.cuh, combine_tile: 16 weights
/// per split + 32 floats) fits in the warp-merge scratch of the decode kernel of head dim kHeadDim (4 warps x 16 rows x
/// (kHeadDim + 2) floats, DecodeConfig::kCombineBytes); the combine kernel merges the others.
FLASHKV_HD constexpr bool fused_combine_fits(int64_t num_splits, int64_t kHeadDim) {
  return (num_splits * 16 + 32) <= 4 * 16 * (kHeadDim + 2);
}

struct DecodeParams {
  const void* q = nullptr;  ///< [batch, seqlen_q, num_heads, head_dim], or varlen [total_q, num_heads, head_dim]
  void* out = nullptr;      ///< like q
  float* lse = nullptr;     ///< optional; fixed [batch, num_heads, seqlen_q], varlen [num_heads, total_q]
  int64_t q_batch = 0, q_row = 0, q_head = 0;
  int64_t out_batch = 0, out_row = 0, out_head = 0;
  int64_t lse_batch = 0, lse_head = 0, lse_row = 0;
  const int32_t* cu_seqlens_q = nullptr;  ///< varlen: [batch + 1] (nullptr: seqlen_q queries per sequence)

  const void* k_cache = nullptr;  ///< pages of the layer (see the file comment)
  const void* v_cache = nullptr;
  int64_t k_page = 0, k_row = 0, k_head = 0;
  int64_t v_page = 0, v_row = 0, v_head = 0;
  const int32_t* page_table = nullptr;  ///< [batch, max_pages]; nullptr: contiguous caches, page id = batch index
  int64_t page_table_batch = 0;
  int32_t page_size_log2 = 0;

  /// Keys of sequence b = seqlens[b] + seqlen_add. A sequence with seqlens[b] < 0, > promised_max (when > 0), or
  /// seqlens[b] + seqlen_add > capacity breaks the host's precondition: its out / lse are NaN and nothing is appended
  /// (never a clamp).
  const int32_t* seqlens = nullptr;
  int32_t seqlen_add = 0;
  int32_t promised_max = 0;
  int64_t capacity = 0;

  int32_t batch = 0, seqlen_q = 0, num_heads = 0, num_heads_kv = 0, head_dim = 0;
  int32_t num_splits = 1;
  int32_t rows_per_kv_head = 0;  ///< max seqlen_q · (num_heads / num_heads_kv): rows packed per kv head (PackGQA)
  bool causal = false;           ///< bottom-right aligned over each sequence's queries
  int32_t window_left = -1;      ///< −1 = unbounded
  /// s = qk·score_scale, then (softcap) s = tanh(s); the softmax uses exp2(s·softmax_scale_log2 − m).
  float score_scale = 1.f, softmax_scale_log2 = 1.f;
  bool softcap = false;
  /// Quantized pages only: page-head metadata of row (page, head, ·) = k_meta + page·k_meta_page + head·k_meta_head
  /// (bytes), the format of each half (the kernel's compile-time KVCode / KVScaling, runtime group geometry) and, for
  /// head_static fp8, the per-kv-head scales [num_heads_kv] on the device.
  const uint8_t* k_meta = nullptr;
  const uint8_t* v_meta = nullptr;
  int64_t k_meta_page = 0, k_meta_head = 0, v_meta_page = 0, v_meta_head = 0;
  kv::KVHalfFormat k_format, v_format;
  const float* k_head_scales = nullptr;
  const float* v_head_scales = nullptr;
  /// Quantized pages in pages of >= 64 slots: while a CTA's cp.async ring loads block nb + stages − 1, it prefetches
  /// block nb + stages − 1 + l2_prefetch_blocks into L2 (prefetch.global.L2 of its code and metadata lines; a hint:
  /// no data moves to the SM, nothing past the sequence's end is touched). 0: off; the plan sets 2, or
  /// FLASHKV_DECODE_L2_PREFETCH=N (decode_l2_prefetch_blocks).
  int32_t l2_prefetch_blocks = 0;
  /// Register-direct packed pages, CTAs of <= 8 query rows: the keys-as-M loop (sm80/decode_keys_m.cuh); false: the
  /// 16-row loop (FLASHKV_DECODE_KEYS_M=0, decode_keys_m()).
  bool keys_m = true;
  float* o_accum = nullptr;    ///< [num_splits, batch, num_heads, seqlen_q, head_dim] float32 (num_splits > 1)
  float* lse_accum = nullptr;  ///< [num_splits, batch, num_heads, seqlen_q] float32, natural log
  /// num_splits > 1, combine fused into the split kernel (DecodeCombine::fused): [batch, num_heads_kv · row tiles]
  /// arrival counts, zero before a launch and left zero by it (the last CTA of each tile resets its count). The last
  /// split CTA of a tile to arrive merges the tile's num_splits partials (decode_kernel.cuh, combine_tile); nullptr:
  /// the separate combine kernel merges them.
  int32_t* split_counters = nullptr;
  /// Set by the launcher (sm80/decode_launch.cuh): the separate combine kernel (split_counters == nullptr, num_splits
  /// > 1) is launched with programmatic dependent launch (the split kernel triggers it at its start; the combine waits
  /// for the split kernel's completion with griddepcontrol.wait), where the device and stream allow it.
  bool combine_pdl = false;
  /// Plan-time query: when set, the launcher writes the instantiation's resident CTAs per SM on the current device
  /// (cudaOccupancyMaxActiveBlocksPerMultiprocessor at its shared memory) here and launches nothing.
  int32_t* query_ctas_per_sm = nullptr;
};

}  // namespace flashkv::cuda
