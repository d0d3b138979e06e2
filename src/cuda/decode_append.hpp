// Appending new K / V rows into 16-bit KV pages on the device (the tensor API's k_new / v_new, a device
// PagedKVCache's append): row i of sequence b goes to position seqlens[b] + i through the page table, in the one page
// layout (kvcache/page_layout.hpp; element strides as DecodeParams).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace flashkv::cuda {

struct AppendParams {
  const uint16_t* k_new = nullptr;  ///< [batch, seqlen_new, num_heads_kv, head_dim] (strides below, elements)
  const uint16_t* v_new = nullptr;
  int64_t kn_batch = 0, kn_row = 0, kn_head = 0, vn_batch = 0, vn_row = 0, vn_head = 0;
  uint16_t* k_cache = nullptr;
  uint16_t* v_cache = nullptr;
  int64_t k_page = 0, k_row = 0, k_head = 0, v_page = 0, v_row = 0, v_head = 0;
  const int32_t* page_table = nullptr;  ///< nullptr: contiguous cache, k_page/v_page are batch strides
  int64_t page_table_batch = 0;
  int32_t page_size_log2 = 0;
  const int32_t* seqlens = nullptr;     ///< [batch] tokens already cached
  int32_t batch = 0, seqlen_new = 0, num_heads_kv = 0, head_dim = 0;
  int64_t capacity = 0;      ///< tokens per sequence the table addresses
  int32_t promised_max = 0;  ///< > 0: sequences with seqlens[b] > promised_max are skipped (their decode gives NaN)
};

/// Writes k_new / v_new at positions seqlens[b] + i; a sequence whose length breaks the precondition (negative,
/// above the promise, or past the capacity with the new rows) is skipped as a whole — never clamped.
void append_kv(const AppendParams& p, cudaStream_t stream);

}  // namespace flashkv::cuda
