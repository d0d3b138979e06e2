// The exact rare path of the forward for rows that a non-finite input reaches (docs/design.md, "Non-finite inputs").
//
// The tiled kernels select masked scores to -inf and masked probabilities to 0, but the tensor-core GEMM P V that
// follows still multiplies a masked P = 0 with V: 0 * inf = NaN would leak a non-finite value of a key that the row
// must not see (on boundary tiles: the causal diagonal, window edges). Such a leak, like every legitimate non-finite
// result, always shows up as a non-finite element of the row's O accumulator. So the epilogue tests each row's O
// (cheap: once per row, after the mainloop), and only a flagged row (rare: non-finite inputs) is recomputed here by
// its warp straight from the definition over the visible keys J_i of the mask rule: m = max_j s_ij (NaN if any s_ij
// is NaN), p_ij = exp2(s_ij - m), out = sum_j p_ij v_j / l, lse = m + log l. Masked keys are never read. The path has
// no accumulator arrays, so it does not raise the kernel's register count; it is slow (one warp per row, two passes
// over the row's keys) and runs only on rows whose result involves a non-finite value.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common/block.cuh"
#include "cuda/params.hpp"

namespace flashkv::cuda::attn {

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

/// Row r (block-relative) of the forward block, recomputed exactly by the calling warp (all 32 lanes): out row and
/// lse. kHeadDim: the instantiation's (padded) head dim; p.head_dim columns are real. T: the type of q, k, v; TOut:
/// of out. FP8 inputs: the scores are q.k * qk_descale and out = sum_j p_j v_j * v_descale / l (1 for 16-bit inputs).
template <class T, int kHeadDim, class TOut = T>
__device__ __forceinline__ void recompute_row_exact(const FwdParams& p, const FwdBlock& blk, int r, int lane,
                                                    float qk_descale = 1.f, float v_descale = 1.f) {
  const int i = blk.m0 + r;
  if (i >= blk.si.seqlen_q) return;
  constexpr int kPer = (kHeadDim + 31) / 32;
  const T* qr = blk.q<T>(p) + r * p.q_s.row;
  const T* kb = blk.k<T>(p);
  const T* vb = blk.v<T>(p);
  float q[kPer];
#pragma unroll
  for (int c = 0; c < kPer; ++c) {
    const int col = lane + 32 * c;
    q[c] = col < p.head_dim ? static_cast<float>(qr[col]) : 0.f;
  }
  const int64_t j0 = blk.rule.row_first(i), j1 = blk.rule.row_last(i);
  // Scores in log2 units, as the kernels: x = s * softmax_scale_log2 with s = qk (or tanh(qk * score_scale)).
  auto score = [&](int64_t j) {
    const T* kr = kb + j * p.k_s.row;
    float d = 0.f;
#pragma unroll
    for (int c = 0; c < kPer; ++c) {
      const int col = lane + 32 * c;
      if (col < p.head_dim) d += q[c] * static_cast<float>(kr[col]);
    }
    d = warp_sum(d) * qk_descale;
    if (p.softcap) d = tanhf(d * p.score_scale);
    return d * p.softmax_scale_log2;
  };
  float m = -INFINITY;
  bool nan = false;
  for (int64_t j = j0; j < j1; ++j) {
    const float x = score(j);
    nan |= x != x;
    m = fmaxf(m, x);
  }
  if (nan) m = NAN;
  float l = 0.f, acc[kPer];
#pragma unroll
  for (int c = 0; c < kPer; ++c) acc[c] = 0.f;
  for (int64_t j = j0; j < j1; ++j) {
    const float pj = exp2f(score(j) - m);  // NaN for +inf - inf, -inf - -inf, NaN
    l += pj;
    const T* vr = vb + j * p.v_s.row;
#pragma unroll
    for (int c = 0; c < kPer; ++c) {
      const int col = lane + 32 * c;
      if (col < p.head_dim) acc[c] += pj * static_cast<float>(vr[col]);
    }
  }
  const bool empty = j1 <= j0;
  TOut* orow = blk.out<TOut>(p) + r * p.out_s.row;
#pragma unroll
  for (int c = 0; c < kPer; ++c) {
    const int col = lane + 32 * c;
    if (col < p.head_dim) orow[col] = static_cast<TOut>(empty ? 0.f : acc[c] * v_descale / l);
  }
  if (p.lse != nullptr && lane == 0) {
    const float lse = empty ? -INFINITY : (m == -INFINITY ? NAN : (m + log2f(l)) * 0.69314718055994531f);
    const int64_t row = (p.cu_seqlens_q != nullptr ? blk.si.q_row0 : 0) + i;
    p.lse[blk.b * p.lse_batch + blk.h * p.lse_head + row * p.lse_row] = lse;
  }
}

}  // namespace flashkv::cuda::attn
