// Turns a raw Q·Kᵀ tile into attention scores: score = softcap·tanh(s·scale/softcap) (or s·scale), then −inf where
// the mask rule (src/core/mask.hpp) hides the key. Shared by every CPU variant, forward and backward, so that all of
// them see bit-identical scores.
#pragma once

#include <cstdint>

#include "core/mask.hpp"
#include "cpu/tile_math.hpp"

namespace flashkv::cpu {

/// s is [rows][kBlockN]; only the first kc columns are valid. Row i is query q0 + i, column j is key k0 + j.
/// When `full` (the tile is entirely visible, MaskRule::tile_fully_visible) the element-wise mask is skipped.
FLASHKV_ALWAYS_INLINE void finish_scores(float* __restrict s, int rows, int kc, int64_t q0, int64_t k0,
                                         const core::MaskRule& mask, bool full, float scale, float softcap) {
  for (int i = 0; i < rows; ++i) {
    float* srow = s + static_cast<int64_t>(i) * kBlockN;
    if (softcap > 0.0f) {
      for (int j = 0; j < kc; ++j) srow[j] = transform_score(srow[j], scale, softcap);
    } else {
      for (int j = 0; j < kc; ++j) srow[j] *= scale;
    }
    if (!full) {
      const int64_t first = mask.row_first(q0 + i) - k0;
      const int64_t last = mask.row_last(q0 + i) - k0;
      for (int j = 0; j < kc; ++j) srow[j] = (j < first || j >= last) ? kNegInf : srow[j];
    }
  }
}

}  // namespace flashkv::cpu
