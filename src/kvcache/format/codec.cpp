// Codec factory, scalar helpers (fp8, fp16 directed rounding, asymmetric quantization, bit packing) and the float /
// fp8 codecs. The integer codecs live in codec_int.cpp.
#include "kvcache/format/codec.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define FLASHKV_FP8_AVX512 1
#endif

#include "core/float16.hpp"
#include "cpu/tile_math.hpp"

namespace flashkv::kv {

// ---- fp8 -----------------------------------------------------------------------------------------------------------
namespace {
struct Fp8Params {
  int m;         // mantissa bits
  int bias;      // exponent bias
  int max_code;  // largest finite positive code
};
constexpr Fp8Params kE4M3{3, 7, 0x7E};
constexpr Fp8Params kE5M2{2, 15, 0x7B};

float fp8_decode_slow(uint8_t code, const Fp8Params& p) {
  const int c = code & 0x7F;
  const int e = c >> p.m;
  const int man = c & ((1 << p.m) - 1);
  float v;
  if (c > p.max_code) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(static_cast<float>(man), 1 - p.bias - p.m);
  } else {
    v = std::ldexp(static_cast<float>((1 << p.m) + man), e - p.bias - p.m);
  }
  return (code & 0x80) ? -v : v;
}

struct Fp8Tables {
  float e4m3[256];
  float e5m2[256];
  Fp8Tables() {
    for (int i = 0; i < 256; ++i) {
      e4m3[i] = fp8_decode_slow(static_cast<uint8_t>(i), kE4M3);
      e5m2[i] = fp8_decode_slow(static_cast<uint8_t>(i), kE5M2);
    }
  }
};
const Fp8Tables& fp8_tables() {
  static const Fp8Tables t;
  return t;
}
}  // namespace

float fp8_max(bool e4m3) { return e4m3 ? 448.0f : 57344.0f; }

float fp8_to_float(uint8_t code, bool e4m3) { return e4m3 ? fp8_tables().e4m3[code] : fp8_tables().e5m2[code]; }

uint8_t float_to_fp8(float x, bool e4m3) {
  const Fp8Params& p = e4m3 ? kE4M3 : kE5M2;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  if (std::isnan(x)) return static_cast<uint8_t>(sign | (e4m3 ? 0x7F : 0x7F));
  if (a == 0.0f) return sign;
  if (a >= fp8_max(e4m3)) return static_cast<uint8_t>(sign | p.max_code);
  int k;
  std::frexp(a, &k);  // a = f·2^k, f in [0.5, 1)
  int e = k - 1;      // a in [2^e, 2^(e+1))
  const int emin = 1 - p.bias;
  int code;
  if (e < emin) {  // subnormal grid: quantum 2^(emin − m)
    const long q = std::lrint(std::ldexp(a, -(emin - p.m)));  // round half to even (default rounding mode)
    code = static_cast<int>(q);                               // q == 2^m is the smallest normal: same code
  } else {
    const long q = std::lrint(std::ldexp(a, -(e - p.m)));  // in [2^m, 2^(m+1)]
    code = ((e + p.bias) << p.m) + static_cast<int>(q - (1L << p.m));  // q == 2^(m+1) carries into the exponent
  }
  code = std::min(code, p.max_code);
  return static_cast<uint8_t>(sign | code);
}

// ---- fp16 directed rounding ------------------------------------------------------------------------------------------
namespace {
uint16_t fp16_next_down(uint16_t h) {
  if (h == 0x0000u) return 0x8001u;
  if (h & 0x8000u) return static_cast<uint16_t>(h + 1);
  return static_cast<uint16_t>(h - 1);
}
uint16_t fp16_next_up(uint16_t h) {
  if (h == 0x8000u) return 0x0001u;
  if (h & 0x8000u) return static_cast<uint16_t>(h - 1);
  return static_cast<uint16_t>(h + 1);
}
}  // namespace

uint16_t fp16_round_down(float x) {
  uint16_t h = float_to_fp16(x);
  if (fp16_to_float(h) > x) h = fp16_next_down(h);
  return h;
}
uint16_t fp16_round_up(float x) {
  uint16_t h = float_to_fp16(x);
  if (fp16_to_float(h) < x) h = fp16_next_up(h);
  return h;
}

