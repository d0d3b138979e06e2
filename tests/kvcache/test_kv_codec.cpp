// KVCodec units: round trips within each format's bound, all-zero tokens, byte-exact packing checked against
// hand-computed bytes, fp8 conversion on every code, fp16 directed rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/float16.hpp"
#include "kv_test_util.hpp"
#include "kvcache/format/codec.hpp"

using namespace flashkv;
using namespace flashkv::kv;

namespace {
struct PageHead {
  std::vector<uint8_t> codes, meta;
  PageHead(const KVCodec& c, int32_t page) {
    codes.assign(static_cast<size_t>(c.bytes().code_bytes_per_token_head * page), 0xFF);
    meta.assign(static_cast<size_t>(std::max<int64_t>(c.bytes().meta_bytes_per_page_head, 1)), 0xFF);
  }
};
float f16(uint16_t h) { return fp16_to_float(h); }
}  // namespace

TEST(KVCodecFp8, EveryFiniteCodeRoundTrips) {
  for (bool e4m3 : {true, false}) {
    for (int c = 0; c < 256; ++c) {
      const float x = fp8_to_float(static_cast<uint8_t>(c), e4m3);
      if (!std::isfinite(x)) continue;
      const uint8_t back = float_to_fp8(x, e4m3);
      if (x == 0.0f) {
        EXPECT_EQ(back & 0x7F, 0);
      } else {
        EXPECT_EQ(back, c) << "e4m3=" << e4m3 << " x=" << x;
      }
    }
  }
  EXPECT_EQ(fp8_to_float(0x7E, true), 448.0f);
  EXPECT_TRUE(std::isnan(fp8_to_float(0x7F, true)));
  EXPECT_EQ(fp8_to_float(0x7B, false), 57344.0f);
  EXPECT_EQ(fp8_to_float(0x01, true), std::ldexp(1.0f, -9));  // smallest e4m3 subnormal
  EXPECT_EQ(fp8_to_float(0x38, true), 1.0f);                  // 0 0111 000
  EXPECT_EQ(fp8_to_float(0x3C, false), 1.0f);                 // 0 01111 00
}

TEST(KVCodecFp8, RoundsToNearestEvenAndSaturates) {
  // e4m3 around 1: grid step 1/8. 1 + 1/16 is a tie -> even mantissa (1.0); 1 + 3/16 -> 1.25
  EXPECT_EQ(fp8_to_float(float_to_fp8(1.0625f, true), true), 1.0f);
  EXPECT_EQ(fp8_to_float(float_to_fp8(1.1875f, true), true), 1.25f);
  EXPECT_EQ(fp8_to_float(float_to_fp8(1.07f, true), true), 1.125f);
  EXPECT_EQ(fp8_to_float(float_to_fp8(1e6f, true), true), 448.0f);
  EXPECT_EQ(fp8_to_float(float_to_fp8(-1e6f, true), true), -448.0f);
  EXPECT_EQ(fp8_to_float(float_to_fp8(1e9f, false), false), 57344.0f);
  EXPECT_EQ(fp8_to_float(float_to_fp8(-0.0f, true), true), 0.0f);
  auto g = kvtest::rng(11);
  std::uniform_real_distribution<float> u(-500.0f, 500.0f);
  for (int i = 0; i < 20000; ++i) {
    const float x = u(g);
    for (bool e4m3 : {true, false}) {
      const float y = fp8_to_float(float_to_fp8(x, e4m3), e4m3);
      const float ax = std::min(std::fabs(x), fp8_max(e4m3));
      // relative half-ulp bound: 2^-4 (e4m3, 3 mantissa bits) / 2^-3 (e5m2); absolute bound near subnormals
      const float rel = e4m3 ? 0.0625f : 0.125f;
      EXPECT_LE(std::fabs(std::copysign(ax, x) - y), rel * ax + 1e-3f) << x;
    }
  }
}

TEST(KVCodecFp16, DirectedRounding) {
  auto g = kvtest::rng(12);
  std::normal_distribution<float> n(0.0f, 100.0f);
  for (int i = 0; i < 10000; ++i) {
    const float x = n(g);
    EXPECT_LE(f16(fp16_round_down(x)), x);
    EXPECT_GE(f16(fp16_round_up(x)), x);
    EXPECT_LE(f16(fp16_round_up(x)) - f16(fp16_round_down(x)), std::fabs(x) * 1.0e-3f + 1e-7f);
  }
  EXPECT_EQ(f16(fp16_round_down(0.0f)), 0.0f);
  EXPECT_LT(f16(fp16_round_down(-1e-9f)), 0.0f);
}

