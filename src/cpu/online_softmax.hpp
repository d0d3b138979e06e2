// The per-row online-softmax update used by the CPU tiled kernels (and callable step by step, e.g. by
// `flashkv explain online-softmax`).
//
// Source: Milakov & Gimelshein 2018 ("Online normalizer calculation for softmax"); FlashAttention (Dao et al. 2022)
// Alg. 1 lines 9–12; FlashAttention-2 (Dao 2023) §3.1.1 — the unnormalized form: O is NOT divided by l inside the loop,
// only rescaled by exp(m_old − m_new), and divided once at the end.
//
// For one query row with running state (m, l, O[0..dv)) and a new K/V tile with (already scaled, softcapped and
// masked) scores s[0..n) and value rows V[0..n)[0..dv):
//   m_new = max(m, max_j s_j)
//   alpha = exp(m − m_new)                 (0 when m = −inf; 1 when m_new = −inf, i.e. nothing visible yet)
//   p_j   = exp(s_j − m_new)               (exactly 0 for masked s_j = −inf)
//   l     = alpha·l + Σ_j p_j
//   O     = alpha·O + Σ_j p_j·V_j
// and after the last tile: out = O / l, lse = m + log(l) (natural log); a row that sees no key gets out = 0 exactly
// and lse = −inf. Masking never produces NaN: masked scores are −inf, and exp of −inf or of a difference with −inf
// gives exactly 0.
//
// Non-finite scores (include/flashkv/attention.hpp "NON-FINITE INPUTS"): the result equals the definition evaluated
// in IEEE arithmetic with a NaN-propagating max, without a NaN-propagating max in the loop. The max below ignores NaN
// (as fast as a plain max), but p_j = exp(NaN − m) is NaN, so l becomes NaN, and l stays NaN (alpha·NaN + Σp) through
// every later tile; +inf scores give m = +inf and exp(inf − inf) = NaN in l the same way. finalize() then returns
// NaN for the whole row, as the definition does (out = Σ p·v / l with l = NaN; lse = m + log l). The only place a
// NaN could be lost is the "nothing visible so far" shortcut (m_new = −inf), which therefore checks for NaN; and a
// row whose visible scores are all −inf ends with l = 0 — told apart from a row without keys by the caller's
// `has_keys` (the mask geometry), it is NaN too (exp(−inf − (−inf)) = NaN).
#pragma once

#include <cmath>
#include <limits>

#include "cpu/tile_math.hpp"

namespace flashkv::cpu {

/// Running statistics of one query row. Initial state: m = −inf, l = 0 (and the caller's O row = 0).
struct OnlineSoftmaxRow {
  float m = kNegInf;  ///< running max of the scores seen so far (natural-log domain)
  float l = 0.0f;     ///< running Σ exp(s − m)
};

/// First half of a step: updates st.m and st.l for the scores s[0..n) and overwrites s with p_j = exp(s_j − m_new).
/// Returns alpha = exp(m_old − m_new), the factor the caller must apply to its O row before adding p·V.
FLASHKV_ALWAYS_INLINE float online_softmax_scores_to_p(OnlineSoftmaxRow& st, float* __restrict s, int n) {
  // `omp simd reduction`: lets the compiler vectorize the max / sum reductions without -ffast-math (the summation
  // order is then fixed by the vector width of the clone — deterministic for a given machine).
  float tile_max = kNegInf;
#pragma omp simd reduction(max : tile_max)
  for (int j = 0; j < n; ++j) tile_max = s[j] > tile_max ? s[j] : tile_max;
  const float m_new = tile_max > st.m ? tile_max : st.m;
  if (m_new == kNegInf) {  // nothing but −inf (masked) or NaN scores so far: p = 0, state unchanged ...
    int nan = 0;  // an integer OR, so the loop vectorizes like the plain zero fill it replaces
#pragma omp simd reduction(| : nan)
    for (int j = 0; j < n; ++j) {
      nan |= s[j] != s[j] ? 1 : 0;
      s[j] = 0.0f;
    }
    if (nan == 0) return 1.0f;
    st.l = std::numeric_limits<float>::quiet_NaN();  // ... unless one was NaN: poison l, and O through alpha = NaN
    return st.l;
  }
  const float alpha = exp_flush(st.m - m_new);  // st.m = −inf -> 0
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < n; ++j) {
    const float pj = exp_flush(s[j] - m_new);
    s[j] = pj;
    sum += pj;
  }
  st.m = m_new;
  st.l = alpha * st.l + sum;
  return alpha;
}

/// A whole step for one row: scores s[0..n) (overwritten with p), value rows v[j*dv + c], accumulator o[0..dv).
/// Returns alpha (the rescale factor applied to o and l).
FLASHKV_ALWAYS_INLINE float online_softmax_update(OnlineSoftmaxRow& st, float* __restrict s, int n,
                                                  const float* __restrict v, int dv, float* __restrict o) {
  const float alpha = online_softmax_scores_to_p(st, s, n);
  if (alpha != 1.0f) {
    for (int c = 0; c < dv; ++c) o[c] *= alpha;
  }
  pv_row(s, n, v, dv, o);
  return alpha;
}

/// Final division: out[c] = o[c] / l and returns lse = m + log(l). `has_keys` = the row sees at least one key (from
/// the mask, not from l): without keys out = 0 and lse = −inf; with keys but l NaN or 0 (a NaN or +inf score, or
/// every visible score −inf) out and lse are NaN.
FLASHKV_ALWAYS_INLINE float online_softmax_finalize(const OnlineSoftmaxRow& st, const float* __restrict o, int dv,
                                                    float* __restrict out, bool has_keys) {
  if (!has_keys) {
    for (int c = 0; c < dv; ++c) out[c] = 0.0f;
    return kNegInf;
  }
  if (!(st.l > 0.0f)) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int c = 0; c < dv; ++c) out[c] = nan;
    return nan;
  }
  const float inv = 1.0f / st.l;
  for (int c = 0; c < dv; ++c) out[c] = o[c] * inv;
  return st.m + std::log(st.l);
}

}  // namespace flashkv::cpu