// ---- asymmetric quantization and packing ----------------------------------------------------------------------------
void quantize_asym(const float* x, int32_t n, int32_t stride, int32_t qmax, uint8_t* codes, int32_t code_stride,
                   uint16_t* scale_bits, uint16_t* min_bits) {
  float mn = x[0], mx = x[0];
  for (int32_t i = 1; i < n; ++i) {
    mn = std::min(mn, x[static_cast<int64_t>(i) * stride]);
    mx = std::max(mx, x[static_cast<int64_t>(i) * stride]);
  }
  // min rounded down and scale rounded up in fp16, so that [min_h, min_h + scale_h·qmax] ⊇ [mn, mx] and every
  // element's error is at most scale_h / 2 (plus float32 rounding).
  const uint16_t mn_h = fp16_round_down(mn);
  const float mnf = fp16_to_float(mn_h);
  const uint16_t sc_h = fp16_round_up((mx - mnf) / static_cast<float>(qmax));
  const float scf = fp16_to_float(sc_h);
  const float inv = scf > 0.0f ? 1.0f / scf : 0.0f;
  for (int32_t i = 0; i < n; ++i) {
    float q = std::nearbyint((x[static_cast<int64_t>(i) * stride] - mnf) * inv);
    q = std::min(std::max(q, 0.0f), static_cast<float>(qmax));
    codes[static_cast<int64_t>(i) * code_stride] = static_cast<uint8_t>(q);
  }
  *scale_bits = sc_h;
  *min_bits = mn_h;
}

void pack_codes(const uint8_t* codes, int32_t n, int32_t bits, uint8_t* out) {
  if (bits == 8) {
    std::memcpy(out, codes, static_cast<size_t>(n));
  } else if (bits == 4) {  // planar: byte i = element i (low nibble) | element i + n/2 (high nibble)
    const int32_t h = n / 2;
    for (int32_t i = 0; i < h; ++i) out[i] = static_cast<uint8_t>((codes[i] & 0xF) | ((codes[i + h] & 0xF) << 4));
  } else {  // planar: bits 2k..2k+1 of byte i = element i + k·n/4
    const int32_t q = n / 4;
    for (int32_t i = 0; i < q; ++i) {
      out[i] = static_cast<uint8_t>((codes[i] & 3) | ((codes[i + q] & 3) << 2) | ((codes[i + 2 * q] & 3) << 4) |
                                    ((codes[i + 3 * q] & 3) << 6));
    }
  }
}

void unpack_codes(const uint8_t* packed, int32_t n, int32_t bits, uint8_t* codes) {
  if (bits == 8) {
    std::memcpy(codes, packed, static_cast<size_t>(n));
  } else if (bits == 4) {
    const int32_t h = n / 2;
    for (int32_t i = 0; i < h; ++i) {
      codes[i] = packed[i] & 0xF;
      codes[i + h] = packed[i] >> 4;
    }
  } else {
    const int32_t q = n / 4;
    for (int32_t i = 0; i < q; ++i) {
      for (int k = 0; k < 4; ++k) codes[i + k * q] = (packed[i] >> (2 * k)) & 3;
    }
  }
}

KVCodec::KVCodec(const KVFormatSpec& spec, bool is_key, int32_t head_dim, int32_t page_size)
    : spec_(spec), bytes_(kv_format_bytes(spec, is_key, head_dim, page_size)), head_dim_(head_dim), is_key_(is_key) {}

// ---- vectorized decode loops (AVX-512 / AVX2 / baseline clones, chosen at load time) ---------------------------------
FLASHKV_CPU_CLONES
void decode_bf16_row(const uint8_t* __restrict src, int64_t n, float* __restrict out) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    out[i] = bits_to_float(static_cast<uint32_t>(h) << 16);
  }
}

