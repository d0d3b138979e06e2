// The format trait (src/kvcache/format/traits.hpp) is the definition every consumer follows: its scalar conversions
// agree with the reference conversions bit for bit, its per-element dequant() agrees with the codec's vectorized decode
// loops for every format, and its byte geometry is what kv_format_bytes() (the memory formula) reports.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "core/float16.hpp"
#include "kv_test_util.hpp"
#include "kvcache/format/codec.hpp"
#include "kvcache/format/traits.hpp"

using namespace flashkv;
using namespace flashkv::kv;

TEST(KVTraits, Fp16ConversionsMatchTheReferenceBitForBit) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float a = fp16_bits_to_float(static_cast<uint16_t>(h)), b = fp16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(a)) << h;
    } else {
      EXPECT_EQ(float_as_u32(a), float_as_u32(b)) << h;
    }
  }
  auto g = kvtest::rng(31);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    const float x = u32_as_float(bits(g));
    if (std::isnan(x)) continue;
    ASSERT_EQ(float_to_fp16_bits(x), float_to_fp16(x)) << x;
    ASSERT_EQ(float_to_bf16_bits(x), float_to_bf16(x)) << x;
  }
}

TEST(KVTraits, Fp8EncodeIsRoundToNearestEvenOverEveryInterval) {
  // Every value between two neighbouring codes rounds to the nearer one, ties to the even code (checked at the
  // midpoints and just around them), for both fp8 formats and both signs.
  for (bool e4m3 : {true, false}) {
    const Fp8Spec p = fp8_spec(e4m3);
    for (int c = 0; c < p.max_code; ++c) {
      const float lo = fp8_bits_to_float(static_cast<uint8_t>(c), e4m3);
      const float hi = fp8_bits_to_float(static_cast<uint8_t>(c + 1), e4m3);
      const float mid = 0.5f * (lo + hi);
      for (float sgn : {1.0f, -1.0f}) {
        const uint8_t s = sgn < 0 ? 0x80 : 0;
        EXPECT_EQ(float_to_fp8_bits(sgn * lo, e4m3) & 0x7F, c == 0 ? 0 : c);
        EXPECT_EQ(float_to_fp8_bits(sgn * std::nextafter(mid, lo), e4m3), s | c) << e4m3 << " c=" << c;
        EXPECT_EQ(float_to_fp8_bits(sgn * std::nextafter(mid, hi), e4m3), s | (c + 1)) << e4m3 << " c=" << c;
        EXPECT_EQ(float_to_fp8_bits(sgn * mid, e4m3), s | ((c & 1) ? c + 1 : c)) << e4m3 << " tie c=" << c;
      }
    }
    EXPECT_EQ(float_to_fp8_bits(1e30f, e4m3), p.max_code);
    EXPECT_EQ(float_to_fp8_bits(-INFINITY, e4m3), 0x80 | p.max_code);
    EXPECT_EQ(float_to_fp8_bits(1e-40f, e4m3), 0);  // a float subnormal
  }
}

namespace {
const char* kFormats[] = {"fp32",     "bf16",     "fp16",          "fp8_e4m3",      "fp8_e5m2",  "fp8_e4m3_dynamic",
                          "fp8_e5m2_dynamic", "int8", "int8_g32",  "int4",          "int4_g64",  "int4_kivi",
                          "int2_kivi", "int4_kivi_g16", "int2_kivi_g64"};
}

