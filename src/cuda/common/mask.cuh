// Score transforms of a fragment, shared by both kernel families: softcap (Gemma 2: s = c * tanh(s / c), with the
// factor c folded into softmax_scale_log2, see params.hpp) and the element mask of a boundary tile from the one mask
// rule (core::MaskRule). A masked score is a select to -inf, never arithmetic on it, so a non-finite score of a masked
// key never reaches the row (docs/design.md, "Non-finite inputs").
#pragma once

#include <cmath>

#include "core/mask.hpp"
#include "cuda/common/frag.cuh"
#include "cuda/common/ptx.cuh"

namespace flashkv::cuda::attn {

template <int kMT, int kNT>
__device__ __forceinline__ void apply_softcap(Frag<kMT, kNT> s, float score_scale) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int e = 0; e < 2; ++e) s(mt, nt, hh, e) = tanh_approx(s(mt, nt, hh, e) * score_scale);
}

/// Boundary tile of keys [n0, n0 + 8*kNT): s = -inf where row i does not see key j. The thread's rows are
/// i = m_row + 16*mt + g + 8*hh (m_row: the warp's first query row in the sequence); its keys n0 + 8*nt + 2*t + e.
template <int kMT, int kNT>
__device__ __forceinline__ void apply_mask(Frag<kMT, kNT> s, const core::MaskRule& rule, int m_row, int n0, int g,
                                           int t) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      // Row i sees keys [row_first(i), row_last(i)) (already clipped to [0, seqlen_k]).
      const int i = m_row + mt * 16 + g + 8 * hh;
      const int lo = static_cast<int>(rule.row_first(i)) - n0 - 2 * t;
      const int hi = static_cast<int>(rule.row_last(i)) - n0 - 2 * t;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int jj = nt * 8 + e;  // key offset relative to n0 + 2t
          if (jj < lo || jj >= hi) s(mt, nt, hh, e) = -INFINITY;
        }
    }
}

}  // namespace flashkv::cuda::attn
