// The ONE description of a KV storage format, for the host and the device (g++ C++20 and nvcc C++17; no flashkv
// types, nothing beyond <cstdint>/<cstring>/<cmath>, core/host_device.hpp and core/float16.hpp). Every consumer reads it:
//   * the CPU codec (kvcache/format/codec.hpp: encode on append, decode for dequantize() and the generic tile path),
//   * the AVX-512 fused decode kernels (kvcache/attention/decode_fused.hpp: templated on KVCode, affine part by
//     KVScaling),
//   * the CUDA kernels (device code includes this header; the quantized decode of issue #12 templates its mainloop on
//     KVCode / KVScaling and dequantizes with the same functions).
//
// A format is described per cache HALF (K or V) by a POD KVHalfFormat = what one stored code is (KVCode: float32,
// bf16, fp16, fp8 e4m3 / e5m2, unsigned 8/4/2-bit integer) + how its scale / zero point is applied (KVScaling) + the
// group geometry, all derived by describe() from the format id, the group size, K-or-V and head_dim. Sizes in bytes.
//
// STORAGE OF ONE (page, layer, half, kv-head) BLOCK ("page-head"; the page layout is in kvcache/page_layout.hpp):
//   codes  page_size slots × code_bytes, slot-major; one slot = the head_dim codes of one token, PLANAR packed so that
//          unpacking is unit-stride: int4 byte i = element i (low nibble) | element i + d/2 (high nibble); int2 bits
//          2k..2k+1 of byte i = element i + k·d/4; int8 one byte per element; fp16 / bf16 little-endian uint16; fp32
//          little-endian float; fp8 one byte (OCP E4M3FN / E5M2).
//   meta   page_size / tokens_per_unit units × meta_bytes_per_unit bytes; the metadata of slot s is unit s /
//          tokens_per_unit:
//            none           no metadata (fp32 / bf16 / fp16)
//            head_static    no metadata; x̂ = fp8(code) · s_h, s_h the configured static scale of kv-head h
//            token_f32      float32 scale per token:                   x̂ = fp8(code) · scale_t
//            token_affine   per token, per group of `group` channels, [fp16 scale, fp16 min] (4 B per group):
//                           x̂ = min_{t,g} + scale_{t,g} · code,  g = c / group
//            channel_affine per unit of `group` = G tokens (KIVI keys), [fp16 scale × d][fp16 min × d]:
//                           x̂ = min_{u,c} + scale_{u,c} · code,  u = slot / G
//   Integer codes: code = round((x − min) / scale) clamped to [0, 2^bits − 1], min rounded DOWN and scale rounded UP to
//   fp16 so that [min, min + scale·qmax] covers the group and |x − x̂| <= scale / 2 (+ float rounding). An all-equal
//   group has scale 0 and decodes exactly to min. fp8: code = saturate(x / scale) with round-to-nearest-even, never
//   NaN for finite x.
//
// ADDING A FORMAT: a KVFormatId value (= the public flashkv::KVFormat enumerator, include/flashkv/kvcache.hpp), its
// case in describe() below (and a KVCode case in code_value()/encode if it stores a new kind of code), and its name in
// the grammar (kvcache/format/grammar.cpp). The codec, the page layout, the memory accounting, the CPU attention
// (generic tile path; the fused AVX-512 path for every KVCode it knows) and any CUDA kernel templated on KVCode then
// handle it. docs/kvcache.md "Adding a format" counts the files.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/float16.hpp"
#include "core/host_device.hpp"

