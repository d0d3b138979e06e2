// flashkv/decode.hpp — attention of new query tokens against a paged KV cache (decode, chunked prefill, speculative
// verification), on the CPU or on CUDA.
//
// Algorithm: split-KV "flash-decoding" (Dao, Haziza, Massa, Sizov, "Flash-Decoding for long-context inference",
// 2023): the visible keys of each (sequence, kv head) are cut into num_splits chunks processed in parallel; each chunk
// runs FlashAttention's online softmax (Dao et al. 2022, Alg. 1: running max m, sum l, unnormalized O) over page-sized
// tiles and yields a partial (o_s, lse_s); the partials are merged exactly by their log-sum-exp (src/core/merge.hpp):
//   M = max_s lse_s,  w_s = exp(lse_s − M),  out = Σ_s w_s·o_s / Σ_s w_s,  lse = M + log Σ_s w_s
// (a NaN lse_s makes the row NaN; only lse_s = −inf means "no key in this chunk"). The query heads that share a kv
// head are processed together (GQA packing), so each K/V byte is read once per kv head. The result is exact attention
// (up to float32 rounding) over the visible keys, whatever num_splits is.
//
// TWO ENTRY POINTS, one validation (core::make_decode_problem) and one dispatch (CPU kernels, or the device backend's
// decode hook, src/core/backend.hpp), like flashkv::attention_forward:
//   1. paged_decode(): flash-attn / vLLM style tensors — a 16-bit paged cache k_cache / v_cache [num_pages,
//      page_size, num_heads_kv, head_dim] with page_table [batch, max_pages] int32 (or a contiguous [batch, capacity,
//      num_heads_kv, head_dim] cache without page_table), cache_seqlens [batch] int32, optional k_new / v_new appended
//      first. CPU or CUDA tensors.
//   2. plan_decode() + run_decode(): over a flashkv::PagedKVCache (every kv_cache_dtype, windows, rotation; host or
//      device memory). The plan computes the work partition of one batch shape once (and, on CUDA, uploads the page
//      table and lengths); run_decode() then runs it for every layer of the step (FlashInfer's plan/run).
//      PagedKVCache::attention() is plan + run.
//
// NON-FINITE VALUES (the contract of flashkv/attention.hpp): a row whose visible scores include a NaN or ±inf (NaN in
// q or in a visible key) gets out = NaN and lse = NaN; a NaN / inf in the value of a visible key makes the affected
// output channels non-finite; keys that are not visible (masked, or page slots past a sequence's length, whatever
// they hold) never change a row. Only a row with no visible key gets out = 0 and lse = −inf.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "flashkv/types.hpp"

