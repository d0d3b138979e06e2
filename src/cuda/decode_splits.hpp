// The CUDA split-KV decode's num_splits heuristic (host only, header-only so that the CPU tests check it:
// tests/kvcache/test_kv_decode_splits.cpp). After FlashAttention-3's heuristics.h, retuned on the H200
// (bench/results/h200-2026-12-02-run9, calls 1-2: num_splits swept at batch 1 / 4 / 16 / 64; checked at 2-64 in calls 5-6;
// the 16-bit pages' rule from batch 5 on refitted to bench/results/h200-2026-12-02-run10 call 1's sweep).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace flashkv::cuda {

/// Split count for `ctas` = batch x kv heads x 16-row query tiles CTAs over `num_key_blocks` 64-key blocks (the
/// longest sequence's), on `num_sms` SMs that hold `ctas_per_sm` CTAs of the kernel (its occupancy); `pages16`: 16-bit
/// pages (else packed ones). Rules, each from the H200 sweeps:
///   - 1 for <= 4 key blocks or ctas <= 0;
///   - packed pages, and 16-bit pages at 4 x ctas <= num_sms (batch <= 4 at 8 kv heads): the S in 1..min(128, key
///     blocks, slots) that minimizes the modeled time
///       waves(S) x (key blocks / S + 4),   waves(S) = ceil(ctas x S / slots)
///     (each wave of CTAs streams its key range; 4 blocks' worth of fixed cost per CTA: prologue, merge), the smallest
///     S within 2% of the minimum; slots = num_sms x (1 for 16-bit pages — one CTA per SM streams an SM's share of HBM
///     at batch 1: 16 splits at 8 kv heads —; packed: ctas_per_sm, at most 2 while 2 x ctas <= num_sms);
///   - 16-bit pages from 4 x ctas > num_sms: slots = num_sms x min(2, ctas_per_sm) and the cost
///       waves(S) x (ceil(key blocks / S) + 8) + S / 4
///     (8 blocks of fixed cost per CTA, the last CTA's merge of S partials), the smallest S within 2% of the minimum:
///     fitted to the bf16 sweep of run10 call 1 (batch 2-64 x splits 1-8 x 8k / 32k, 132 SMs, 2 CTAs per SM) together
///     with run9 call 1 (batch 1): a wave that leaves SMs idle costs a whole wave, so batch 40 (320 CTAs = 1.2 waves)
///     takes 3-4 splits (23% faster than unsplit) and batch 48 2 (8-11%); in-sample loss vs the best measured split
///     count 0.5% on average, at most 3.8% (the rule before: 3.2%, at most 23%); out of sample (run10 call 2, 16k
///     tokens, batch 3-60): within 4.2% of the best, 1.2% on average (the rule before: up to 32% slower, batch 36);
///     except one wave that covers >= 90% of the SMs over <= 128 key blocks, which stays unsplit;
///   - then lowered to the number of splits that get key blocks (the kernel gives each ceil(blocks / splits)).
inline int32_t decode_num_splits(int64_t ctas, int64_t num_key_blocks, int64_t num_sms, int64_t ctas_per_sm,
                                 bool pages16) {
  if (num_key_blocks <= 4 || ctas <= 0 || num_sms <= 0) return 1;
  const int64_t occ = std::max<int64_t>(1, ctas_per_sm);
  const bool wide16 = pages16 && 4 * ctas > num_sms;
  int64_t slots = 0, max_splits = 0;
  if (wide16) {
    slots = num_sms * std::min<int64_t>(2, occ);
    // one wave that already covers (nearly) every SM, over <= 128 key blocks (8k tokens): unsplit (batch 16 at 4k /
    // 8k: 4-6% faster than the 2 splits the cost below prefers; from 16k on splitting pays, run10 calls 1-2)
    if (10 * ctas >= 9 * num_sms && ctas <= slots && num_key_blocks <= 128) return 1;
    max_splits = std::min<int64_t>(128, num_key_blocks);
  } else {
    const int64_t per_sm = pages16 ? 1 : (2 * ctas <= num_sms ? std::min<int64_t>(2, occ) : occ);
    slots = num_sms * per_sm;
    max_splits = std::min<int64_t>({128, num_key_blocks, slots});
  }
  auto cost = [&](int64_t s) {
    const double waves = std::ceil(static_cast<double>(ctas * s) / static_cast<double>(slots));
    if (wide16) {
      const double per = static_cast<double>((num_key_blocks + s - 1) / s);
      return waves * (per + 8.0) + static_cast<double>(s) / 4.0;
    }
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
