// Engine steps over a device PagedKVCache whose tables live on the device: the batched append of a step (the K / V of
// every sequence of the step written into the pages by ONE launch per layer, quantized on write) and the decode over
// the same device tables. Both are asynchronous on a stream and capturable in a CUDA graph (no allocation, copy or
// synchronization), so a decode step whose shape stays in one bucket replays with only its tables re-uploaded
// (src/engine/cuda/). Not a public header: the library's engine and the tests use it.
//
// A step of `batch` sequences that each grow by n_new tokens in every layer:
//   1. step_reserve(cache, ids, n_new)        takes the pages the growth needs (CapacityError first, nothing changed);
//                                             returns the longest page list of the batch;
//   2. step_host_tables(cache, ids, ...)      the step's tables into host memory: seqlens [batch] (tokens BEFORE the
//                                             append, every layer), cu_seqlens_q [batch + 1] (b · n_new) and the page
//                                             table [batch, stride]; the caller uploads them (StepTables);
//   3. per layer: step_append(...)            rows [batch, n_new, Hk, d] written at positions seqlens[b] + i (values
//                                             checked inside the write: core::DecodeBackend::append_step's `bad`
//                                             flags), then run_step_decode(...) with a plan from plan_step_decode
//                                             (each sequence's n_new queries attend over seqlens[b] + n_new keys,
//                                             causal, bottom-right aligned);
//   4. step_commit(cache, ids, n_new)         the host lengths advance by n_new in every layer.
// Until step_commit the host lengths are the old ones: run nothing else on the cache in between. Host-side cache calls
// that may grow or refill the pool (step_reserve, append, remove_sequence, copies) finish their own device work before
// returning, but do not wait for kernels still in flight on the caller's stream: synchronize it first (the engine's
// settle()). Device caches without windows, KIVI keys or rotation only (UnsupportedError naming the cache otherwise);
// every sequence must have the same length in every layer (Error 'seq_ids').
//
// What a step plan depends on (and so what a captured graph is valid for): batch, n_new, num_heads, the q dtype, the
// page table's stride (capacity = stride · page_size tokens per sequence) and the split count, which the heuristic
// (flashkv::cuda::decode_num_splits) takes from max_seqlen_k; step_decode_splits() tells it without planning. The
// kernels read every length, page and query offset from the device tables, so a plan made for one step runs any later
// step with the same (batch, n_new, stride, splits) exactly as a fresh plan of that step would.
#pragma once

#include <cstdint>
#include <span>

#include "flashkv/decode.hpp"
#include "flashkv/kvcache.hpp"

namespace flashkv::kv {

/// The device tables of one step (int32, on the cache's device).
struct StepTables {
  const int32_t* seqlens = nullptr;       ///< [batch] tokens before the step's append
  const int32_t* cu_seqlens_q = nullptr;  ///< [batch + 1] = b · n_new
  const int32_t* page_table = nullptr;    ///< [batch, stride]
  int64_t stride = 0;                     ///< page-table row stride, in pages (>= every sequence's page count)
};

/// One layer's new rows: k / v [batch, n_new, num_heads_kv, head_dim] of `dtype` (float32 / float16 / bfloat16; a
/// 16-bit cache takes its own dtype) on the cache's device, element strides (batch, row, head), last dim contiguous.
struct StepRows {
  const void* k = nullptr;
  const void* v = nullptr;
  DType dtype = DType::bfloat16;
  int64_t batch_stride = 0, row_stride = 0, head_stride = 0;  ///< the same for k and v
};

/// Takes the pages the sequences need to grow by n_new >= 1 tokens (in seq_ids order, as appends in that order would);
/// CapacityError naming the pages needed / free before anything changes. Returns max over the batch of the sequences'
/// page counts. Errors: Error 'seq_ids' (unknown, repeated, or lengths that differ between layers), 'n_new'.
int64_t step_reserve(PagedKVCache& cache, std::span<const int64_t> seq_ids, int64_t n_new);

/// Host tables of the step (after step_reserve): seqlens [batch], cu_seqlens_q [batch + 1], page_table [batch, stride]
/// (entries past a sequence's pages are 0). Error 'stride' when a sequence holds more than `stride` pages.
void step_host_tables(const PagedKVCache& cache, std::span<const int64_t> seq_ids, int64_t n_new, int64_t stride,
                      int32_t* seqlens, int32_t* cu_seqlens_q, int32_t* page_table);

/// Writes one layer's rows of the step (one launch; see the file comment). `bad`: device [2] uint64 the caller set to
/// UINT64_MAX; K / V's smallest flat (b, i, h, c) index of a value the half cannot store is atomicMin'ed there (the
/// row is not encoded in packed pages). stream: cudaStream_t.
void step_append(const PagedKVCache& cache, const StepTables& tables, int64_t batch, int64_t n_new, int32_t layer,
                 const StepRows& rows, unsigned long long* bad, void* stream);

/// Advances every layer's length of each sequence by n_new (the step's appends were enqueued for every layer).
void step_commit(PagedKVCache& cache, std::span<const int64_t> seq_ids, int64_t n_new);

/// Plans the decode of a step: batch sequences, n_new queries each (= the tokens the step appended), num_heads query
/// heads, q / out of q_dtype (the cache's 16-bit type, or bfloat16 for packed pages), max_seqlen_k = the longest
/// sequence after the append (sizes the split heuristic). Allocates its workspace on `stream` (plan time: not
/// capturable); its runs are.
DecodePlan plan_step_decode(const PagedKVCache& cache, const StepTables& tables, int64_t batch, int64_t n_new,
                            int64_t num_heads, int64_t max_seqlen_k, DType q_dtype, void* stream);

/// The split count plan_step_decode would choose (same arguments, no tables needed).
int32_t step_decode_splits(const PagedKVCache& cache, int64_t batch, int64_t n_new, int64_t num_heads,
                           int64_t max_seqlen_k, DType q_dtype);

/// Runs a step plan on `layer`: q / out [batch · n_new, num_heads, head_dim] of the plan's dtype on the cache's device.
void run_step_decode(const PagedKVCache& cache, DecodePlan& plan, int32_t layer, const TensorView& q,
                     const TensorView& out);

}  // namespace flashkv::kv
