/* flashkv_cuda.h — C ABI of the CUDA-only entry points (split-KV paged decode). Part of libflashkv.so; in a build
 * without the CUDA backend every function returns FLASHKV_ERROR_UNSUPPORTED.
 *
 * flashkv_cuda_decode: see src/cuda/decode_cuda.hpp (shapes, semantics, errors). All tensors are CUDA tensors:
 *   q [batch, seqlen_q, num_heads, head_dim]; k_cache/v_cache [num_pages, page_size, num_heads_kv, head_dim] with
 *   page_table [batch, max_pages] int32 (or [batch, capacity, num_heads_kv, head_dim] with page_table NULL);
 *   cache_seqlens [batch] int32; k_new/v_new NULL or [batch, seqlen_q, num_heads_kv, head_dim] (appended first);
 *   out [batch, seqlen_q, num_heads, head_dim]; lse NULL or [batch, num_heads, seqlen_q] float32.
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
  int32_t num_splits;        /* 0 = heuristic, 1 = no split */
  int64_t max_seqlen_k;      /* 0 = page-table capacity (heuristic input only) */
  void* stream;              /* cudaStream_t */
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