TEST(KVCodecPacking, HandComputedBytes) {
  // planar int4: byte i = element i (low nibble) | element i + n/2 (high nibble)
  const uint8_t codes4[4] = {0x1, 0xF, 0x7, 0x8};
  uint8_t out4[2];
  pack_codes(codes4, 4, 4, out4);
  EXPECT_EQ(out4[0], 0x71);  // elements 0 (1) and 2 (7)
  EXPECT_EQ(out4[1], 0x8F);  // elements 1 (F) and 3 (8)
  // planar int2: bits 2k..2k+1 of byte i = element i + k·n/4
  const uint8_t codes2[8] = {1, 2, 3, 0, 0, 3, 3, 1};
  uint8_t out2[2];
  pack_codes(codes2, 8, 2, out2);
  EXPECT_EQ(out2[0], 0xCD);  // elements 0, 2, 4, 6 = 1, 3, 0, 3 -> 1 | 3<<2 | 0<<4 | 3<<6 = 0b11001101
  EXPECT_EQ(out2[1], 0x72);  // elements 1, 3, 5, 7 = 2, 0, 3, 1 -> 2 | 0<<2 | 3<<4 | 1<<6 = 0b01110010
  uint8_t back[8];
  unpack_codes(out2, 8, 2, back);
  EXPECT_EQ(std::memcmp(back, codes2, 8), 0);
  uint8_t back4[4];
  unpack_codes(out4, 4, 4, back4);
  EXPECT_EQ(std::memcmp(back4, codes4, 4), 0);
}

TEST(KVCodecInt, Int4TokenLayoutByHand) {
  // head_dim 4, one token [0, 1, 2, 3]: min 0, scale 3/15 = 0.2 -> rounded up in fp16; codes 0, 5, 10, 15.
  auto codec = make_codec(parse_kv_format("int4"), false, 4, 16, 1, {});
  PageHead ph(*codec, 16);
  const float x[4] = {0.0f, 1.0f, 2.0f, 3.0f};
  codec->encode(0, x, 1, ph.codes.data(), ph.meta.data(), 2);  // slot 2
  EXPECT_EQ(ph.codes[4], 0xA0);  // slot 2 starts at byte 2·2; planar: elements 0 and 2 -> 0 | 10<<4
  EXPECT_EQ(ph.codes[5], 0xF5);  // elements 1 and 3 -> 5 | 15<<4
  EXPECT_EQ(ph.codes[0], 0xFF);  // untouched slots
  uint16_t sc, mn;
  std::memcpy(&sc, ph.meta.data() + 2 * 4, 2);
  std::memcpy(&mn, ph.meta.data() + 2 * 4 + 2, 2);
  EXPECT_EQ(mn, 0x0000);
  EXPECT_EQ(sc, fp16_round_up(0.2f));
  float y[4];
  codec->decode(0, ph.codes.data(), ph.meta.data(), 2, 1, y);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[i], x[i], f16(sc) / 2 + 1e-6f);
}

TEST(KVCodecInt, KiviKeyLayoutByHand) {
  // int2 KIVI K, head_dim 4, G 16: channel c of token t = t·(c+1); per-channel min 0, max 15·(c+1), scale (c+1)·5.
  auto codec = make_codec(parse_kv_format("int2_kivi_g16"), true, 4, 16, 1, {});
  PageHead ph(*codec, 16);
  float x[16 * 4];
  for (int t = 0; t < 16; ++t) {
    for (int c = 0; c < 4; ++c) x[t * 4 + c] = static_cast<float>(t * (c + 1));
  }
  codec->encode(0, x, 16, ph.codes.data(), ph.meta.data(), 0);
  // token 15: every channel at its max -> code 3 everywhere -> 0xFF; token 0 -> 0x00; token 5 (= scale) -> code 1
  EXPECT_EQ(ph.codes[15], 0xFF);
  EXPECT_EQ(ph.codes[0], 0x00);
  EXPECT_EQ(ph.codes[5], 0x55);
  for (int c = 0; c < 4; ++c) {
    uint16_t sc, mn;
    std::memcpy(&sc, ph.meta.data() + 2 * c, 2);
    std::memcpy(&mn, ph.meta.data() + 2 * (4 + c), 2);
    EXPECT_EQ(f16(sc), 5.0f * (c + 1));
    EXPECT_EQ(f16(mn), 0.0f);
  }
}