TEST(KVTraits, DequantAgreesWithTheCodecDecodeLoops) {
  // The codec's vectorized loops (fp8 through the AVX-512 fp16 route, integer tiles) against the trait's element-wise
  // definition, on random data, every format, K and V, several head dims. Integer formats may differ by the rounding
  // of one contracted multiply-add (min + scale·code as FMA in the x86-64-v3/v4 clones).
  uint64_t salt = 7000;
  for (const char* name : kFormats) {
    for (bool key : {true, false}) {
      for (int32_t d : {16, 64, 96, 128, 256}) {
        const KVFormatSpec spec = parse_kv_format(name);
        const int32_t P = 64;
        if (spec.group_size > d || (spec.group_size > 0 && d % spec.group_size != 0)) continue;
        if (!key && spec.is_kivi() && d % (spec.group_size > 0 ? spec.group_size : 32) != 0) continue;
        SCOPED_TRACE(std::string(name) + (key ? " K" : " V") + " d=" + std::to_string(d));
        const std::vector<float> scales = {0.75f, 2.5f};
        KVCodec codec(spec, key, d, P, 2, scales);
        const KVHalfFormat& f = codec.format();
        ASSERT_EQ(f.code_bytes, codec.bytes().code_bytes_per_token_head);
        ASSERT_EQ(f.meta_bytes_per_page_head(P), codec.bytes().meta_bytes_per_page_head);
        auto g = kvtest::rng(salt++);
        std::vector<float> x = kvtest::randn(g, static_cast<size_t>(P) * d, 3.0f);
        std::vector<uint8_t> codes(static_cast<size_t>(f.code_bytes) * P, 0xFF);
        std::vector<uint8_t> meta(static_cast<size_t>(std::max<int64_t>(f.meta_bytes_per_page_head(P), 1)), 0xFF);
        for (int32_t head : {0, 1}) {
          codec.encode(head, x.data(), P, codes.data(), meta.data(), 0);
          std::vector<float> y(x.size());
          codec.decode(head, codes.data(), meta.data(), 0, P, y.data());
          for (int32_t t = 0; t < P; ++t) {
            for (int32_t c = 0; c < d; ++c) {
              const float a = f.dequant(codes.data(), meta.data(), t, c, codec.head_scale(head));
              const float b = y[static_cast<size_t>(t) * d + c];
              const float tol = f.code == KVCode::u8 || f.code == KVCode::u4 || f.code == KVCode::u2
                                    ? 2.5e-7f * (std::fabs(a) + 8.0f)
                                    : 0.0f;
              ASSERT_LE(std::fabs(a - b), tol) << "t=" << t << " c=" << c << " trait " << a << " codec " << b;
            }
          }
          // decoding a sub-range that starts mid-page gives the same values
          std::vector<float> z(static_cast<size_t>(7) * d);
          const int32_t s0 = f.tokens_per_unit > 1 && f.tokens_per_unit < P ? f.tokens_per_unit : 13;
          codec.decode(head, codes.data(), meta.data(), s0, 7, z.data());
          EXPECT_EQ(std::memcmp(z.data(), y.data() + static_cast<size_t>(s0) * d, z.size() * 4), 0);
        }
      }
    }
  }
}

TEST(KVTraits, GeometryMatchesTheMemoryFormula) {
  // bits per element at d = 128 as documented (codes + metadata of one page-head / (page_size · d)).
  struct Want {
    const char* name;
    double k_bits, v_bits;
  };
  const Want want[] = {{"fp32", 32, 32},    {"bf16", 16, 16},          {"fp16", 16, 16},
                       {"fp8_e4m3", 8, 8},  {"fp8_e4m3_dynamic", 8.25, 8.25},
                       {"int8", 8.25, 8.25}, {"int4", 4.25, 4.25},    {"int4_g32", 5.0, 5.0},
                       {"int4_kivi", 5.0, 5.0}, {"int2_kivi", 3.0, 3.0}};
  for (const Want& w : want) {
    const KVFormatSpec spec = parse_kv_format(w.name);
    for (bool key : {true, false}) {
      const KVHalfFormat f = describe(spec, key, 128);
      const double bits = (64.0 * f.code_bytes + static_cast<double>(f.meta_bytes_per_page_head(64))) * 8 / (64 * 128);
      EXPECT_DOUBLE_EQ(bits, key ? w.k_bits : w.v_bits) << w.name << (key ? " K" : " V");
    }
  }
}
