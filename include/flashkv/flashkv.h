/* flashkv.h — the stable C ABI of flashkv (any language can call it; Python's flashkv package uses it via ctypes).
 *
 * VERSIONING: FLASHKV_ABI_VERSION is bumped only on incompatible changes. Structs passed by pointer start with
 * `struct_size` (set it to sizeof(struct); the library reads only the fields that size covers), so fields can be
 * appended without breaking old callers. A struct_size larger than this library knows is rejected
 * (FLASHKV_ERROR_INVALID_ARGUMENT naming 'opts.struct_size') so options a newer caller set are never silently
 * ignored. Call flashkv_abi_version() to check at run time. Guide: docs/c-abi.md.
 *
 * ERRORS: every function returns flashkv_status; on anything but FLASHKV_OK, flashkv_last_error() returns a
 * thread-local, NUL-terminated message naming the argument with expected vs actual (valid until the next flashkv
 * call on the same thread). No function aborts or throws across the ABI.
 *
 * TENSORS: flashkv_tensor is a non-owning strided view; shape/strides in ELEMENTS; device FLASHKV_DEVICE_CUDA with
 * device_index names a CUDA device pointer (streams travel in the options struct as void*).
 * Shapes, dtypes and semantics are those of include/flashkv/attention.hpp, including NON-FINITE INPUTS there: NaN
 * and ±inf propagate as in IEEE arithmetic over the keys each query row sees (a row whose visible scores include a
 * NaN or +inf gets NaN out and lse; masked keys never matter; lse = −inf only for rows that see no key); they are
 * not reported as errors.
 */
#ifndef FLASHKV_H_
#define FLASHKV_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FLASHKV_ABI_VERSION 1
#define FLASHKV_MAX_DIMS 8

#if defined(_WIN32)
#define FLASHKV_API __declspec(dllexport)
#else
#define FLASHKV_API __attribute__((visibility("default")))
#endif

typedef enum {
  FLASHKV_OK = 0,
  FLASHKV_ERROR_INVALID_ARGUMENT = 1,
  FLASHKV_ERROR_TYPE = 2,
  FLASHKV_ERROR_UNSUPPORTED = 3,
  FLASHKV_ERROR_CAPACITY = 4,
  FLASHKV_ERROR_IO = 5,
  FLASHKV_ERROR_INTERNAL = 6
} flashkv_status;

typedef enum {
  FLASHKV_DTYPE_FLOAT32 = 0,
  FLASHKV_DTYPE_FLOAT16 = 1,
  FLASHKV_DTYPE_BFLOAT16 = 2,
  FLASHKV_DTYPE_INT32 = 3,
  FLASHKV_DTYPE_FLOAT64 = 4,
  FLASHKV_DTYPE_UINT8 = 5,
  FLASHKV_DTYPE_FLOAT8_E4M3FN = 6 /* torch.float8_e4m3fn: the FP8 attention forward's q/k/v (CUDA sm90ws) */
} flashkv_dtype;

typedef enum { FLASHKV_DEVICE_CPU = 0, FLASHKV_DEVICE_CUDA = 1 } flashkv_device;

typedef enum { FLASHKV_ALGO_TILED = 0, FLASHKV_ALGO_V1_ORDER = 1, FLASHKV_ALGO_NAIVE = 2 } flashkv_algorithm;

/* Which CUDA kernel family runs a call (flashkv::KernelFamily, flashkv/attention.hpp): AUTO picks from the device
 * and the call (on Hopper builds with sm_90a code: SM90WS for the forwards where it was measured faster, else SM90;
 * elsewhere SM80; FLASHKV_CUDA_SM80_ONLY=1 makes AUTO mean sm80); SM80 / SM90 / SM90WS ask for one family and fail
 * with FLASHKV_ERROR_UNSUPPORTED when the GPU or build cannot run it (SM90WS: TMA warp-specialized, forward only). */
typedef enum {
  FLASHKV_KERNEL_AUTO = 0,
  FLASHKV_KERNEL_SM80 = 1,
  FLASHKV_KERNEL_SM90 = 2,
  FLASHKV_KERNEL_SM90WS = 3
} flashkv_kernel_family;

