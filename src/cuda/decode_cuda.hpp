// Split-KV paged decode on CUDA (flash-decoding; Dao et al. 2023 "Flash-Decoding", FlashAttention-3 split-KV +
// PackGQA, see src/cuda/sm80/decode_kernel.cuh), with optional append of new K/V into the pages first.
//
// SHAPES (bshd, 16-bit dtype = q.dtype for every tensor except the int32 tables):
//   q           [batch, seqlen_q, num_heads, head_dim]           the new tokens' queries (seqlen_q small, e.g. 1)
//   k_cache     paged:      [num_pages, page_size, num_heads_kv, head_dim] with page_table [batch, max_pages] int32
//   v_cache     contiguous: [batch, capacity, num_heads_kv, head_dim]     with page_table == nullptr
//   cache_seqlens [batch] int32: tokens already in the cache for each sequence (not modified)
//   k_new/v_new optional [batch, seqlen_q, num_heads_kv, head_dim]: written at positions cache_seqlens[b] + i
//               (through the page table) before attention; attention then covers cache_seqlens[b] + seqlen_q tokens
//   out         [batch, seqlen_q, num_heads, head_dim]; lse optional [batch, num_heads, seqlen_q] float32 (natural log)
// SEMANTICS: as flashkv::attention_forward over the first seqlen_k tokens of each sequence; causal is bottom-right
//   aligned (query i of the seqlen_q new tokens sees keys j <= i + seqlen_k - seqlen_q); softcap as there.
//   page_size is a power of two in [16, 256]; every page id in the first ceil(seqlen_k / page_size) page-table entries
//   must be < num_pages (precondition, not checked on the device). Tokens beyond the table's capacity are never read;
//   appends beyond it are dropped (the caller sizes the page table; cache_seqlens live on the device).
// ERRORS: flashkv::Error / TypeError naming the argument (rank, shape, dtype, device, page size, alignment);
//   UnsupportedError for float32 or a head dim that is not compiled.
#pragma once

#include <cstdint>
#include <optional>

#include "flashkv/types.hpp"

namespace flashkv::cuda {

struct DecodeOptions {
  std::optional<float> softmax_scale;  ///< default 1/sqrt(head_dim)
  bool causal = true;
  float softcap = 0.f;
  int32_t num_splits = 0;    ///< 0 = heuristic (decode_num_splits); 1 = no split (no combine kernel)
  int64_t max_seqlen_k = 0;  ///< upper bound of the sequence lengths for the heuristic (0 = table capacity)
  void* stream = nullptr;    ///< cudaStream_t
};

/// See the file comment. Asynchronous on options.stream.
void decode_attention_cuda(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                           const TensorView* page_table, const TensorView& cache_seqlens, const TensorView* k_new,
                           const TensorView* v_new, const TensorView& out, const TensorView* lse,
                           const DecodeOptions& options);

/// num_splits heuristic (FlashAttention-3 heuristics.h): 1 when the (batch x kv-head x row-tile) CTAs already fill
/// 80% of the CTA slots or there are <= 4 key blocks; else the smallest split count whose wave efficiency is within 85%
/// of the best, up to min(128, key blocks).
int32_t decode_num_splits(int64_t ctas, int64_t num_key_blocks, int64_t cta_slots);

}  // namespace flashkv::cuda
