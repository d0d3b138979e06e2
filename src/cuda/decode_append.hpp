// Appending new K/V tokens into a paged (or contiguous) 16-bit cache, and the effective sequence lengths.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace flashkv::cuda {

struct AppendParams {
  const uint16_t* k_new = nullptr;  ///< [batch, seqlen_new, num_heads_kv, head_dim] (strides below)
  const uint16_t* v_new = nullptr;
  int64_t kn_batch = 0, kn_row = 0, kn_head = 0, vn_batch = 0, vn_row = 0, vn_head = 0;
  uint16_t* k_cache = nullptr;
  uint16_t* v_cache = nullptr;
  int64_t k_page = 0, k_row = 0, k_head = 0, v_page = 0, v_row = 0, v_head = 0;
  const int32_t* page_table = nullptr;  ///< nullptr: contiguous cache, k_page/v_page are batch strides
  int64_t page_table_batch = 0;
  int32_t page_size_log2 = 0;
  const int32_t* cache_seqlens = nullptr;
  int32_t batch = 0, seqlen_new = 0, num_heads_kv = 0, head_dim = 0;
  int64_t capacity = 0;  ///< tokens per sequence the table can address; writes beyond are dropped
};

/// Writes k_new/v_new at positions cache_seqlens[b] + i.
void append_kv(const AppendParams& p, cudaStream_t stream);
/// seqlens_k[b] = min(cache_seqlens[b] + add, capacity).
void effective_seqlens(const int32_t* cache_seqlens, int32_t add, int64_t capacity, int32_t* seqlens_k, int batch,
                       cudaStream_t stream);

}  // namespace flashkv::cuda