namespace flashkv::kv {

/// Format ids: the values of the public flashkv::KVFormat (include/flashkv/kvcache.hpp); never renumber.
enum class KVFormatId : int32_t {
  fp32 = 0, bf16 = 1, fp16 = 2, fp8_e4m3 = 3, fp8_e5m2 = 4, int8 = 5, int4 = 6, int4_kivi = 7, int2_kivi = 8,
};
inline constexpr int32_t kNumFormatIds = 9;

/// What one stored code is.
enum class KVCode : uint8_t { f32 = 0, bf16, f16, e4m3, e5m2, u8, u4, u2 };
/// How the format's scale / zero point turns a code value into x̂ (see the file comment).
enum class KVScaling : uint8_t { none = 0, head_static, token_f32, token_affine, channel_affine };

FLASHKV_HD constexpr int32_t code_bits(KVCode c) {
  switch (c) {
    case KVCode::f32: return 32;
    case KVCode::bf16:
    case KVCode::f16: return 16;
    case KVCode::e4m3:
    case KVCode::e5m2:
    case KVCode::u8: return 8;
    case KVCode::u4: return 4;
    case KVCode::u2: return 2;
  }
  return 0;
}
FLASHKV_HD constexpr bool is_integer_code(KVCode c) { return c == KVCode::u8 || c == KVCode::u4 || c == KVCode::u2; }
FLASHKV_HD constexpr bool is_fp8_code(KVCode c) { return c == KVCode::e4m3 || c == KVCode::e5m2; }

// ---- scalar conversions (bit-exact on host and device; the 16-bit ones are core/float16.hpp's) ------------------------
FLASHKV_HD float u32_as_float(uint32_t u) { return flashkv::bits_to_float(u); }
FLASHKV_HD uint32_t float_as_u32(float f) { return flashkv::float_to_bits(f); }
/// Round to nearest, ties to even (the default rounding mode on the host; rintf on the device).
FLASHKV_HD float round_even(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::nearbyint(x);
#endif
}
/// 2^k as a float for k in [-126, 127] (exact).
FLASHKV_HD float pow2f(int k) { return u32_as_float(static_cast<uint32_t>(k + 127) << 23); }

/// bfloat16 / IEEE binary16 bits <-> float, round to nearest even, inf / NaN preserved (fp16 overflow -> ±inf).
FLASHKV_HD float bf16_bits_to_float(uint16_t h) { return flashkv::bf16_to_float(h); }
FLASHKV_HD uint16_t float_to_bf16_bits(float f) { return flashkv::float_to_bf16(f); }
FLASHKV_HD float fp16_bits_to_float(uint16_t h) { return flashkv::fp16_to_float(h); }
FLASHKV_HD uint16_t float_to_fp16_bits(float f) { return flashkv::float_to_fp16(f); }
/// fp16 rounded toward −inf / +inf (finite x): min rounded down and scale rounded up keep the group covered. The `_sw`
/// forms are the portable definitions; the device uses the hardware's directed roundings (cvt.rm / cvt.rp.f16.f32),
/// the same function on every non-NaN input (tests/cuda/test_kv_traits_cuda.cpp compares them over all 2^32 floats).
FLASHKV_HD uint16_t fp16_bits_round_down_sw(float x) {
  uint16_t h = float_to_fp16_bits(x);
  if (fp16_bits_to_float(h) > x) h = h == 0x0000u ? 0x8001u : ((h & 0x8000u) ? h + 1 : h - 1);
  return h;
}
FLASHKV_HD uint16_t fp16_bits_round_up_sw(float x) {
  uint16_t h = float_to_fp16_bits(x);
  if (fp16_bits_to_float(h) < x) h = h == 0x8000u ? 0x0001u : ((h & 0x8000u) ? h - 1 : h + 1);
  return h;
}
FLASHKV_HD uint16_t fp16_bits_round_down(float x) {
#if defined(__CUDA_ARCH__)
  uint16_t h;
  asm("cvt.rm.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
#else
  return fp16_bits_round_down_sw(x);
#endif
}
FLASHKV_HD uint16_t fp16_bits_round_up(float x) {
#if defined(__CUDA_ARCH__)
  uint16_t h;
  asm("cvt.rp.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
#else
  return fp16_bits_round_up_sw(x);
#endif
}
/// fp16 bits -> float for finite values (the metadata asym_params makes): exact either way; the device converts in
/// hardware (cvt.f32.f16) instead of the portable bit manipulation (a loop for subnormals).
FLASHKV_HD float fp16_finite_bits_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#else
  return fp16_bits_to_float(h);
#endif
}

/// OCP FP8 parameters: E4M3FN (max 448, NaN = S.1111.111) or E5M2 (max 57344).
struct Fp8Spec {
  int m, bias, max_code;
  float max_value;
};
FLASHKV_HD constexpr Fp8Spec fp8_spec(bool e4m3) {
  return e4m3 ? Fp8Spec{3, 7, 0x7E, 448.0f} : Fp8Spec{2, 15, 0x7B, 57344.0f};
}
/// fp8 code -> float (exact; NaN for the NaN codes).
FLASHKV_HD float fp8_bits_to_float(uint8_t code, bool e4m3) {
  const Fp8Spec p = fp8_spec(e4m3);
  const int c = code & 0x7F, e = c >> p.m, man = c & ((1 << p.m) - 1);
  float v;
  if (c > p.max_code) {
    v = u32_as_float(0x7fc00000u);
  } else if (e == 0) {
    v = static_cast<float>(man) * pow2f(1 - p.bias - p.m);
  } else {
    v = static_cast<float>((1 << p.m) + man) * pow2f(e - p.bias - p.m);
  }
  return (code & 0x80) ? -v : v;
}
/// float -> fp8 code, round to nearest even, saturating to ±max (finite x never gives NaN; NaN gives the NaN code).
/// float_to_fp8_bits_sw is the portable definition; on sm_89+ the device converts in hardware
/// (cvt.rn.satfinite.e4m3x2 / e5m2x2.f32), the same function on every non-NaN input (all 2^32 floats compared in
/// tests/cuda/test_kv_traits_cuda.cpp; NaN gives a NaN code either way).
FLASHKV_HD uint8_t float_to_fp8_bits_sw(float x, bool e4m3) {
  const Fp8Spec p = fp8_spec(e4m3);
  const uint32_t u = float_as_u32(x);
  const uint8_t sign = (u & 0x80000000u) ? 0x80 : 0x00;
  const uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7F);
  const float a = u32_as_float(absu);
  if (a >= p.max_value) return static_cast<uint8_t>(sign | p.max_code);
  const int fe = static_cast<int>(absu >> 23);
  if (fe == 0) return sign;                  // zero or a float subnormal: far below half the smallest fp8 step
  const int e = fe - 127, emin = 1 - p.bias;  // a in [2^e, 2^(e+1))
  int code;
  if (e < emin) {  // fp8 subnormal grid, quantum 2^(emin − m); q == 2^m is the smallest normal (same code)
    code = static_cast<int>(round_even(a * pow2f(p.m - emin)));
  } else {         // q in [2^m, 2^(m+1)]; q == 2^(m+1) carries into the exponent
    const int q = static_cast<int>(round_even(a * pow2f(p.m - e)));
    code = ((e + p.bias) << p.m) + (q - (1 << p.m));
  }
  return static_cast<uint8_t>(sign | (code < p.max_code ? code : p.max_code));
}

FLASHKV_HD uint8_t float_to_fp8_bits(float x, bool e4m3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t r;
  if (e4m3) {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x));
  } else {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x));
  }
  return static_cast<uint8_t>(r & 0xffu);
