/* flashkv_kvcache.h — C ABI of the quantized paged KV cache (C++: include/flashkv/kvcache.hpp, which documents the
 * formats, the kv_cache_dtype grammar, windows, rotation, devices and the memory formula in full; attention:
 * include/flashkv/decode.hpp).
 *
 * Conventions as flashkv.h: every function returns flashkv_status and sets flashkv_last_error() on failure; structs
 * start with struct_size; tensors are flashkv_tensor views. A cache lives in host memory (device = FLASHKV_DEVICE_CPU,
 * the default) or on a CUDA device (FLASHKV_DEVICE_CUDA; a build with the CUDA backend); its tensors are on its
 * device (appends also take host tensors). A rejected call leaves the cache exactly as it was
 * (FLASHKV_ERROR_CAPACITY when a fixed-size page pool is full; with capacity_pages = capacity_bytes = 0, the default,
 * the pool grows on demand).
 *
 * Typical use (decode step of one layer):
 *   flashkv_kv_cache_config cfg; flashkv_kv_cache_config_default(&cfg);
 *   cfg.num_layers = 32; cfg.num_heads_kv = 8; cfg.head_dim = 128; cfg.kv_cache_dtype = "int4"; cfg.capacity_pages = 4096;
 *   flashkv_kv_cache* c; flashkv_kv_cache_create(&cfg, &c);
 *   flashkv_kv_cache_add_sequence(c, 0);
 *   flashkv_kv_cache_append(c, 0, layer, &k, &v);               k, v [n_tokens, num_heads_kv, head_dim]
 *   flashkv_kv_cache_attention(c, ids, 1, cu, layer, &q, &out, &lse, &opts);  q/out [total_q, num_heads, head_dim]
 *   flashkv_kv_cache_free(c);
 */
#ifndef FLASHKV_KVCACHE_H_
#define FLASHKV_KVCACHE_H_

#include "flashkv/flashkv.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flashkv_kv_cache flashkv_kv_cache; /* opaque */

typedef enum { FLASHKV_KV_ROTATION_NONE = 0, FLASHKV_KV_ROTATION_HADAMARD = 1 } flashkv_kv_rotation;

typedef struct {
  uint32_t struct_size;        /* sizeof(flashkv_kv_cache_config) */
  int32_t num_layers;          /* >= 1 */
  int32_t num_heads_kv;        /* >= 1 */
  int32_t head_dim;            /* 1..256 */
  const char* kv_cache_dtype;  /* grammar of kvcache.hpp, e.g. "int8", "k:int8,v:int4", "int2_kivi_g64"; NULL = "bf16" */
  int32_t page_size;           /* tokens per page, power of two 16..256 */
  int32_t residual_tokens;     /* most recent tokens kept bf16 */
  int32_t sink_tokens;         /* first tokens kept bf16 */
  int32_t rotation;            /* flashkv_kv_rotation */
  uint64_t rotation_seed;
  const float* k_scales;       /* static fp8 scales: NULL/0 = 1.0, 1 = per tensor, num_heads_kv = per kv-head */
  int32_t num_k_scales;
  const float* v_scales;
  int32_t num_v_scales;
  int64_t capacity_pages;      /* at most one of capacity_pages / capacity_bytes > 0; both 0: grows on demand */
  int64_t capacity_bytes;
  /* fields added later (honoured when struct_size covers them) */
  int32_t device;              /* flashkv_device of the pages (default FLASHKV_DEVICE_CPU) */
  int32_t device_index;
} flashkv_kv_cache_config;

typedef struct {
  uint32_t struct_size;      /* sizeof(flashkv_kv_attention_options) */
  int32_t has_softmax_scale; /* 0: 1/sqrt(head_dim) */
  float softmax_scale;
  int32_t causal;            /* bottom-right aligned; default 1 */
  int32_t window_size_left;  /* -1 = unbounded */
  float softcap;             /* 0 = off */
  int32_t num_splits;        /* 0 = auto */
  int32_t num_threads;       /* 0 = OpenMP default */
} flashkv_kv_attention_options;

