// The CUDA split-KV decode's num_splits heuristic (host only, header-only so that the CPU tests check it:
// tests/kvcache/test_kv_decode_splits.cpp). After FlashAttention-3's heuristics.h, retuned on the H200
// (bench/results/h200-2026-12-02-run9, calls 1-2: num_splits swept at batch 1 / 4 / 16 / 64; checked at 2-64 in calls 5-6).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace flashkv::cuda {

/// Split count for `ctas` = batch x kv heads x 16-row query tiles CTAs over `num_key_blocks` 64-key blocks (the
/// longest sequence's), on `num_sms` SMs that hold `ctas_per_sm` CTAs of the kernel (its occupancy); `pages16`: 16-bit
/// pages (else packed ones). Rules, each from the H200 sweeps:
///   - 1 for <= 4 key blocks or ctas <= 0; 1 for 16-bit pages once ctas >= num_sms (one CTA per SM already streams
///     an SM's share of HBM: batch 16 x 8 kv heads ran fastest unsplit, 76 vs 80 us with 2 splits at 4k; batch 24 /
///     32 / 64 unsplit: 0.98-1.03x cuDNN; batch 48 unsplit is 8% slower than with 2 splits, which this rule misses);
///   - else the S in 1..min(128, key blocks, slots) that minimizes the modeled time
///       waves(S) x (key blocks / S + 4),   waves(S) = ceil(ctas x S / slots)
///     (each wave of CTAs streams its key range; 4 blocks' worth of fixed cost per CTA: prologue, merge), the
///     smallest S within 2% of the minimum; slots = num_sms x (1 for 16-bit pages; packed: ctas_per_sm, at most 2
///     while 2 x ctas <= num_sms — at batch 1 a third CTA per SM gained less than the merge of more splits cost);
///   - then lowered to the number of splits that get key blocks (the kernel gives each ceil(blocks / splits)).
inline int32_t decode_num_splits(int64_t ctas, int64_t num_key_blocks, int64_t num_sms, int64_t ctas_per_sm,
                                 bool pages16) {
  if (num_key_blocks <= 4 || ctas <= 0 || num_sms <= 0) return 1;
  if (pages16 && ctas >= num_sms) return 1;
  const int64_t occ = std::max<int64_t>(1, ctas_per_sm);
  const int64_t per_sm = pages16 ? 1 : (2 * ctas <= num_sms ? std::min<int64_t>(2, occ) : occ);
  const int64_t slots = num_sms * per_sm;
  const int64_t max_splits = std::min<int64_t>({128, num_key_blocks, slots});
  auto cost = [&](int64_t s) {
    const double waves = std::ceil(static_cast<double>(ctas * s) / static_cast<double>(slots));
    return waves * (static_cast<double>(num_key_blocks) / static_cast<double>(s) + 4.0);
  };
  double best = cost(1);
  for (int64_t s = 2; s <= max_splits; ++s) best = std::min(best, cost(s));
  int64_t chosen = 1;
  for (int64_t s = 1; s <= max_splits; ++s) {
    if (cost(s) <= 1.02 * best) {
      chosen = s;
      break;
    }
  }
  const int64_t per_split = (num_key_blocks + chosen - 1) / chosen;
  return static_cast<int32_t>((num_key_blocks + per_split - 1) / per_split);
}

}  // namespace flashkv::cuda
