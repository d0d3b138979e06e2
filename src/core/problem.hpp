// AttentionProblem: one validated attention call (forward or backward, fixed-length or varlen) reduced to plain
// numbers and pointers, independent of the device. Produced by src/core/validate.hpp, consumed by the CPU kernels
// (src/cpu/) and by the CUDA backend (src/cuda/, through the DeviceBackend hook table in src/core/backend.hpp).
//
// Conventions
//   * All strides are in ELEMENTS (int64). The last dimension of every tensor is contiguous (validated), so each tensor
//     needs only three strides: batch (0 for varlen), row (token) and head.
//   * Element (b, i, h, d) of q lives at q + b*q_strides.batch + (row0 + i)*q_strides.row + h*q_strides.head + d, where
//     row0 = 0 for fixed-length and cu_seqlens_q[b] for varlen. The same rule holds for k, v, out, dout, dq, dk, dv.
//   * lse element (b, h, i) lives at lse + b*lse_strides.batch + h*lse_strides.head + (row0 + i)*lse_strides.row.
//     Fixed-length lse is [batch, num_heads, seqlen_q]; varlen lse is [num_heads, total_q] (lse_strides.batch = 0).
//   * causal is folded into window_size_right = 0 (bottom-right aligned), so kernels only see the window rule of
//     src/core/mask.hpp. window sizes are −1 (unbounded) or >= 0.
//   * softmax_scale is resolved (default 1/sqrt(head_dim)); softcap = 0 means off.
//   * Pointers are device pointers of `device`. cu_seqlens_q/k are only dereferenced on the host when device == cpu.
//   * The problem never owns memory.
#pragma once

#include <cstdint>

#include "flashkv/attention.hpp"
#include "flashkv/types.hpp"

namespace flashkv::core {

/// Element strides of a [batch, rows, heads, dim] (or packed [rows, heads, dim]) tensor; dim stride is 1.
struct Strides3 {
  int64_t batch = 0;  ///< 0 for packed (varlen) tensors
  int64_t row = 0;    ///< token stride
  int64_t head = 0;   ///< head stride
};

/// lse strides (float32 elements): fixed [batch, num_heads, seqlen_q], varlen [num_heads, total_q].
struct LseStrides {
  int64_t batch = 0;
  int64_t head = 0;
  int64_t row = 0;
};

struct AttentionProblem {
  // ---- sizes -------------------------------------------------------------------------------------------------------
  int64_t batch = 0;
  /// Fixed-length: the sequence lengths. Varlen: equal to max_seqlen_q / max_seqlen_k (upper bounds).
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t max_seqlen_q = 0;  ///< == seqlen_q for fixed-length
  int64_t max_seqlen_k = 0;  ///< == seqlen_k for fixed-length
  int64_t total_q = 0;       ///< varlen: rows of the packed q (= cu_seqlens_q[batch]); fixed: batch*seqlen_q
  int64_t total_k = 0;       ///< varlen: rows of the packed k/v; fixed: batch*seqlen_k
  int64_t num_heads = 0;
  int64_t num_heads_kv = 0;
  int64_t head_dim = 0;    ///< of q and k
  int64_t head_dim_v = 0;  ///< of v, out

  bool is_varlen = false;
  bool is_backward = false;
  /// Varlen only: int32 [batch + 1] prefix sums, device pointers (read on the host only when device == cpu).
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;

  // ---- element type and placement ---------------------------------------------------------------------------------
  DType dtype = DType::float32;  ///< of q, k, v, out, dout, dq, dk, dv (float32 | float16 | bfloat16 | float8_e4m3fn)
  DType out_dtype = DType::float32;  ///< of out: = dtype, except bfloat16 for float8_e4m3fn inputs
  Device device = Device::cpu;
  int32_t device_index = 0;

  // ---- data (never owned) ------------------------------------------------------------------------------------------
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;  ///< written by forward; read by backward
  float* lse = nullptr;  ///< forward: optional output (nullptr = not requested); backward: required input
  const void* dout = nullptr;  ///< backward only
  void* dq = nullptr;          ///< backward only
  void* dk = nullptr;          ///< backward only
  void* dv = nullptr;          ///< backward only

  Strides3 q_strides, k_strides, v_strides, out_strides;
  Strides3 dout_strides, dq_strides, dk_strides, dv_strides;  ///< backward only
  LseStrides lse_strides;

  /// FP8 forward: a dequantization scale, element (b, hk) at ptr[b * batch + hk * head] (float32, device pointer;
  /// strides 0 for a per-tensor scale); ptr == nullptr means 1.
  struct Descale {
    const float* ptr = nullptr;
    int64_t batch = 0, head = 0;
  };
  Descale q_descale, k_descale, v_descale;

  // ---- semantics ---------------------------------------------------------------------------------------------------
  float softmax_scale = 1.0f;     ///< resolved, finite, > 0
  int32_t window_size_left = -1;  ///< −1 = unbounded
  int32_t window_size_right = -1; ///< −1 = unbounded; causal folded in as 0
  float softcap = 0.0f;           ///< 0 = off
  bool causal = false;            ///< informational only (already folded into window_size_right)

  // ---- execution ---------------------------------------------------------------------------------------------------
  Algorithm algorithm = Algorithm::tiled;
  KernelFamily kernel_family = KernelFamily::automatic;  ///< CUDA only (CPU problems are always automatic)
  bool deterministic = false;
  int32_t num_threads = 0;  ///< CPU: 0 = OpenMP default
  void* stream = nullptr;   ///< CUDA stream (cudaStream_t) or nullptr

  /// Query heads per kv head (GQA group size; 1 = MHA, num_heads = MQA).
  int64_t group_size() const { return num_heads / num_heads_kv; }

  /// Host-side per-sequence bounds (valid on the CPU, or for fixed-length problems on any device).
  int64_t q_begin(int64_t b) const { return is_varlen ? cu_seqlens_q[b] : 0; }
  int64_t k_begin(int64_t b) const { return is_varlen ? cu_seqlens_k[b] : 0; }
  int64_t seqlen_q_of(int64_t b) const { return is_varlen ? cu_seqlens_q[b + 1] - cu_seqlens_q[b] : seqlen_q; }
  int64_t seqlen_k_of(int64_t b) const { return is_varlen ? cu_seqlens_k[b + 1] - cu_seqlens_k[b] : seqlen_k; }
};

}  // namespace flashkv::core