#else
  return float_to_fp8_bits_sw(x, e4m3);
#endif
}

// ---- one half's format ----------------------------------------------------------------------------------------------
struct KVHalfFormat {
  KVCode code = KVCode::bf16;
  KVScaling scaling = KVScaling::none;
  int32_t head_dim = 0;
  /// token_affine: channels per group (divides head_dim); channel_affine: tokens per unit (G); else 0.
  int32_t group = 0;
  int32_t code_bytes = 0;           ///< bytes of one token-head row of codes = head_dim · bits / 8
  int32_t tokens_per_unit = 1;      ///< tokens encoded together and sharing metadata (G for channel_affine, else 1)
  int32_t meta_bytes_per_unit = 0;  ///< metadata bytes of one unit of one kv-head

  FLASHKV_HD constexpr int32_t bits() const { return code_bits(code); }
  FLASHKV_HD constexpr int32_t qmax() const { return is_integer_code(code) ? (1 << code_bits(code)) - 1 : 0; }
  /// Channel groups per token (token_affine), else 1.
  FLASHKV_HD constexpr int32_t groups_per_token() const {
    return scaling == KVScaling::token_affine ? head_dim / group : 1;
  }
  FLASHKV_HD constexpr int64_t meta_bytes_per_page_head(int32_t page_size) const {
    return static_cast<int64_t>(page_size / tokens_per_unit) * meta_bytes_per_unit;
  }
  /// Byte offset, inside the page-head metadata, of the unit holding slot `slot`.
  FLASHKV_HD constexpr int64_t meta_offset(int32_t slot) const {
    return static_cast<int64_t>(slot / tokens_per_unit) * meta_bytes_per_unit;
  }
  FLASHKV_HD constexpr bool quantized() const {
    return code != KVCode::f32 && code != KVCode::bf16 && code != KVCode::f16;
  }