typedef struct {
  void* data;
  int32_t dtype;        /* flashkv_dtype */
  int32_t device;       /* flashkv_device */
  int32_t device_index;
  int32_t ndim;         /* <= FLASHKV_MAX_DIMS */
  int64_t shape[FLASHKV_MAX_DIMS];
  int64_t strides[FLASHKV_MAX_DIMS]; /* elements */
} flashkv_tensor;

typedef struct {
  uint32_t struct_size;      /* sizeof(flashkv_attention_options) */
  int32_t has_softmax_scale; /* 0: use 1/sqrt(head_dim) */
  float softmax_scale;
  int32_t causal;
  int32_t window_size_left;  /* -1 = unbounded */
  int32_t window_size_right; /* -1 = unbounded */
  float softcap;             /* 0 = off */
  int32_t algorithm;         /* flashkv_algorithm */
  int32_t deterministic;     /* CUDA backward: 1 = bit-identical run to run (slower); 0 (default) = atomics */
  int32_t num_threads;       /* CPU; 0 = default */
  void* stream;              /* CUDA: cudaStream_t */
  int32_t kernel_family;     /* flashkv_kernel_family; appended after stream: a smaller struct_size means AUTO */
  /* FP8 forward only (q/k/v FLASHKV_DTYPE_FLOAT8_E4M3FN, out bfloat16): dequantization scales, float32 tensors of
   * shape [] or [1] (per tensor) or [batch, num_heads_kv] on q's device; NULL = 1 (flashkv::AttentionOptions::
   * q_descale; include/flashkv/attention.hpp, DTYPES). Appended last: a smaller struct_size means NULL. */
  const flashkv_tensor* q_descale;
  const flashkv_tensor* k_descale;
  const flashkv_tensor* v_descale;
} flashkv_attention_options;

FLASHKV_API const char* flashkv_version(void);
FLASHKV_API int32_t flashkv_abi_version(void);
FLASHKV_API const char* flashkv_last_error(void);
/** The kernel family / code path this thread's last kernel-running call took (one short line, "" before the first;
 *  see flashkv/diagnostics.hpp). Valid until this thread's next flashkv call. FLASHKV_LOG=1 also prints each to stderr. */
FLASHKV_API const char* flashkv_last_kernel_path(void);
/** Fills *opts with defaults (struct_size set). */
FLASHKV_API flashkv_status flashkv_attention_options_default(flashkv_attention_options* opts);

/** lse may be NULL. */
FLASHKV_API flashkv_status flashkv_attention_forward(const flashkv_tensor* q, const flashkv_tensor* k,
                                                     const flashkv_tensor* v, const flashkv_tensor* out,
                                                     const flashkv_tensor* lse,
                                                     const flashkv_attention_options* opts);
FLASHKV_API flashkv_status flashkv_attention_backward(const flashkv_tensor* q, const flashkv_tensor* k,
                                                      const flashkv_tensor* v, const flashkv_tensor* out,
                                                      const flashkv_tensor* lse, const flashkv_tensor* dout,
                                                      const flashkv_tensor* dq, const flashkv_tensor* dk,
                                                      const flashkv_tensor* dv,
                                                      const flashkv_attention_options* opts);
FLASHKV_API flashkv_status flashkv_attention_varlen_forward(
    const flashkv_tensor* q, const flashkv_tensor* k, const flashkv_tensor* v, const flashkv_tensor* cu_seqlens_q,
    const flashkv_tensor* cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k, const flashkv_tensor* out,
    const flashkv_tensor* lse, const flashkv_attention_options* opts);
FLASHKV_API flashkv_status flashkv_attention_varlen_backward(
    const flashkv_tensor* q, const flashkv_tensor* k, const flashkv_tensor* v, const flashkv_tensor* cu_seqlens_q,
    const flashkv_tensor* cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k, const flashkv_tensor* out,
    const flashkv_tensor* lse, const flashkv_tensor* dout, const flashkv_tensor* dq, const flashkv_tensor* dk,
    const flashkv_tensor* dv, const flashkv_attention_options* opts);

/* The KV-cache and engine entry points are declared in flashkv_kvcache.h / flashkv_engine.h when built. */

#ifdef __cplusplus
}
#endif
#endif /* FLASHKV_H_ */
