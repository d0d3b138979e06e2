// The ONE merge of partial softmax states (split-KV / flash-decoding; Dao, Haziza, Massa, Sizov 2023; FlashAttention-3
// split-KV combine), for the host and the device: the CPU KV attention (src/kvcache/attention/run.cpp) merges its
// per-split (m, l, acc) and the CUDA split combine (src/cuda/common/decode_combine.cuh) its per-split normalized
// (o_s, lse_s) — the latter is the (m = lse_s, l = 1, acc = o_s) instance — with these functions.
//
// For one query row with partial states s (running max m_s in natural-log units, sum l_s = Σ exp(score − m_s), and
// accumulator acc_s = Σ exp(score − m_s)·v):
//   M   = max_s m_s                                  NaN-propagating: any NaN m_s makes M NaN
//   w_s = 0 if m_s = −inf (the split saw no key: selected, never 0·value), else exp(m_s − M)
//   L   = Σ_s w_s·l_s,   out = (Σ_s w_s·acc_s) / L,   lse = M + log L
// Empty rows: L = 0 gives out = 0 and lse = −inf when the row has no visible key, and out = lse = NaN when it has
// visible keys whose scores were all −inf (exp(−inf − (−inf)) = NaN, the IEEE definition; /work notes: "only −inf
// means empty"). A NaN score (or +inf: exp(inf − inf)) anywhere in the row makes m_s, l_s or acc_s NaN and so out and
// lse NaN; a NaN in one value channel stays in that channel.
#pragma once

#include <cmath>

#include "core/host_device.hpp"

namespace flashkv::core {

/// max(a, b) that returns NaN when either is NaN (fmaxf drops NaN).
FLASHKV_HD float merge_max(float a, float b) { return (a != a || b != b) ? a + b : (a > b ? a : b); }

/// Weight of a partial state with max m_s in the merge with global max M.
FLASHKV_HD float merge_weight(float m_s, float M) {
#if defined(__CUDA_ARCH__)
  return m_s == -INFINITY ? 0.0f : __expf(m_s - M);
#else
  return m_s == -INFINITY ? 0.0f : std::exp(m_s - M);
#endif
}

/// acc + w·x, with w = 0 selected (an empty split's values are never multiplied).
FLASHKV_HD float merge_accumulate(float acc, float w, float x) { return w == 0.0f ? acc : acc + w * x; }

/// 1 / L for the output (0 for an empty row, NaN for a row whose visible scores were all −inf).
FLASHKV_HD float merged_inv_sum(float L, bool has_keys) {
  return L == 0.0f ? (has_keys ? NAN : 0.0f) : 1.0f / L;
}

/// lse = M + log L (−inf for an empty row, NaN for a row whose visible scores were all −inf; NaN propagates).
FLASHKV_HD float merged_lse(float M, float L, bool has_keys) {
#if defined(__CUDA_ARCH__)
  return L == 0.0f ? (has_keys ? NAN : -INFINITY) : M + logf(L);
#else
  return L == 0.0f ? (has_keys ? NAN : -INFINITY) : M + std::log(L);
#endif
}

}  // namespace flashkv::core