  /// The stored code of channel c of one token row (planar unpacking; floats return their raw bits).
  FLASHKV_HD uint32_t raw(const uint8_t* row, int32_t c) const {
    switch (code) {
      case KVCode::f32: {
        uint32_t v;
        memcpy(&v, row + 4 * c, 4);
        return v;
      }
      case KVCode::bf16:
      case KVCode::f16: return static_cast<uint32_t>(row[2 * c]) | (static_cast<uint32_t>(row[2 * c + 1]) << 8);
      case KVCode::e4m3:
      case KVCode::e5m2:
      case KVCode::u8: return row[c];
      case KVCode::u4: {
        const int32_t h = head_dim / 2;
        return c < h ? (row[c] & 0xFu) : (row[c - h] >> 4);
      }
      case KVCode::u2: {
        const int32_t q = head_dim / 4, k = c / q;
        return (row[c - k * q] >> (2 * k)) & 3u;
      }
    }
    return 0;
  }
  /// The number a code stands for before scaling: the float value, the fp8 value, or the integer code.
  FLASHKV_HD float code_value(uint32_t r) const {
    switch (code) {
      case KVCode::f32: return u32_as_float(r);
      case KVCode::bf16: return bf16_bits_to_float(static_cast<uint16_t>(r));
      case KVCode::f16: return fp16_bits_to_float(static_cast<uint16_t>(r));
      case KVCode::e4m3: return fp8_bits_to_float(static_cast<uint8_t>(r), true);
      case KVCode::e5m2: return fp8_bits_to_float(static_cast<uint8_t>(r), false);
      default: return static_cast<float>(r);
    }
  }
  /// x̂ of (slot, channel c) of one page-head. codes / meta: the page-head's code and metadata blocks; head_scale: the
  /// static scale of this kv-head (head_static), ignored otherwise.
  FLASHKV_HD float dequant(const uint8_t* codes, const uint8_t* meta, int32_t slot, int32_t c,
                           float head_scale) const {
    const float v = code_value(raw(codes + static_cast<int64_t>(slot) * code_bytes, c));
    const uint8_t* m = meta + meta_offset(slot);
    switch (scaling) {
      case KVScaling::none: return v;
      case KVScaling::head_static: return v * head_scale;
      case KVScaling::token_f32: {
        float s;
        memcpy(&s, m, 4);
        return v * s;
      }
      case KVScaling::token_affine: {
        const uint8_t* g = m + 4 * (c / group);
        return affine(g, g + 2, v);
      }
      case KVScaling::channel_affine: return affine(m + 2 * c, m + 2 * (head_dim + c), v);
    }
    return v;
  }
  /// x̂ of one token row (head_dim values) into out.
  FLASHKV_HD void decode_token(const uint8_t* codes, const uint8_t* meta, int32_t slot, float head_scale,
                               float* out) const {
    for (int32_t c = 0; c < head_dim; ++c) out[c] = dequant(codes, meta, slot, c, head_scale);
  }

