// KVCodec over the format trait (codec.hpp): encode through KVHalfFormat::encode_unit, decode through the vectorized
// fast paths below (bf16 rows, fp8 tiles — AVX-512 through the fp16 converter where available — and the integer tiles
// of codec_int.cpp), or through the trait's dequant() for any other (KVCode, KVScaling) pair.
#include "kvcache/format/codec.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define FLASHKV_FP8_AVX512 1
#endif

#include "core/float16.hpp"
#include "cpu/tile_math.hpp"
#include "kvcache/format/codec_fast.hpp"

namespace flashkv::kv {

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


namespace {
/// fp8 tile -> float with scale (static: one value; dynamic: per token from the metadata); bit-identical on both routes.
void decode_fp8(const KVHalfFormat& f, const uint8_t* codes, const uint8_t* meta, int32_t slot, int32_t n, float scale,
                float* out) {
  const bool e4m3 = f.code == KVCode::e4m3, dynamic = f.scaling == KVScaling::token_f32;
#ifdef FLASHKV_FP8_AVX512
  // 256·scale must stay finite for the fp16 route (dynamic scales are <= FLT_MAX/448, so 256·scale is finite).
  if (fp8_avx512_supported() && (f.head_dim % 32 == 0 || !dynamic) && std::isfinite(scale * 256.0f)) {
    decode_fp8_tile_avx512(codes, meta, slot, n, f.head_dim, e4m3, dynamic, scale, out);
    return;
  }
#endif
  decode_fp8_tile(codes, meta, slot, n, f.head_dim, e4m3, dynamic, scale, out);
}
}  // namespace

KVCodec::KVCodec(const KVFormatSpec& spec, bool is_key, int32_t head_dim, int32_t page_size, int32_t num_heads_kv,
                 const std::vector<float>& scales)
    : spec_(spec), fmt_(describe(spec, is_key, head_dim)), bytes_(kv_format_bytes(spec, is_key, head_dim, page_size)) {
  scales_.assign(static_cast<size_t>(num_heads_kv), 1.0f);
  if (fmt_.scaling == KVScaling::head_static) {
    if (scales.size() == 1) scales_.assign(static_cast<size_t>(num_heads_kv), scales[0]);
    if (scales.size() == static_cast<size_t>(num_heads_kv)) scales_ = scales;
  }
}

KVCodec::KVCodec(const KVHalfFormat& fmt, int32_t page_size, std::vector<float> head_scales)
    : fmt_(fmt), scales_(std::move(head_scales)) {
  bytes_.code_bytes_per_token_head = fmt_.code_bytes;
  bytes_.meta_bytes_per_group = fmt_.meta_bytes_per_unit;
  bytes_.tokens_per_group = fmt_.tokens_per_unit;
  bytes_.meta_bytes_per_page_head = fmt_.meta_bytes_per_page_head(page_size);
}

void KVCodec::encode(int32_t head, const float* x, int32_t n, uint8_t* codes, uint8_t* meta, int32_t slot) const {
  const int32_t u = fmt_.tokens_per_unit, d = fmt_.head_dim;
  std::vector<uint8_t> tmp(static_cast<size_t>(d) * static_cast<size_t>(u));
  for (int32_t t = 0; t < n; t += u) {
    fmt_.encode_unit(x + static_cast<int64_t>(t) * d, codes, meta, slot + t, head_scale(head), tmp.data());
  }
}

void KVCodec::decode(int32_t head, const uint8_t* codes, const uint8_t* meta, int32_t slot, int32_t n,
                     float* out) const {
  const int32_t d = fmt_.head_dim;
  switch (fmt_.scaling) {
    case KVScaling::none:
      if (fmt_.code == KVCode::f32) {
        std::memcpy(out, codes + static_cast<int64_t>(slot) * d * 4, static_cast<size_t>(n) * d * 4);
        return;
      }
      if (fmt_.code == KVCode::bf16) {
        decode_bf16_row(codes + static_cast<int64_t>(slot) * d * 2, static_cast<int64_t>(n) * d, out);
        return;
      }
      break;
    case KVScaling::head_static:
    case KVScaling::token_f32:
      if (is_fp8_code(fmt_.code)) {
        decode_fp8(fmt_, codes, meta, slot, n, head_scale(head), out);
        return;
      }
      break;
    case KVScaling::token_affine:
      if (is_integer_code(fmt_.code)) {
        decode_token_tile(codes, meta, slot, n, d, fmt_.group, fmt_.bits(), out);
        return;
      }
      break;
    case KVScaling::channel_affine:
      if (fmt_.code == KVCode::u4 || fmt_.code == KVCode::u2) {
        decode_kivi_key_tile(codes, meta, slot, n, d, fmt_.tokens_per_unit, fmt_.bits(), fmt_.meta_bytes_per_unit,
                             out);
        return;
      }
      break;
    default: break;
  }
  for (int32_t t = 0; t < n; ++t) {  // the definition, for any other pair
    fmt_.decode_token(codes, meta, slot + t, head_scale(head), out + static_cast<int64_t>(t) * d);
  }
}

void KVCodec::decode_factored(int32_t head, const uint8_t* codes, const uint8_t* meta, int32_t slot, int32_t n,
                              FactoredTile& t) const {
  const int32_t d = fmt_.head_dim;
  t.group = 0;
  t.per_channel = false;
  if (is_fp8_code(fmt_.code)) {  // raw = the fp8 value (times 2^-8 on the AVX-512 e4m3 route), alpha = scale, beta = 0
    const float scale = head_scale(head);
    float mul = 1.0f;
#ifdef FLASHKV_FP8_AVX512
    if (fp8_avx512_supported() && std::isfinite(scale * 256.0f)) {  // static 1.0 here: any head_dim
      mul = fmt_.code == KVCode::e4m3 ? 256.0f : 1.0f;
      decode_fp8_tile_avx512(codes, meta, slot, n, d, fmt_.code == KVCode::e4m3, false, 1.0f / mul, t.raw);
    } else {
      decode_fp8_tile(codes, meta, slot, n, d, fmt_.code == KVCode::e4m3, false, 1.0f, t.raw);
    }
#else
    decode_fp8_tile(codes, meta, slot, n, d, fmt_.code == KVCode::e4m3, false, 1.0f, t.raw);
#endif
    for (int32_t i = 0; i < n; ++i) {
      float sc = scale;
      if (fmt_.scaling == KVScaling::token_f32) std::memcpy(&sc, meta + static_cast<int64_t>(slot + i) * 4, 4);
      t.alpha[i] = sc * mul;
      t.beta[i] = 0.0f;
    }
    t.group = d;
    return;
  }
  if (fmt_.scaling == KVScaling::token_affine && fmt_.groups_per_token() == 1) {
    // One group per token: raw = codes, alpha = scale, beta = min. Several groups per token (int _gN, KIVI values)
    // keep the full decode: a key score would need one dot product per group, and for values the per-group p weights
    // cost more than the one FMA per element they save.
    codes_tile(codes, slot, n, d, fmt_.bits(), t.raw);
    token_meta_scalar(meta + static_cast<int64_t>(slot) * 4, n, t.alpha, t.beta);
    t.group = fmt_.group;
    return;
  }
  if (fmt_.scaling == KVScaling::channel_affine) {
    // raw = codes, cs / cz = per-channel scale / min, one row per token group of the tile (KIVI §3.2; attention folds
    // cs into q once per group). A tile that starts mid-group and straddles groups keeps the full decode.
    const int32_t G = fmt_.tokens_per_unit;
    if (n > 0 && (slot % G == 0 || slot / G == (slot + n - 1) / G)) {
      codes_tile(codes, slot, n, d, fmt_.bits(), t.raw);
      for (int32_t gi = slot / G, row = 0; gi * G < slot + n; ++gi, ++row) {
        kivi_meta_scalar(meta + static_cast<int64_t>(gi) * fmt_.meta_bytes_per_unit, d, t.cs + static_cast<int64_t>(row) * d,
                         t.cz + static_cast<int64_t>(row) * d);
      }
      t.per_channel = true;
      t.tokens = slot % G == 0 ? G : n;  // a tile inside one group that starts mid-group: one row
      return;
    }
  }
  decode(head, codes, meta, slot, n, t.raw);
}

std::unique_ptr<KVCodec> make_codec(const KVFormatSpec& spec, bool is_key, int32_t head_dim, int32_t page_size,
                                    int32_t num_heads_kv, const std::vector<float>& scales) {
  return std::make_unique<KVCodec>(spec, is_key, head_dim, page_size, num_heads_kv, scales);
}

}  // namespace flashkv::kv
