// The CUDA decode's num_splits heuristic (src/cuda/decode_splits.hpp, host only): the H200-measured choices of
// bench/results/h200-2026-12-02-run9 and -run10 (32 q / 8 kv heads, 132 SMs; bf16 pages 2 CTAs per SM, packed 3), its edge
// cases, and the invariants every choice keeps (1 <= splits <= key blocks, no split without key blocks, <= 128).
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/decode_splits.hpp"

namespace {

using flashkv::cuda::decode_num_splits;

TEST(DecodeSplits, MeasuredChoicesOnTheH200) {
  constexpr int64_t kSms = 132, kHk = 8;
  struct Want16 {
    int64_t batch;
    int32_t at4k, at32k, at128k;
  };
  // 16-bit pages: one CTA per SM up to batch 4 (batch 1: 16 splits, batch 4: 4); from batch 5 the run10 call 1 fit
  // (batch 12: 2 at 4k-8k, the 8k and 32k sweep's best within 2%; batch 16 unsplit at 4k / 8k, one wave over every SM;
  // batch 40: 3-4, 23% faster than unsplit; 48: 2, 8-11%)
  const Want16 want16[] = {{1, 16, 16, 16}, {2, 8, 8, 8},  {4, 4, 4, 4},  {6, 5, 5, 11}, {8, 4, 4, 4},
                           {12, 2, 8, 8},   {16, 1, 2, 2}, {24, 1, 4, 4}, {32, 1, 1, 1}, {40, 2, 4, 4},
                           {48, 2, 2, 2},   {64, 1, 1, 1}, {128, 1, 1, 1}};
  for (const Want16& w : want16) {
    SCOPED_TRACE("batch " + std::to_string(w.batch));
    EXPECT_EQ(decode_num_splits(w.batch * kHk, 4096 / 64, kSms, 2, true), w.at4k);
    EXPECT_EQ(decode_num_splits(w.batch * kHk, 32768 / 64, kSms, 2, true), w.at32k);
    EXPECT_EQ(decode_num_splits(w.batch * kHk, 131072 / 64, kSms, 2, true), w.at128k);
  }
  for (int64_t ctx : {4096, 32768, 131072}) {
    const int64_t kb = ctx / 64;
    SCOPED_TRACE("context " + std::to_string(ctx));
    // packed pages: ~2 CTAs per SM at batch 1 / 4, the occupancy from batch 16 on (batch 64: 3 splits, 13-28% faster
    // at 32k than unsplit, run9 call 2)
    const int32_t b1 = decode_num_splits(1 * kHk, kb, kSms, 3, false);
    EXPECT_TRUE(b1 == 32 || b1 == 33) << b1;
    EXPECT_EQ(decode_num_splits(4 * kHk, kb, kSms, 3, false), 8);
    EXPECT_EQ(decode_num_splits(16 * kHk, kb, kSms, 3, false), 3);
    EXPECT_EQ(decode_num_splits(64 * kHk, kb, kSms, 3, false), 3);
  }
}

TEST(DecodeSplits, EdgeCases) {
  EXPECT_EQ(decode_num_splits(0, 1000, 132, 2, true), 1);  // nothing to run (e.g. an append-only plan)
  EXPECT_EQ(decode_num_splits(8, 1, 132, 2, true), 1);
  EXPECT_EQ(decode_num_splits(8, 4, 132, 3, false), 1);   // <= 4 key blocks: never split
  EXPECT_EQ(decode_num_splits(8, 5, 132, 3, false), 5);   // at most one split per key block
  const int32_t capped = decode_num_splits(1, 100000, 132, 2, true);  // the cap (the model: within 2% of 128)
  EXPECT_GE(capped, 120);
  EXPECT_LE(capped, 128);
  EXPECT_EQ(decode_num_splits(1 << 20, 512, 132, 3, false), 1);  // a batch of many waves
  EXPECT_EQ(decode_num_splits(8, 512, 0, 2, true), 1);    // no SM count: no split
  EXPECT_EQ(decode_num_splits(8, 512, 20, 0, false), decode_num_splits(8, 512, 20, 1, false));  // occupancy >= 1
}

TEST(DecodeSplits, EveryChoiceGivesEverySplitKeyBlocks) {
  for (bool p16 : {true, false})
    for (int64_t sms : {20, 108, 132})
      for (int64_t ctas = 1; ctas <= 1200; ctas += 7)
        for (int64_t kb = 1; kb <= 2100; kb += 37) {
          const int64_t s = decode_num_splits(ctas, kb, sms, p16 ? 2 : 3, p16);
          ASSERT_GE(s, 1);
          ASSERT_LE(s, std::min<int64_t>(128, kb));
          const int64_t per_split = (kb + s - 1) / s;  // the kernel's share (decode_kernel.cuh)
          ASSERT_LT((s - 1) * per_split, kb) << "split " << s - 1 << " of " << s << " gets no key block (" << kb
                                             << " blocks, " << ctas << " CTAs, " << sms << " SMs)";
        }
}

}  // namespace
