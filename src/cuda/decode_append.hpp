// Appending new K / V rows into 16-bit KV pages on the device (the tensor API's k_new / v_new, a device
// PagedKVCache's append): row i of sequence b goes to position seqlens[b] + i through the page table, in the one page
// layout (kvcache/page_layout.hpp; element strides as DecodeParams).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "kvcache/format/traits.hpp"

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
  /// Non-null: the values are checked while they are copied: bad[0] / bad[1] (K / V, device, set to UINT64_MAX by the
  /// caller) get the smallest flat (b, i, h, c) index of a non-finite value (atomicMin); the rows are still copied.
  unsigned long long* bad = nullptr;
  uint16_t exp_mask = 0x7f80;  ///< the 16-bit type's exponent bits (bf16 0x7f80, fp16 0x7c00): all set = non-finite
};

#if defined(__CUDACC__)
/// The slot of new row i of sequence b in 16-bit pages: k / v element offsets of its (page, row) — kv heads are added
/// by the caller —, or false when the sequence is skipped (cached length negative, above the promise, or past the
/// capacity with the new rows). Shared by the append kernels of decode_append.cu and decode_append_vec.cu.
__device__ __forceinline__ bool append16_slot(const AppendParams& p, int b, int i, int64_t& kdst, int64_t& vdst) {
  const int64_t cached = p.seqlens[b];
  if (cached < 0 || (p.promised_max > 0 && cached > p.promised_max) || cached + p.seqlen_new > p.capacity) return false;
  const int64_t pos = cached + i;
  if (p.page_table != nullptr) {
    const int64_t page = p.page_table[b * p.page_table_batch + (pos >> p.page_size_log2)];
    const int64_t row = pos & ((int64_t{1} << p.page_size_log2) - 1);
    kdst = page * p.k_page + row * p.k_row;
    vdst = page * p.v_page + row * p.v_row;
  } else {
    kdst = b * p.k_page + pos * p.k_row;
    vdst = b * p.v_page + pos * p.v_row;
  }
  return true;
}
#endif

/// Writes k_new / v_new at positions seqlens[b] + i; a sequence whose length breaks the precondition (negative,
/// above the promise, or past the capacity with the new rows) is skipped as a whole — never clamped.
void append_kv(const AppendParams& p, cudaStream_t stream);

/// Quantize-on-write append into a PagedKVCache layer on the device (any token-granular format per half: fp32 / bf16
/// / fp16, fp8 static or per-token scale, int8 / int4 [/ int2] with [scale, min] per token and channel group): row i of
/// sequence b, kv head h, is encoded by kv::KVHalfFormat::encode_unit — the CPU codec's function — into stream slot
/// seqlens[b] + i of the page table (codes and metadata, page layout of kvcache/page_layout.hpp). No windows, rotation
/// or KIVI keys (tokens_per_unit > 1): the caller checks.
struct QuantAppendParams {
  const void* k_new = nullptr;  ///< [batch, seqlen_new, num_heads_kv, head_dim], element strides below
  const void* v_new = nullptr;
  int32_t dtype = 1;            ///< of k_new / v_new: 0 float32, 1 bfloat16, 2 float16
  int64_t kn_batch = 0, kn_row = 0, kn_head = 0, vn_batch = 0, vn_row = 0, vn_head = 0;
  uint8_t* codes[2] = {nullptr, nullptr};  ///< kv::HalfPages of K, V (bytes)
  uint8_t* meta[2] = {nullptr, nullptr};
  int64_t page_stride[2] = {0, 0}, head_stride[2] = {0, 0};
  int64_t meta_page_stride[2] = {0, 0}, meta_head_stride[2] = {0, 0};
  kv::KVHalfFormat format[2];
  const float* head_scales[2] = {nullptr, nullptr};  ///< device [num_heads_kv] (head_static), else nullptr
  const int32_t* page_table = nullptr;  ///< [batch, page_table_batch] on the device
  int64_t page_table_batch = 0;
  int32_t page_size = 16;
  const int32_t* seqlens = nullptr;  ///< [batch] tokens already cached, on the device
  int32_t batch = 0, seqlen_new = 0, num_heads_kv = 0, head_dim = 0;
  int64_t capacity = 0;
  /// Non-null: the values are checked while they are encoded (the same rule as the CPU cache: non-finite, or |x| >
  /// 65504 where the half stores fp16 — codes or scale / min): per half the smallest flat (b, i, h, c) index of a bad
  /// value is atomicMin'ed into bad[half] (device [2], UINT64_MAX-initialized by the caller) and that row is not
  /// written. One launch, no synchronization (also inside a CUDA graph).
  unsigned long long* bad = nullptr;
};

/// Encodes and writes the rows; asynchronous. The vector kernel (decode_append_quant_vec.cu) where the shape allows it, else
/// one warp per row (fp8, integer codes with groups of >= 16 channels) or one thread per row (everything else).
void quant_append(const QuantAppendParams& p, cudaStream_t stream);

/// The vector kernels (decode_append_vec.cu: 16-bit copy; decode_append_quant_vec.cu: quantize, 16 / 32 channels
/// per lane): false (nothing launched) where the formats, shape, strides or alignment do not allow them (the callers
/// then use the general kernels).
bool append_kv_vec(const AppendParams& p, cudaStream_t stream);
bool quant_append_vec(const QuantAppendParams& p, cudaStream_t stream);
/// The kernel the last quant_append() call on this host thread launched, for diagnostics and tests: "vector C<c> L<l>"
/// (c channels per lane, l lanes per row), "warp" or "thread"; "" before any.
std::string quant_append_last_kernel();
/// Records it (the launchers): channels_per_lane > 0 the vector kernel, 0 the warp kernel, < 0 the thread kernel.
void note_quant_append_kernel(int channels_per_lane, int lanes_per_row);

}  // namespace flashkv::cuda
