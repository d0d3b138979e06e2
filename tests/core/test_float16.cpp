// float16 / bfloat16 conversions (src/core/float16.hpp): exhaustive round trips and IEEE round-to-nearest-even.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/float16.hpp"

using namespace flashkv;

namespace {

TEST(Float16, EveryBitPatternRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_float(static_cast<uint16_t>(h));
    const bool nan = ((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff) != 0;
    if (nan) {
      EXPECT_TRUE(std::isnan(f)) << h;
      EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(f)))) << h;
    } else {
      EXPECT_EQ(float_to_fp16(f), h) << h;
    }
  }
}

TEST(Bfloat16, EveryBitPatternRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f)))) << h;
    } else {
      EXPECT_EQ(float_to_bf16(f), h) << h;
    }
  }
}

TEST(Float16, RoundsToNearestEvenAndSaturatesToInf) {
  EXPECT_EQ(fp16_to_float(float_to_fp16(1.0f + 1.0f / 2048)), 1.0f);               // tie -> even (down)
  EXPECT_EQ(fp16_to_float(float_to_fp16(1.0f + 3.0f / 2048)), 1.0f + 2.0f / 1024);  // tie -> even (up)
  EXPECT_EQ(fp16_to_float(float_to_fp16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(fp16_to_float(float_to_fp16(65520.0f))));
  EXPECT_EQ(fp16_to_float(float_to_fp16(65519.0f)), 65504.0f);
  EXPECT_EQ(fp16_to_float(float_to_fp16(std::ldexp(1.0f, -24))), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(fp16_to_float(float_to_fp16(std::ldexp(1.0f, -26))), 0.0f);
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000);
  // bfloat16
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 1.0f / 256)), 1.0f);              // tie -> even
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3.0f / 256)), 1.0f + 1.0f / 64);  // tie -> even (up)
  EXPECT_TRUE(std::isinf(bf16_to_float(float_to_bf16(std::numeric_limits<float>::infinity()))));
  // every float maps to the nearest representable value (sampled)
  for (float x = -70000.0f; x < 70000.0f; x += 13.37f) {
    const float r = fp16_to_float(float_to_fp16(x));
    if (std::fabs(x) < 65504.0f) {
      EXPECT_LE(std::fabs(r - x), std::ldexp(std::fabs(x), -11) + 1e-7f) << x;
    }
  }
}

}  // namespace
