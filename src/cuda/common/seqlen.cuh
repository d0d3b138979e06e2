// Per-sequence bounds of one batch entry (fixed-length or varlen: FA3's SeqlenInfo) and the packed-row arithmetic of
// the float32 workspaces; shared by every CUDA kernel family.
#pragma once

#include <cstdint>

#include "cuda/params.hpp"

namespace flashkv::cuda::attn {

struct SeqInfo {
  int64_t q_row0;  ///< first row of this sequence in the (packed) q / out tensors
  int64_t k_row0;
  int seqlen_q;
  int seqlen_k;
};

__device__ __forceinline__ SeqInfo seq_info(const FwdParams& p, int b) {
  SeqInfo s;
  if (p.cu_seqlens_q != nullptr) {
    s.q_row0 = p.cu_seqlens_q[b];
    s.seqlen_q = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
    s.k_row0 = p.cu_seqlens_k[b];
    s.seqlen_k = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
  } else {
    s.q_row0 = 0;
    s.k_row0 = 0;
    s.seqlen_q = p.seqlen_q;
    s.seqlen_k = p.seqlen_k;
  }
  return s;
}

/// Global row index (into packed [rows, heads] workspaces such as dq_accum/dsum) of row i of sequence b.
__device__ __forceinline__ int64_t global_row(const FwdParams& p, const SeqInfo& s, int b, int i) {
  return p.cu_seqlens_q != nullptr ? s.q_row0 + i : static_cast<int64_t>(b) * p.seqlen_q + i;
}
__device__ __forceinline__ int64_t global_row_k(const FwdParams& p, const SeqInfo& s, int b, int j) {
  return p.cu_seqlens_k != nullptr ? s.k_row0 + j : static_cast<int64_t>(b) * p.seqlen_k + j;
}

__device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

}  // namespace flashkv::cuda::attn
