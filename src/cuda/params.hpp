// Kernel parameter blocks of the CUDA backend (plain structs passed by value to __global__ functions).
// Filled on the host from a validated core::AttentionProblem (src/cuda/attention_cuda.cpp) or a decode request
// (src/cuda/decode_cuda.cpp). Strides are in ELEMENTS and int64 (64-bit offsets everywhere: batch*heads*seqlen*head_dim
// may exceed 2^31). Pointers are device pointers; head_dim here is a multiple of 8 (the host pads otherwise).
#pragma once

#include <cstdint>

namespace flashkv::cuda {

struct TensorStrides {
  int64_t batch = 0;  ///< 0 for packed varlen tensors
  int64_t row = 0;
  int64_t head = 0;
};

/// A dequantization scale tensor of the FP8 forward: element (b, hk) at ptr[b * batch + hk * head] (float32; strides
/// 0 for a per-tensor scale); ptr == nullptr means 1.
struct DescaleView {
  const float* ptr = nullptr;
  int64_t batch = 0, head = 0;
};

/// Forward (and the shared part of backward).
struct FwdParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;  ///< optional; natural log
  TensorStrides q_s, k_s, v_s, out_s;
  int64_t lse_batch = 0, lse_head = 0, lse_row = 0;

  const int32_t* cu_seqlens_q = nullptr;  ///< varlen when non-null
  const int32_t* cu_seqlens_k = nullptr;
  int32_t batch = 0, num_heads = 0, num_heads_kv = 0, head_dim = 0;
  int32_t seqlen_q = 0, seqlen_k = 0;  ///< fixed-length sizes; varlen: max_seqlen_q/k (grid bounds)
  int64_t total_q = 0, total_k = 0;    ///< rows of the packed q / k tensors (varlen; batch * seqlen otherwise)

  int32_t window_left = -1, window_right = -1;
  float softmax_scale = 1.f;
  /// Scores are computed as s = qk * score_scale, then (softcap only) s = tanh(s); the softmax uses
  /// exp2(s * softmax_scale_log2 - m). Without softcap: score_scale = 1, softmax_scale_log2 = scale * log2(e).
  /// With softcap c: score_scale = scale / c and softmax_scale_log2 = c * log2(e).
  float score_scale = 1.f;
  float softmax_scale_log2 = 1.f;
  bool softcap = false;
  /// Algorithm::v1_order only: float32 workspaces holding the unnormalized O [batch*heads*seqlen_q_rounded, head_dim
  /// rounded] and (m, l) [batch*heads*seqlen_q_rounded, 2] between K/V steps (FA1 loop order keeps them in HBM).
  float* v1_o = nullptr;
  float* v1_ml = nullptr;
  int32_t v1_rows = 0;  ///< seqlen_q rounded up to the v1 query block
  /// Rare-path trigger (common/nonfinite_fixup.cuh): a kernel whose epilogue sees a non-finite value in an output it
  /// writes sets *nonfinite_flag = 1; the fix-up kernel launched after it on the same stream exits at once while the
  /// flag is 0. Null where the launcher does not track it (kernels that recompute such rows themselves).
  int32_t* nonfinite_flag = nullptr;
  /// The forward's trigger (kernel/fwd_kernel.cuh, launch_fwd): a kernel without the in-kernel rare path raises
  /// *nonfinite_epoch to at least nonfinite_gen (atomicMax) when its epilogue sees a non-finite value; the fix-up kernel
  /// after it exits at once while *nonfinite_epoch < nonfinite_gen. The slot persists per device (no per-call
  /// allocation or memset; util.hpp nonfinite_epoch), the generation grows per call.
  unsigned long long* nonfinite_epoch = nullptr;
  unsigned long long nonfinite_gen = 0;
  /// FP8 (float8_e4m3fn q/k/v) forward only: per (batch, kv head) dequantization scales; the scores are
  /// (q8 . k8) * q_descale * k_descale and out = (P v8) * v_descale / l.
  DescaleView q_descale, k_descale, v_descale;
};

/// Backward: forward fields + gradients and workspace.
struct BwdParams : FwdParams {
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  TensorStrides dout_s, dq_s, dk_s, dv_s;
  float* dq_accum = nullptr;   ///< [total_q rows, num_heads, head_dim_rounded] float32 (zeroed by preprocess)
  float* dk_accum = nullptr;   ///< GQA only: [total_k rows, num_heads, head_dim_rounded] float32 (per query head)
  float* dv_accum = nullptr;
  float* dsum = nullptr;       ///< [num_heads, total_q rows]: D = rowsum(dout * out)
  float* lse_log2 = nullptr;   ///< [num_heads, total_q rows]: lse * log2(e), +inf for fully masked rows
  int32_t* dq_semaphore = nullptr;  ///< deterministic mode: [batch, num_heads, num_m_blocks] turn counters
  int32_t head_dim_rounded = 0;
  int32_t num_m_blocks = 0;
  bool deterministic = false;
};

/// What a launcher ran, for the path report (core::record_path): the tile configuration (kBlockM x kBlockN, warps),
/// whether it is the small-shared-memory fallback of its table entry (common/tile_size.hpp) and the tile schedule.
struct LaunchInfo {
  int block_m = 0, block_n = 0, warps = 0;
  bool small_smem = false;
  const char* schedule = nullptr;  ///< tile schedule when it is not one tile per CTA ("persistent"), else nullptr
};

}  // namespace flashkv::cuda

// Split-KV decode parameters: src/cuda/decode_params.hpp (owned by the KV-cache / decode code).
#include "cuda/decode_params.hpp"
