// core::FastDivmod (the device appends' row decomposition) against the compiler's `/` and `%`: every divisor up to
// 4096 and the powers of two and their neighbours up to 2^30 at the dividends where a rounding error would show first
// (multiples of d and their neighbours, the top of the 31-bit range), plus random dividends (seed printed).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <vector>

#include "core/fast_divmod.hpp"

namespace {

void check_divisor(uint32_t d, std::mt19937_64& g) {
  const flashkv::core::FastDivmod f(d);
  std::vector<uint32_t> ns = {0, 1, 2, d - 1, d, d + 1, 2 * d - 1, 2 * d, 0x7fffffffu, 0x7ffffffeu, 0x40000000u};
  const uint32_t top = 0x7fffffffu / d;  // multiples of d near the top, where m's error is largest
  for (uint32_t k : {top, top - 1, top / 2, top / 3})
    for (int64_t delta = -1; delta <= 1; ++delta) {
      const int64_t n = static_cast<int64_t>(k) * d + delta;
      if (n >= 0 && n <= 0x7fffffff) ns.push_back(static_cast<uint32_t>(n));
    }
  std::uniform_int_distribution<uint32_t> any(0, 0x7fffffffu);
  for (int i = 0; i < 64; ++i) ns.push_back(any(g));
  for (uint32_t n : ns) {
    if (n > 0x7fffffffu) continue;
    uint32_t q = 0, r = 0;
    f.divmod(n, q, r);
    ASSERT_EQ(q, n / d) << "n " << n << " d " << d;
    ASSERT_EQ(r, n % d) << "n " << n << " d " << d;
  }
}

TEST(FastDivmod, EqualsIntegerDivision) {
  const uint64_t seed = std::random_device{}();
  std::printf("[fast_divmod] seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 g(seed);
  for (uint32_t d = 1; d <= 4096; ++d) check_divisor(d, g);
  for (uint32_t s = 12; s <= 30; ++s)
    for (int64_t delta = -3; delta <= 3; ++delta) check_divisor(static_cast<uint32_t>((int64_t{1} << s) + delta), g);
  std::uniform_int_distribution<uint32_t> big(1, 0x7fffffffu);
  for (int i = 0; i < 2000; ++i) check_divisor(big(g), g);
}

TEST(FastDivmod, DivisorsOutsideTheRangeAreRefused) {
  EXPECT_THROW(flashkv::core::FastDivmod(0u), std::invalid_argument);
  EXPECT_THROW(flashkv::core::FastDivmod((1u << 31) + 1), std::invalid_argument);
  const flashkv::core::FastDivmod top(1u << 31);
  EXPECT_EQ(top.div(0x7fffffffu), 0u);
}

TEST(FastDivmod, EveryDividendForSmallDivisors) {
  for (uint32_t d : {1u, 2u, 3u, 7u, 8u, 24u, 37u, 255u}) {
    const flashkv::core::FastDivmod f(d);
    for (uint32_t n = 0; n < (1u << 22); ++n) ASSERT_EQ(f.div(n), n / d) << "n " << n << " d " << d;
  }
}

}  // namespace
