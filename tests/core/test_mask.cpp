// src/core/mask.hpp against a brute-force evaluation of the definition in include/flashkv/attention.hpp.
#include <gtest/gtest.h>

#include <random>

#include "common/reference.hpp"
#include "core/mask.hpp"

using flashkv::core::MaskRule;

namespace {

bool definition(int64_t i, int64_t j, int64_t sq, int64_t sk, int64_t wl, int64_t wr) {
  const int64_t shift = sk - sq;
  return (wl < 0 || j >= i + shift - wl) && (wr < 0 || j <= i + shift + wr);
}

TEST(Mask, RowRangesBlockRangesAndFullTilesMatchTheDefinition) {
  std::mt19937_64 rng = flashkv::testing::make_rng(0x6001);
  std::uniform_int_distribution<int64_t> len(0, 90), win(-1, 40), blk(1, 17);
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t sq = len(rng), sk = len(rng), wl = win(rng), wr = win(rng);
    const MaskRule m{sq, sk, wl, wr};
    for (int64_t i = 0; i < sq; ++i) {
      int64_t first = sk, last = 0;
      for (int64_t j = 0; j < sk; ++j) {
        ASSERT_EQ(m.visible(i, j), definition(i, j, sq, sk, wl, wr));
        if (definition(i, j, sq, sk, wl, wr)) {
          first = std::min(first, j);
          last = j + 1;
        }
      }
      if (first < last) {  // visible keys are exactly [row_first, row_last)
        EXPECT_EQ(m.row_first(i), first);
        EXPECT_EQ(m.row_last(i), last);
      } else {
        EXPECT_LE(m.row_last(i), m.row_first(i));
      }
    }
    const int64_t bm = blk(rng), bn = blk(rng);
    for (int64_t q0 = 0; q0 < sq; q0 += bm) {
      const int64_t q1 = std::min(sq, q0 + bm);
      int64_t kf = 0, kl = 0;
      m.block_key_range(q0, q1, &kf, &kl);
      for (int64_t i = q0; i < q1; ++i) {
        for (int64_t j = 0; j < sk; ++j) {
          if (definition(i, j, sq, sk, wl, wr)) {
            EXPECT_TRUE(j >= kf && j < kl) << "key outside block range";
          }
        }
      }
      for (int64_t k0 = 0; k0 < sk; k0 += bn) {
        const int64_t k1 = std::min(sk, k0 + bn);
        bool all = true;
        for (int64_t i = q0; i < q1; ++i)
          for (int64_t j = k0; j < k1; ++j) all = all && definition(i, j, sq, sk, wl, wr);
        EXPECT_EQ(m.tile_fully_visible(q0, q1, k0, k1), all);
      }
    }
    for (int64_t k0 = 0; k0 < sk; k0 += bn) {
      const int64_t k1 = std::min(sk, k0 + bn);
      int64_t qf = 0, ql = 0;
      m.block_query_range(k0, k1, &qf, &ql);
      for (int64_t i = 0; i < sq; ++i) {
        for (int64_t j = k0; j < k1; ++j) {
          if (definition(i, j, sq, sk, wl, wr)) {
            EXPECT_TRUE(i >= qf && i < ql) << "query outside block range";
          }
        }
      }
    }
  }
}

TEST(Mask, HugeWindowsDoNotOverflow) {
  const MaskRule m{5, 7, 2147483647, 2147483647};
  EXPECT_EQ(m.row_first(0), 0);
  EXPECT_EQ(m.row_last(4), 7);
  EXPECT_TRUE(m.tile_fully_visible(0, 5, 0, 7));
}

}  // namespace