/// fp8 codes of one tile -> float, branch-free and without denormal intermediates (which would take microcode
/// assists): a normal code's 7 magnitude bits shifted into float position plus the exponent rebias (E4M3: << 20,
/// +120; E5M2: << 21, +112) is exactly its float bit pattern; subnormal codes (exponent 0) are mantissa · 2^-9 (E4M3)
/// / 2^-16 (E5M2). Codes are never NaN (encoding saturates). x̂ = fp8 · scale, scale static or per token (dynamic,
/// float32 in the metadata).
template <bool kE4M3, int kD>
FLASHKV_ALWAYS_INLINE void decode_fp8_row(const uint8_t* __restrict src, int64_t d_rt, float scale,
                                          float* __restrict o) {
  const int64_t d = kD > 0 ? kD : d_rt;
  constexpr uint32_t kShift = kE4M3 ? 20 : 21;
  constexpr uint32_t kRebias = (kE4M3 ? 120u : 112u) << 23;
  constexpr uint32_t kMinNormal = kE4M3 ? 8 : 4;  // smallest magnitude code with exponent 1
  constexpr float kSubUnit = kE4M3 ? 0.001953125f : 1.52587890625e-05f;
  for (int64_t c = 0; c < d; ++c) {
    const uint32_t b = src[c];
    const uint32_t mag = b & 0x7Fu;
    const uint32_t normal = (mag << kShift) + kRebias;
    const uint32_t sub = std::bit_cast<uint32_t>(static_cast<float>(static_cast<int32_t>(mag)) * kSubUnit);
    const float v = std::bit_cast<float>(mag < kMinNormal ? sub : normal) * scale;
    o[c] = std::bit_cast<float>(std::bit_cast<uint32_t>(v) | ((b & 0x80u) << 24));
  }
}

FLASHKV_CPU_CLONES
void decode_fp8_tile(const uint8_t* __restrict codes, const uint8_t* __restrict meta, int32_t slot, int32_t n,
                     int32_t d, bool e4m3, bool dynamic, float static_scale, float* __restrict out) {
  if (!dynamic) {  // one scale for the tile: its n·d contiguous codes decode as one row (any head_dim vectorizes)
    const uint8_t* src = codes + static_cast<int64_t>(slot) * d;
    const int64_t total = static_cast<int64_t>(n) * d;
    if (e4m3) {
      decode_fp8_row<true, 0>(src, total, static_scale, out);
    } else {
      decode_fp8_row<false, 0>(src, total, static_scale, out);
    }
    return;
  }
  for (int32_t t = 0; t < n; ++t) {
    const uint8_t* src = codes + static_cast<int64_t>(slot + t) * d;
    float scale = static_scale;
    if (dynamic) std::memcpy(&scale, meta + static_cast<int64_t>(slot + t) * 4, 4);
    float* o = out + static_cast<int64_t>(t) * d;
    if (e4m3) {
      if (d == 128) {
        decode_fp8_row<true, 128>(src, d, scale, o);
      } else {
        decode_fp8_row<true, 0>(src, d, scale, o);
      }
    } else {
      if (d == 128) {
        decode_fp8_row<false, 128>(src, d, scale, o);
      } else {
        decode_fp8_row<false, 0>(src, d, scale, o);
      }
    }
  }
}

#ifdef FLASHKV_FP8_AVX512
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized (_mm512_undefined_* inside the cast / extract intrinsics).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
/// AVX-512 fp8 tile decode through the fp16 converter: an E4M3 byte S.EEEE.MMM placed as fp16 bits S.0EEEE.MMM0000000
/// is exactly its value · 2^-8 (normals and subnormals alike; vcvtph2ps converts fp16 subnormals exactly and without
/// assists), an E5M2 byte shifted left by 8 is exactly its fp16 value. The 2^8 is folded into the scale, so
/// (v·2^-8)·(scale·2^8) rounds once, like v·scale: results are bit-identical to decode_fp8_row. Dynamic (per-token)
/// scales need d % 32 == 0; a static scale decodes the tile's n·d contiguous codes as one run (any d, scalar tail).
__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) void decode_fp8_tile_avx512(
    const uint8_t* __restrict codes, const uint8_t* __restrict meta, int32_t slot, int32_t n, int32_t d, bool e4m3,
    bool dynamic, float static_scale, float* __restrict out) {
  const __m512i keep = _mm512_set1_epi16(static_cast<int16_t>(0xBFFF));
  const float mul = e4m3 ? 256.0f : 1.0f;
  if (!dynamic) {
    const uint8_t* src = codes + static_cast<int64_t>(slot) * d;
    const int64_t total = static_cast<int64_t>(n) * d;
    const __m512 vs = _mm512_set1_ps(static_scale * mul);
    int64_t c = 0;
    for (; c + 32 <= total; c += 32) {
      __m512i w = _mm512_slli_epi16(
          _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + c))), 8);
      if (e4m3) w = _mm512_and_si512(_mm512_srai_epi16(w, 1), keep);
      _mm512_storeu_ps(out + c, _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(w)), vs));
      _mm512_storeu_ps(out + c + 16, _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(w, 1)), vs));
    }
    if (c < total) {
      if (e4m3) {
        decode_fp8_row<true, 0>(src + c, total - c, static_scale, out + c);
      } else {
        decode_fp8_row<false, 0>(src + c, total - c, static_scale, out + c);
      }
    }
    return;
  }
  for (int32_t t = 0; t < n; ++t) {
    const uint8_t* src = codes + static_cast<int64_t>(slot + t) * d;
    float scale = static_scale;
    if (dynamic) std::memcpy(&scale, meta + static_cast<int64_t>(slot + t) * 4, 4);
    const __m512 vs = _mm512_set1_ps(scale * mul);
    float* o = out + static_cast<int64_t>(t) * d;
    for (int32_t c = 0; c < d; c += 32) {
      __m512i w = _mm512_slli_epi16(
          _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + c))), 8);
      if (e4m3) w = _mm512_and_si512(_mm512_srai_epi16(w, 1), keep);  // S.S.EEEE.MMM -> S.0.EEEE.MMM
      _mm512_storeu_ps(o + c, _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(w)), vs));
      _mm512_storeu_ps(o + c + 16, _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(w, 1)), vs));
    }
  }
}