/* Bytes as in flashkv::KVMemoryReport. */
typedef struct {
  uint32_t struct_size; /* sizeof(flashkv_kv_memory_report) */
  int64_t num_sequences, num_tokens, token_layers;
  int64_t page_bytes, pages_total, pages_used, pages_free;
  int64_t code_bytes, metadata_bytes, residual_bytes, slack_bytes, total_bytes, pool_bytes;
  double bits_per_element, ratio_vs_bf16;
} flashkv_kv_memory_report;

/** Defaults: 1 layer, 1 kv head, head_dim 128, "bf16", page 16, no windows, no rotation, a growing pool, host memory. */
FLASHKV_API flashkv_status flashkv_kv_cache_config_default(flashkv_kv_cache_config* cfg);
FLASHKV_API flashkv_status flashkv_kv_attention_options_default(flashkv_kv_attention_options* opts);

FLASHKV_API flashkv_status flashkv_kv_cache_create(const flashkv_kv_cache_config* cfg, flashkv_kv_cache** out);
/** NULL is allowed (no-op). */
FLASHKV_API flashkv_status flashkv_kv_cache_free(flashkv_kv_cache* cache);

/** A copy of `cache` (sequences, pages, windows: the same bytes) in the memory of `device` / `device_index`. */
FLASHKV_API flashkv_status flashkv_kv_cache_to(const flashkv_kv_cache* cache, int32_t device, int32_t device_index,
                                               flashkv_kv_cache** out);

FLASHKV_API flashkv_status flashkv_kv_cache_add_sequence(flashkv_kv_cache* cache, int64_t seq_id);
FLASHKV_API flashkv_status flashkv_kv_cache_remove_sequence(flashkv_kv_cache* cache, int64_t seq_id);
FLASHKV_API flashkv_status flashkv_kv_cache_seq_len(const flashkv_kv_cache* cache, int64_t seq_id, int32_t layer,
                                                    int64_t* out);

/** k, v [n_tokens, num_heads_kv, head_dim] float32/float16/bfloat16. */
FLASHKV_API flashkv_status flashkv_kv_cache_append(flashkv_kv_cache* cache, int64_t seq_id, int32_t layer,
                                                   const flashkv_tensor* k, const flashkv_tensor* v);

/** seq_ids [batch], cu_seqlens_q [batch + 1]; q/out [total_q, num_heads, head_dim]; lse [num_heads, total_q] float32
 *  or NULL; opts NULL = defaults. */
FLASHKV_API flashkv_status flashkv_kv_cache_attention(const flashkv_kv_cache* cache, const int64_t* seq_ids,
                                                      int32_t batch, const int32_t* cu_seqlens_q, int32_t layer,
                                                      const flashkv_tensor* q, const flashkv_tensor* out,
                                                      const flashkv_tensor* lse,
                                                      const flashkv_kv_attention_options* opts);

FLASHKV_API flashkv_status flashkv_kv_cache_memory_report(const flashkv_kv_cache* cache, flashkv_kv_memory_report* out);

/** k_out, v_out [seq_len, num_heads_kv, head_dim] float32, original (unrotated) basis. */
FLASHKV_API flashkv_status flashkv_kv_cache_dequantize(const flashkv_kv_cache* cache, int64_t seq_id, int32_t layer,
                                                       const flashkv_tensor* k_out, const flashkv_tensor* v_out);

/** The memory formula of `flashkv kv-mem` for `batch` sequences of `tokens` tokens (capacity fields ignored). */
FLASHKV_API flashkv_status flashkv_kv_memory_estimate(const flashkv_kv_cache_config* cfg, int64_t batch, int64_t tokens,
                                                      flashkv_kv_memory_report* out);

#ifdef __cplusplus
}
#endif
#endif /* FLASHKV_KVCACHE_H_ */