namespace {
/// Bound on |x − x̂| per element for format `f`, given the group's metadata.
void check_round_trip(const std::string& fmt, bool key, int32_t d, float sd) {
  const KVFormatSpec spec = parse_kv_format(fmt);
  const int32_t P = 64;
  auto codec = make_codec(spec, key, d, P, 1, {});
  PageHead ph(*codec, P);
  auto g = kvtest::rng(100 + d);
  std::vector<float> x = kvtest::randn(g, static_cast<size_t>(P * d), sd);
  const int32_t tpg = codec->tokens_per_group();
  for (int32_t s = 0; s < P; s += tpg) codec->encode(0, x.data() + s * d, tpg, ph.codes.data(), ph.meta.data(), s);
  std::vector<float> y(x.size());
  codec->decode(0, ph.codes.data(), ph.meta.data(), 0, P, y.data());
  const int32_t bits = spec.code_bits();
  const int32_t qmax = (1 << bits) - 1;
  for (int32_t t = 0; t < P; ++t) {
    for (int32_t c = 0; c < d; ++c) {
      const float xv = x[static_cast<size_t>(t * d + c)], yv = y[static_cast<size_t>(t * d + c)];
      float bound;
      if (spec.format == KVFormat::fp32) {
        bound = 0.0f;
      } else if (spec.format == KVFormat::bf16) {
        bound = std::fabs(xv) * 0.00390625f;
      } else if (spec.format == KVFormat::fp16) {
        bound = std::fabs(xv) * 0.00048828125f + 3e-8f;
      } else if (spec.format == KVFormat::fp8_e4m3 || spec.format == KVFormat::fp8_e5m2) {
        const bool e4 = spec.format == KVFormat::fp8_e4m3;
        float amax = 0;
        for (int32_t cc = 0; cc < d; ++cc) amax = std::max(amax, std::fabs(x[static_cast<size_t>(t * d + cc)]));
        const float scale = spec.dynamic_scale ? amax / fp8_max(e4) : 1.0f;
        bound = (e4 ? 0.0625f : 0.125f) * std::fabs(xv) + scale * std::ldexp(1.0f, e4 ? -10 : -17);
      } else {
        // asymmetric int: |error| <= scale/2 where scale >= range/qmax; range of the element's group
        float mn = 1e30f, mx = -1e30f;
        const int32_t G = spec.group_size > 0 ? spec.group_size : (spec.is_kivi() ? 32 : d);
        if (spec.is_kivi() && key) {
          const int32_t t0 = t / G * G;
          for (int32_t tt = t0; tt < t0 + G; ++tt) {
            mn = std::min(mn, x[static_cast<size_t>(tt * d + c)]);
            mx = std::max(mx, x[static_cast<size_t>(tt * d + c)]);
          }
        } else {
          const int32_t c0 = c / G * G;
          for (int32_t cc = c0; cc < c0 + G; ++cc) {
            mn = std::min(mn, x[static_cast<size_t>(t * d + cc)]);
            mx = std::max(mx, x[static_cast<size_t>(t * d + cc)]);
          }
        }
        const float scale_h = (mx - mn) / qmax * (1.0f + 2e-3f) + 1e-7f;  // fp16 rounding of scale and min
        bound = scale_h / 2 + std::fabs(mn) * 1e-3f + 1e-6f;
      }
      ASSERT_LE(std::fabs(xv - yv), bound) << fmt << " key=" << key << " t=" << t << " c=" << c << " x=" << xv;
    }
  }
}
}  // namespace

TEST(KVCodec, RoundTripWithinBound) {
  for (const char* f : {"fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3_dynamic", "fp8_e5m2_dynamic", "int8",
                        "int8_g32", "int4", "int4_g32", "int4_g64", "int4_kivi", "int2_kivi", "int4_kivi_g16",
                        "int2_kivi_g64"}) {
    for (bool key : {true, false}) {
      check_round_trip(f, key, 128, 1.0f);
      check_round_trip(f, key, 64, 3.0f);
    }
  }
}

TEST(KVCodec, ErrorShrinksWithBits) {
  // mean squared error ordering int8 < int4 < int2 (same data, per-token V arrangement)
  auto g = kvtest::rng(7);
  const int32_t d = 128, P = 32;
  std::vector<float> x = kvtest::randn(g, static_cast<size_t>(P * d));
  double prev = 0;
  for (const char* f : {"int8_g32", "int4_g32", "int2_kivi"}) {
    auto codec = make_codec(parse_kv_format(f), false, d, P, 1, {});
    PageHead ph(*codec, P);
    codec->encode(0, x.data(), P, ph.codes.data(), ph.meta.data(), 0);
    std::vector<float> y(x.size());
    codec->decode(0, ph.codes.data(), ph.meta.data(), 0, P, y.data());
    double mse = 0;
    for (size_t i = 0; i < x.size(); ++i) mse += (x[i] - y[i]) * (x[i] - y[i]);
    EXPECT_GT(mse, prev) << f;
    prev = mse;
  }
}