  /// Encodes one unit — tokens_per_unit rows x[t·head_dim + c] (float, finite) — into slots [slot, slot +
  /// tokens_per_unit) of one page-head (slot a multiple of tokens_per_unit). `tmp`: scratch of head_dim ·
  /// tokens_per_unit bytes (integer codes before packing). head_scale as in dequant().
  FLASHKV_HD void encode_unit(const float* x, uint8_t* codes, uint8_t* meta, int32_t slot, float head_scale,
                              uint8_t* tmp) const {
    uint8_t* m = meta + meta_offset(slot);
    const int32_t d = head_dim;
    if (is_integer_code(code)) {
      if (scaling == KVScaling::channel_affine) {  // per channel over the unit's G tokens (KIVI keys)
        const int32_t G = tokens_per_unit;
        for (int32_t c = 0; c < d; ++c) {
          uint16_t sc, mn;
          quantize_asym(x + c, G, d, tmp + c, d, &sc, &mn);
          memcpy(m + 2 * c, &sc, 2);
          memcpy(m + 2 * (d + c), &mn, 2);
        }
        for (int32_t t = 0; t < G; ++t) pack(tmp + static_cast<int64_t>(t) * d, codes + static_cast<int64_t>(slot + t) * code_bytes);
      } else {  // token_affine: per token, per group of `group` channels
        const int32_t ng = d / group;
        for (int32_t g = 0; g < ng; ++g) {
          uint16_t sc, mn;
          quantize_asym(x + g * group, group, 1, tmp + g * group, 1, &sc, &mn);
          memcpy(m + 4 * g, &sc, 2);
          memcpy(m + 4 * g + 2, &mn, 2);
        }
        pack(tmp, codes + static_cast<int64_t>(slot) * code_bytes);
      }
      return;
    }
    uint8_t* row = codes + static_cast<int64_t>(slot) * code_bytes;
    switch (code) {
      case KVCode::f32: memcpy(row, x, static_cast<size_t>(d) * 4); return;
      case KVCode::bf16:
      case KVCode::f16:
        for (int32_t c = 0; c < d; ++c) {
          const uint16_t h = code == KVCode::bf16 ? float_to_bf16_bits(x[c]) : float_to_fp16_bits(x[c]);
          row[2 * c] = static_cast<uint8_t>(h & 0xFF);
          row[2 * c + 1] = static_cast<uint8_t>(h >> 8);
        }
        return;
      default: {  // fp8: static scale per kv-head, or a dynamic float32 scale per token = amax / fp8_max
        const bool e4m3 = code == KVCode::e4m3;
        float scale = head_scale;
        if (scaling == KVScaling::token_f32) {
          float amax = 0.0f;
          for (int32_t c = 0; c < d; ++c) {
            const float a = x[c] < 0.0f ? -x[c] : x[c];
            amax = a > amax ? a : amax;
          }
          scale = fp8_token_scale(amax, e4m3);
          memcpy(m, &scale, 4);
        }
        const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
        for (int32_t c = 0; c < d; ++c) row[c] = float_to_fp8_bits(x[c] * inv, e4m3);
        return;
      }
    }
  }

  /// Asymmetric uniform quantization of n values (stride `stride`) with this format's qmax: codes (one per byte, stride
  /// code_stride), fp16 scale and min bits (min rounded down, scale rounded up).
  FLASHKV_HD void quantize_asym(const float* x, int32_t n, int32_t stride, uint8_t* out, int32_t code_stride,
                                uint16_t* scale_bits, uint16_t* min_bits) const {
    quantize_asym_n(x, n, stride, qmax(), out, code_stride, scale_bits, min_bits);
  }
  FLASHKV_HD static void quantize_asym_n(const float* x, int32_t n, int32_t stride, int32_t qmax, uint8_t* out,
                                         int32_t code_stride, uint16_t* scale_bits, uint16_t* min_bits) {
    float mn = x[0], mx = x[0];
    for (int32_t i = 1; i < n; ++i) {
      const float v = x[static_cast<int64_t>(i) * stride];
      mn = v < mn ? v : mn;
      mx = v > mx ? v : mx;
    }
    const AsymParams a = asym_params(mn, mx, qmax);
    for (int32_t i = 0; i < n; ++i) out[static_cast<int64_t>(i) * code_stride] = asym_code(x[static_cast<int64_t>(i) * stride], a, qmax);
    *scale_bits = a.scale_bits;
    *min_bits = a.min_bits;
  }
  /// The pieces of quantize_asym_n, for encoders that find a group's extremes otherwise (the CUDA warp append): the
  /// fp16 [scale, min] of a group with extremes mn <= mx and the reciprocal that quantizes it, and one code.
  struct AsymParams {
    uint16_t scale_bits, min_bits;
    float minf, inv;
  };
  FLASHKV_HD static AsymParams asym_params(float mn, float mx, int32_t qmax) {
    AsymParams a;
    a.min_bits = fp16_bits_round_down(mn);
    a.minf = fp16_finite_bits_to_float(a.min_bits);
    a.scale_bits = fp16_bits_round_up((mx - a.minf) / static_cast<float>(qmax));
    const float scf = fp16_finite_bits_to_float(a.scale_bits);
    a.inv = scf > 0.0f ? 1.0f / scf : 0.0f;
    return a;
  }
  FLASHKV_HD static uint8_t asym_code(float x, const AsymParams& a, int32_t qmax) {
    float q = round_even((x - a.minf) * a.inv);
    q = q < 0.0f ? 0.0f : (q > static_cast<float>(qmax) ? static_cast<float>(qmax) : q);
    return static_cast<uint8_t>(q);
  }
  /// The per-token dynamic fp8 scale of a row with max |x| = amax.
  FLASHKV_HD static float fp8_token_scale(float amax, bool e4m3) { return amax / fp8_spec(e4m3).max_value; }
  /// Packs head_dim integer codes (one per byte) into one row (planar, see the file comment).
  FLASHKV_HD void pack(const uint8_t* c8, uint8_t* row) const { pack_codes_n(c8, head_dim, code_bits(code), row); }
  FLASHKV_HD static void pack_codes_n(const uint8_t* c8, int32_t n, int32_t bits, uint8_t* row) {
    if (bits == 8) {
      memcpy(row, c8, static_cast<size_t>(n));
      return;
    }
    for (int32_t i = 0; i < n * bits / 8; ++i) row[i] = pack_byte(c8, n, bits, i);
  }
  /// Byte i of a packed row of n codes (one per byte in c8) of `bits` bits (planar, see the file comment).
  FLASHKV_HD static uint8_t pack_byte(const uint8_t* c8, int32_t n, int32_t bits, int32_t i) {
    if (bits == 8) return c8[i];
    if (bits == 4) return static_cast<uint8_t>((c8[i] & 0xF) | ((c8[i + n / 2] & 0xF) << 4));
    const int32_t q = n / 4;
    return static_cast<uint8_t>((c8[i] & 3) | ((c8[i + q] & 3) << 2) | ((c8[i + 2 * q] & 3) << 4) |
                                ((c8[i + 3 * q] & 3) << 6));
  }