bool fp8_avx512_supported() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c");
  return ok;
}
#pragma GCC diagnostic pop
#endif

// ---- float codecs (fp32 / bf16 / fp16) ------------------------------------------------------------------------------
namespace {

class Fp32Codec final : public KVCodec {
 public:
  Fp32Codec(const KVFormatSpec& s, bool k, int32_t d, int32_t p) : KVCodec(s, k, d, p) {}
  void encode(int32_t, const float* x, int32_t n, uint8_t* codes, uint8_t*, int32_t slot) const override {
    std::memcpy(codes + static_cast<int64_t>(slot) * head_dim_ * 4, x, static_cast<size_t>(n) * head_dim_ * 4);
  }
  void decode(int32_t, const uint8_t* codes, const uint8_t*, int32_t slot, int32_t n, float* out) const override {
    std::memcpy(out, codes + static_cast<int64_t>(slot) * head_dim_ * 4, static_cast<size_t>(n) * head_dim_ * 4);
  }
};

class Half16Codec final : public KVCodec {
 public:
  Half16Codec(const KVFormatSpec& s, bool k, int32_t d, int32_t p, bool bf16) : KVCodec(s, k, d, p), bf16_(bf16) {}
  void encode(int32_t, const float* x, int32_t n, uint8_t* codes, uint8_t*, int32_t slot) const override {
    uint8_t* dst = codes + static_cast<int64_t>(slot) * head_dim_ * 2;
    const int64_t total = static_cast<int64_t>(n) * head_dim_;
    for (int64_t i = 0; i < total; ++i) {
      const uint16_t h = bf16_ ? float_to_bf16(x[i]) : float_to_fp16(x[i]);
      std::memcpy(dst + 2 * i, &h, 2);
    }
  }
  void decode(int32_t, const uint8_t* codes, const uint8_t*, int32_t slot, int32_t n, float* out) const override {
    const uint8_t* src = codes + static_cast<int64_t>(slot) * head_dim_ * 2;
    const int64_t total = static_cast<int64_t>(n) * head_dim_;
    if (bf16_) {
      decode_bf16_row(src, total, out);
    } else {
      for (int64_t i = 0; i < total; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = fp16_to_float(h);
      }
    }
  }