TEST(KVCodec, AllZeroTokensDecodeToZeroNotNaN) {
  for (const char* f : {"fp8_e4m3_dynamic", "fp8_e5m2", "int8", "int4_g32", "int4_kivi", "int2_kivi"}) {
    for (bool key : {true, false}) {
      auto codec = make_codec(parse_kv_format(f), key, 64, 32, 1, {});
      PageHead ph(*codec, 32);
      std::vector<float> x(32 * 64, 0.0f), y(32 * 64, 1.0f);
      codec->encode(0, x.data(), 32, ph.codes.data(), ph.meta.data(), 0);
      codec->decode(0, ph.codes.data(), ph.meta.data(), 0, 32, y.data());
      for (float v : y) ASSERT_EQ(v, 0.0f) << f;
    }
  }
}

TEST(KVCodec, ConstantTokenIsExact) {
  // scale 0 (max == min): the value must come back exactly when it is representable in fp16
  auto codec = make_codec(parse_kv_format("int4"), false, 32, 16, 1, {});
  PageHead ph(*codec, 16);
  std::vector<float> x(32, -2.5f), y(32);
  codec->encode(0, x.data(), 1, ph.codes.data(), ph.meta.data(), 0);
  codec->decode(0, ph.codes.data(), ph.meta.data(), 0, 1, y.data());
  for (float v : y) EXPECT_EQ(v, -2.5f);
}

TEST(KVCodec, Fp8StaticPerHeadScale) {
  auto codec = make_codec(parse_kv_format("fp8_e4m3"), true, 16, 16, 2, {0.5f, 4.0f});
  PageHead ph(*codec, 16);
  std::vector<float> x(16, 1000.0f), y(16);
  codec->encode(1, x.data(), 1, ph.codes.data(), ph.meta.data(), 0);  // 1000/4 = 250 -> representable range
  codec->decode(1, ph.codes.data(), ph.meta.data(), 0, 1, y.data());
  EXPECT_NEAR(y[0], 1000.0f, 1000.0f * 0.0625f);
  codec->encode(0, x.data(), 1, ph.codes.data(), ph.meta.data(), 1);  // 1000/0.5 = 2000 saturates at 448
  codec->decode(0, ph.codes.data(), ph.meta.data(), 1, 1, y.data());
  EXPECT_EQ(y[0], 448.0f * 0.5f);
}

TEST(KVCodecFp8, StaticScaleTileDecodeAnyHeadDim) {
  // a static scale decodes a tile's n·d codes as one run (vector body + scalar tail for any head_dim): every element
  // must equal fp8_to_float(code) · scale exactly, for head dims that are not multiples of 32 and partial tiles.
  auto g = kvtest::rng(31);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (const char* f : {"fp8_e4m3", "fp8_e5m2"}) {
    const bool e4m3 = std::string(f) == "fp8_e4m3";
    for (int32_t d : {16, 40, 64, 128}) {
      const float scale = 0.37f;
      auto codec = make_codec(parse_kv_format(f), true, d, 16, 1, {scale});
      PageHead ph(*codec, 16);
      std::vector<float> x(static_cast<size_t>(16 * d));
      for (float& v : x) v = nd(g);
      codec->encode(0, x.data(), 16, ph.codes.data(), ph.meta.data(), 0);
      for (int32_t slot : {0, 3}) {
        for (int32_t n : {1, 5, 16 - slot}) {
          std::vector<float> y(static_cast<size_t>(n * d), -1.0f);
          codec->decode(0, ph.codes.data(), ph.meta.data(), slot, n, y.data());
          for (int32_t i = 0; i < n * d; ++i) {
            const float want = fp8_to_float(ph.codes[static_cast<size_t>(slot * d + i)], e4m3) * scale;
            ASSERT_EQ(y[static_cast<size_t>(i)], want)
                << f << " d " << d << " slot " << slot << " n " << n << " i " << i;
          }
        }
      }
    }
  }
}

TEST(KVCodecFp8, TileDecodeExactOnEveryCode) {
  // every finite fp8 value (subnormals included) survives encode + the branch-free tile decode exactly (scale 1)
  for (const char* f : {"fp8_e4m3", "fp8_e5m2"}) {
    const bool e4m3 = std::string(f) == "fp8_e4m3";
    auto codec = make_codec(parse_kv_format(f), true, 256, 16, 1, {});
    PageHead ph(*codec, 16);
    std::vector<float> x(256), y(256);
    for (int c = 0; c < 256; ++c) {
      const float v = fp8_to_float(static_cast<uint8_t>(c), e4m3);
      x[static_cast<size_t>(c)] = std::isfinite(v) ? v : 0.0f;
    }
    codec->encode(0, x.data(), 1, ph.codes.data(), ph.meta.data(), 3);
    codec->decode(0, ph.codes.data(), ph.meta.data(), 3, 1, y.data());
    for (int c = 0; c < 256; ++c) EXPECT_EQ(y[static_cast<size_t>(c)], x[static_cast<size_t>(c)]) << f << " code " << c;
  }
}