 private:
  FLASHKV_HD static float affine(const uint8_t* scale, const uint8_t* min, float v) {
    uint16_t s, z;
    memcpy(&s, scale, 2);
    memcpy(&z, min, 2);
#if defined(__CUDA_ARCH__)
    return __fadd_rn(fp16_bits_to_float(z), __fmul_rn(fp16_bits_to_float(s), v));  // no contraction: = the host
#else
    return fp16_bits_to_float(z) + fp16_bits_to_float(s) * v;
#endif
  }
};

/// The description of one half: format id (KVFormatId), fp8 dynamic scale, group size (0 = the format's default:
/// head_dim for int8 / int4, 32 for KIVI), key or value half, head_dim. Returns a zeroed format (code_bytes == 0) for an
/// unknown id; the grammar (grammar.cpp) validates the combination first and names what is wrong.
FLASHKV_HD constexpr KVHalfFormat describe(KVFormatId id, bool dynamic_scale, int32_t group_size, bool is_key,
                                           int32_t head_dim) {
  KVHalfFormat f;
  f.head_dim = head_dim;
  switch (id) {
    case KVFormatId::fp32: f.code = KVCode::f32; break;
    case KVFormatId::bf16: f.code = KVCode::bf16; break;
    case KVFormatId::fp16: f.code = KVCode::f16; break;
    case KVFormatId::fp8_e4m3:
    case KVFormatId::fp8_e5m2:
      f.code = id == KVFormatId::fp8_e4m3 ? KVCode::e4m3 : KVCode::e5m2;
      f.scaling = dynamic_scale ? KVScaling::token_f32 : KVScaling::head_static;
      f.meta_bytes_per_unit = dynamic_scale ? 4 : 0;
      break;
    case KVFormatId::int8:
    case KVFormatId::int4:
      f.code = id == KVFormatId::int8 ? KVCode::u8 : KVCode::u4;
      f.scaling = KVScaling::token_affine;
      f.group = group_size > 0 ? group_size : head_dim;
      f.meta_bytes_per_unit = f.group > 0 ? (head_dim / f.group) * 4 : 0;
      break;
    case KVFormatId::int4_kivi:
    case KVFormatId::int2_kivi: {
      const int32_t g = group_size > 0 ? group_size : 32;
      f.code = id == KVFormatId::int4_kivi ? KVCode::u4 : KVCode::u2;
      if (is_key) {  // KIVI §3.2: keys per channel over G tokens
        f.scaling = KVScaling::channel_affine;
        f.group = g;
        f.tokens_per_unit = g;
        f.meta_bytes_per_unit = head_dim * 4;
      } else {       // values per token over G channels
        f.scaling = KVScaling::token_affine;
        f.group = g;
        f.meta_bytes_per_unit = (head_dim / g) * 4;
      }
      break;
    }
    default: return KVHalfFormat{};
  }
  f.code_bytes = head_dim * code_bits(f.code) / 8;
  return f;
}

}  // namespace flashkv::kv