namespace flashkv {

class PagedKVCache;

/// Options of decode attention (both entry points; PagedKVCache::attention takes the same struct as
/// KVAttentionOptions). Mask semantics as attention.hpp, bottom-right aligned: query i of the n_q new tokens of a
/// sequence with seqlen_k keys sits at position seqlen_k − n_q + i.
struct DecodeOptions {
  std::optional<float> softmax_scale;  ///< default 1/sqrt(head_dim); finite, > 0
  bool causal = true;                  ///< query at position p sees keys j <= p
  int32_t window_size_left = -1;       ///< −1 = unbounded; else keys j >= p − window_size_left only
  float softcap = 0.0f;                ///< 0 = off; score ← softcap·tanh(score/softcap); finite, >= 0
  int32_t num_splits = 0;              ///< split-KV chunks per (sequence, kv head); 0 = heuristic; 1..1024
  int32_t num_threads = 0;             ///< CPU: 0 = OpenMP default
  /// paged_decode only: an upper bound of cache_seqlens the caller promises (0 = none). With it the CUDA path skips
  /// reading cache_seqlens back to the host for the capacity check (max_seqlen_k + seqlen_new <= capacity is checked
  /// instead) and sizes its split heuristic by it; a sequence that breaks the promise gets NaN out / lse and nothing
  /// appended (checked on the device). Without it the lengths are read back (one small synchronous copy).
  int64_t max_seqlen_k = 0;
  void* stream = nullptr;  ///< CUDA: cudaStream_t (nullptr = the default stream)
};

/// flash_attn_with_kvcache-style decode over 16-bit cache tensors, CPU or CUDA (all tensors on one device).
///   q             [batch, seqlen_q, num_heads, head_dim] float16 / bfloat16 (CPU also float32)
///   k_cache/v_cache paged: [num_pages, page_size, num_heads_kv, head_dim] (page_size a power of two in 16..256) with
///                 page_table [batch, max_pages] int32; contiguous: [batch, capacity, num_heads_kv, head_dim] with
///                 page_table == nullptr. dtype = q.dtype. Token t of sequence b lives in page page_table[b][t /
///                 page_size], row t % page_size. capacity = max_pages · page_size (paged) or shape[1].
///   cache_seqlens [batch] int32 >= 0: tokens already cached (not modified)
///   k_new/v_new   optional (both or neither) [batch, seqlen_q, num_heads_kv, head_dim]: written into the cache at
///                 positions cache_seqlens[b] + i first; attention then covers cache_seqlens[b] + seqlen_q keys
///   out           [batch, seqlen_q, num_heads, head_dim] (written); lse optional [batch, num_heads, seqlen_q] float32
/// Errors (nothing written or launched after any of them): Error / TypeError naming the argument (rank, shape,
/// dtype, device, page_size, alignment on CUDA, a negative cache_seqlens); CapacityError when cache_seqlens[b] +
/// seqlen_new > capacity (naming b, the lengths and the capacity); UnsupportedError for a head dim / dtype the device
/// cannot run. Page ids among the first ceil(seqlen_k / page_size) entries of a row must be < num_pages (not checked).
void paged_decode(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                  const TensorView* page_table, const TensorView& cache_seqlens, const TensorView* k_new,
                  const TensorView* v_new, const TensorView& out, const TensorView* lse,
                  const DecodeOptions& options = {});

/// The work partition of one decode batch over a PagedKVCache (sequences, query lengths, key lengths, splits; on a
/// device cache also the device copies of the page table and lengths and the split workspace). Reusable for every
/// layer whose key lengths equal the planned ones; not for concurrent runs (it owns the workspace). Move-only.
class DecodePlan {
 public:
  DecodePlan();
  ~DecodePlan();
  DecodePlan(DecodePlan&&) noexcept;
  DecodePlan& operator=(DecodePlan&&) noexcept;
  DecodePlan(const DecodePlan&) = delete;
  DecodePlan& operator=(const DecodePlan&) = delete;

  bool valid() const;
  int64_t batch() const;
  /// Split-KV chunks per (sequence, kv head) (the largest one on the CPU, where it is chosen per sequence).
  int32_t num_splits() const;
  /// The kernel path the runs take ("kv_decode cpu fused-avx512 k=int4 v=int4 ...", "kv_decode cuda split-kv ...").
  std::string path() const;

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Plans attention of cu_seqlens_q[b + 1] − cu_seqlens_q[b] queries of num_heads query heads per sequence seq_ids[b]
/// against `cache`, for key lengths = the sequences' lengths in `layer` now (plan after appending the step's tokens
/// to that layer; every layer then has the same lengths once appended). seq_ids [batch] (registered; repeats
/// allowed), cu_seqlens_q [batch + 1] int32 host prefix sums (cu[0] = 0, non-decreasing), num_heads a positive
/// multiple of num_heads_kv (GQA: query head h reads kv head h / (num_heads / num_heads_kv)). Errors: Error naming
/// 'seq_ids', 'cu_seqlens_q', 'num_heads', 'layer', 'options.*'; UnsupportedError for what the cache's device cannot
/// run (naming the format).
DecodePlan plan_decode(const PagedKVCache& cache, std::span<const int64_t> seq_ids,
                       std::span<const int32_t> cu_seqlens_q, int64_t num_heads, int32_t layer,
                       const DecodeOptions& options = {});

/// Runs `plan` on `layer`: q [total_q, num_heads, head_dim] (float32 / float16 / bfloat16 on the CPU; float16 /
/// bfloat16 matching a 16-bit cache on CUDA), out like q (written), lse optional [num_heads, total_q] float32, all on
/// the cache's device. Error 'plan' when the layer's key lengths or page tables differ from the planned ones (re-plan);
/// Error / TypeError naming q / out / lse otherwise.
void run_decode(const PagedKVCache& cache, DecodePlan& plan, int32_t layer, const TensorView& q, const TensorView& out,
                const TensorView* lse);

}  // namespace flashkv
