/* flashkv_cuda.h — C ABI of split-KV paged decode over 16-bit cache tensors (flash_attn_with_kvcache style).
 * Part of libflashkv.so.
 *
 * flashkv_cuda_decode = flashkv::paged_decode (include/flashkv/decode.hpp: shapes, semantics, errors). Despite the
 * name the tensors' device decides: CUDA tensors run the CUDA kernels (FLASHKV_ERROR_UNSUPPORTED in a build without
 * the CUDA backend), CPU tensors the CPU decode.
 *   q [batch, seqlen_q, num_heads, head_dim]; k_cache/v_cache [num_pages, page_size, num_heads_kv, head_dim] with
 *   page_table [batch, max_pages] int32 (or [batch, capacity, num_heads_kv, head_dim] with page_table NULL);
 *   cache_seqlens [batch] int32; k_new/v_new NULL or [batch, seqlen_q, num_heads_kv, head_dim] (appended first);
 *   out [batch, seqlen_q, num_heads, head_dim]; lse NULL or [batch, num_heads, seqlen_q] float32.
 * Lengths past the capacity (cache_seqlens[b] + seqlen_q of appended tokens > max_pages * page_size) return
 * FLASHKV_ERROR_CAPACITY before anything is written or launched; the message names the sequence, the lengths and the
 * capacity. On CUDA that check reads cache_seqlens back (one small synchronous copy) unless max_seqlen_k > 0 promises
 * a bound (then max_seqlen_k + seqlen_q <= capacity is checked, and a sequence breaking the promise gets NaN output
 * and no append).
 */
#ifndef FLASHKV_CUDA_H_
#define FLASHKV_CUDA_H_

#include "flashkv/flashkv.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  uint32_t struct_size;      /* sizeof(flashkv_decode_options) */
  int32_t has_softmax_scale; /* 0: 1/sqrt(head_dim) */
  float softmax_scale;
  int32_t causal;            /* bottom-right aligned over the seqlen_q new tokens (default 1) */
  float softcap;             /* 0 = off */
  int32_t num_splits;        /* 0 = heuristic, 1 = no split, <= 1024 */
  int64_t max_seqlen_k;      /* 0 = none; > 0: promised bound of cache_seqlens (see above; also sizes num_splits) */
  void* stream;              /* cudaStream_t */
  /* fields added later (honoured when struct_size covers them) */
  int32_t window_size_left;  /* -1 = unbounded (default); keys j >= position - window_size_left only */
  int32_t num_threads;       /* CPU tensors: 0 = OpenMP default */
} flashkv_decode_options;

FLASHKV_API flashkv_status flashkv_decode_options_default(flashkv_decode_options* opts);
FLASHKV_API flashkv_status flashkv_cuda_decode(const flashkv_tensor* q, const flashkv_tensor* k_cache,
                                               const flashkv_tensor* v_cache, const flashkv_tensor* page_table,
                                               const flashkv_tensor* cache_seqlens, const flashkv_tensor* k_new,
                                               const flashkv_tensor* v_new, const flashkv_tensor* out,
                                               const flashkv_tensor* lse, const flashkv_decode_options* opts);

#ifdef __cplusplus
}
#endif
#endif /* FLASHKV_CUDA_H_ */
