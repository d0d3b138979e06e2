// The attention mask rule, in one place, for CPU and GPU code (header-only, host + device).
//
// Query position i and key position j are 0-based within their own sequence; shift = seqlen_k − seqlen_q
// (bottom-right alignment, as flash-attn >= 2.1):
//   visible(i, j) = (window_size_left  < 0 || j >= i + shift − window_size_left)
//                && (window_size_right < 0 || j <= i + shift + window_size_right)
// causal == window_size_right = 0. Row i therefore sees exactly the keys [row_first(i), row_last(i)) clipped to
// [0, seqlen_k); the set is contiguous, which is what lets tiled kernels skip whole K/V tiles (FlashAttention-2 §3.1,
// "causal block skipping") and mask only boundary tiles element-wise.
//
// All arithmetic is int64 so that window sizes up to INT32_MAX and long sequences cannot overflow.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FLASHKV_HD __host__ __device__ __forceinline__
#else
#define FLASHKV_HD inline
#endif

namespace flashkv::core {

struct MaskRule {
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t window_size_left = -1;   ///< −1 = unbounded
  int64_t window_size_right = -1;  ///< −1 = unbounded (causal: 0)

  FLASHKV_HD int64_t shift() const { return seqlen_k - seqlen_q; }

  /// True when query i may attend to key j (the definition above; no clipping to [0, seqlen_k)).
  FLASHKV_HD bool visible(int64_t i, int64_t j) const {
    const int64_t c = i + shift();
    return (window_size_left < 0 || j >= c - window_size_left) && (window_size_right < 0 || j <= c + window_size_right);
  }

  /// First visible key of query row i, clipped to [0, seqlen_k].
  FLASHKV_HD int64_t row_first(int64_t i) const {
    if (window_size_left < 0) return 0;
    const int64_t f = i + shift() - window_size_left;
    return f < 0 ? 0 : (f > seqlen_k ? seqlen_k : f);
  }
  /// One past the last visible key of query row i, clipped to [0, seqlen_k].
  FLASHKV_HD int64_t row_last(int64_t i) const {
    if (window_size_right < 0) return seqlen_k;
    const int64_t l = i + shift() + window_size_right + 1;
    return l < 0 ? 0 : (l > seqlen_k ? seqlen_k : l);
  }

  /// Keys [first, last) that at least one row of the query block [q0, q1) can see (empty when last <= first).
  /// Because row_first/row_last are non-decreasing in i, the union is [row_first(q0), row_last(q1 − 1)).
  FLASHKV_HD void block_key_range(int64_t q0, int64_t q1, int64_t* first, int64_t* last) const {
    if (q1 <= q0) {
      *first = 0;
      *last = 0;
      return;
    }
    *first = row_first(q0);
    *last = row_last(q1 - 1);
  }

  /// True when EVERY (i, j) with i in [q0, q1), j in [k0, k1) is visible, i.e. the tile needs no element-wise mask.
  /// (Worst cases: the last row against the first key for the left edge, the first row against the last key for the
  /// right edge.) Callers guarantee k1 <= seqlen_k.
  FLASHKV_HD bool tile_fully_visible(int64_t q0, int64_t q1, int64_t k0, int64_t k1) const {
    if (q1 <= q0 || k1 <= k0) return true;
    const bool left_ok = window_size_left < 0 || k0 >= (q1 - 1) + shift() - window_size_left;
    const bool right_ok = window_size_right < 0 || (k1 - 1) <= q0 + shift() + window_size_right;
    return left_ok && right_ok;
  }

  /// Queries [first, last) that at least one key of the key block [k0, k1) is visible to (used by backward passes
  /// that loop over K/V blocks outside). Inverse of the row rule: key j is seen by rows i with
  /// j − shift − window_size_right <= i <= j − shift + window_size_left.
  FLASHKV_HD void block_query_range(int64_t k0, int64_t k1, int64_t* first, int64_t* last) const {
    if (k1 <= k0) {
      *first = 0;
      *last = 0;
      return;
    }
    int64_t f = window_size_right < 0 ? 0 : k0 - shift() - window_size_right;
    int64_t l = window_size_left < 0 ? seqlen_q : (k1 - 1) - shift() + window_size_left + 1;
    f = f < 0 ? 0 : (f > seqlen_q ? seqlen_q : f);
    l = l < 0 ? 0 : (l > seqlen_q ? seqlen_q : l);
    *first = f;
    *last = l;
  }
};

}  // namespace flashkv::core