 private:
  bool bf16_;
};

// ---- fp8 codec: static (per tensor / per kv-head) or dynamic (per token-head) scale ---------------------------------
class Fp8Codec final : public KVCodec {
 public:
  Fp8Codec(const KVFormatSpec& s, bool k, int32_t d, int32_t p, int32_t heads, const std::vector<float>& scales)
      : KVCodec(s, k, d, p), e4m3_(s.format == KVFormat::fp8_e4m3) {
    scales_.assign(static_cast<size_t>(heads), 1.0f);
    if (scales.size() == 1) scales_.assign(static_cast<size_t>(heads), scales[0]);
    if (scales.size() == static_cast<size_t>(heads)) scales_ = scales;
  }
  void encode(int32_t head, const float* x, int32_t n, uint8_t* codes, uint8_t* meta, int32_t slot) const override {
    for (int32_t t = 0; t < n; ++t) {
      const float* row = x + static_cast<int64_t>(t) * head_dim_;
      uint8_t* dst = codes + static_cast<int64_t>(slot + t) * head_dim_;
      float scale = scales_[static_cast<size_t>(head)];
      if (spec_.dynamic_scale) {
        float amax = 0.0f;
        for (int32_t c = 0; c < head_dim_; ++c) amax = std::max(amax, std::fabs(row[c]));
        scale = amax / fp8_max(e4m3_);
        std::memcpy(meta + static_cast<int64_t>(slot + t) * 4, &scale, 4);
      }
      const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
      for (int32_t c = 0; c < head_dim_; ++c) dst[c] = float_to_fp8(row[c] * inv, e4m3_);
    }
  }
  void decode(int32_t head, const uint8_t* codes, const uint8_t* meta, int32_t slot, int32_t n,
              float* out) const override {
    const float scale = scales_[static_cast<size_t>(head)];
#ifdef FLASHKV_FP8_AVX512
    // 256·scale must stay finite for the fp16 route (dynamic scales are ≤ FLT_MAX/448, so 256·scale is finite).
    if (fp8_avx512_supported() && (head_dim_ % 32 == 0 || !spec_.dynamic_scale) && std::isfinite(scale * 256.0f)) {
      decode_fp8_tile_avx512(codes, meta, slot, n, head_dim_, e4m3_, spec_.dynamic_scale, scale, out);
      return;
    }
#endif
    decode_fp8_tile(codes, meta, slot, n, head_dim_, e4m3_, spec_.dynamic_scale, scale, out);
  }
  /// raw = the fp8 value (times 2^-8 on the AVX-512 fp16 route), alpha = the scale (times 2^8), beta = 0.
  void decode_factored(int32_t head, const uint8_t* codes, const uint8_t* meta, int32_t slot, int32_t n,
                       FactoredTile& t) const override {
    const float scale = scales_[static_cast<size_t>(head)];
    float mul = 1.0f;
#ifdef FLASHKV_FP8_AVX512
    if (fp8_avx512_supported() && std::isfinite(scale * 256.0f)) {  // static 1.0 here: any head_dim
      mul = e4m3_ ? 256.0f : 1.0f;
      decode_fp8_tile_avx512(codes, meta, slot, n, head_dim_, e4m3_, false, 1.0f / mul, t.raw);
    } else {
      decode_fp8_tile(codes, meta, slot, n, head_dim_, e4m3_, false, 1.0f, t.raw);
    }
#else
    decode_fp8_tile(codes, meta, slot, n, head_dim_, e4m3_, false, 1.0f, t.raw);
#endif
    for (int32_t i = 0; i < n; ++i) {
      float sc = scale;
      if (spec_.dynamic_scale) std::memcpy(&sc, meta + static_cast<int64_t>(slot + i) * 4, 4);
      t.alpha[i] = sc * mul;
      t.beta[i] = 0.0f;
    }
    t.group = head_dim_;
    t.per_channel = false;
  }

 private:
  bool e4m3_;
  std::vector<float> scales_;
};

}  // namespace

std::unique_ptr<KVCodec> make_int_codec(const KVFormatSpec& spec, bool is_key, int32_t head_dim, int32_t page_size);

std::unique_ptr<KVCodec> make_codec(const KVFormatSpec& spec, bool is_key, int32_t head_dim, int32_t page_size,
                                    int32_t num_heads_kv, const std::vector<float>& scales) {
  switch (spec.format) {
    case KVFormat::fp32: return std::make_unique<Fp32Codec>(spec, is_key, head_dim, page_size);
    case KVFormat::bf16: return std::make_unique<Half16Codec>(spec, is_key, head_dim, page_size, true);
    case KVFormat::fp16: return std::make_unique<Half16Codec>(spec, is_key, head_dim, page_size, false);
    case KVFormat::fp8_e4m3:
    case KVFormat::fp8_e5m2:
      return std::make_unique<Fp8Codec>(spec, is_key, head_dim, page_size, num_heads_kv, scales);
    default: return make_int_codec(spec, is_key, head_dim, page_size);
  }
}

}  // namespace flashkv::kv
