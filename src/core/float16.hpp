// Scalar float16 / bfloat16 <-> float32 conversions (IEEE round-to-nearest-even; NaN and Inf preserved), bit-exact
// on the host and the device (FLASHKV_HD: integer arithmetic and exact float steps only; the KV format trait,
// src/kvcache/format/traits.hpp, encodes and decodes with them in both). The CUDA kernels' own conversions use
// cuda_fp16.h / cuda_bf16.h. Storage types are plain uint16_t bit patterns.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/host_device.hpp"

namespace flashkv {

FLASHKV_HD float bits_to_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
FLASHKV_HD uint32_t float_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/// bfloat16 bits -> float (exact).
FLASHKV_HD float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

/// float -> bfloat16 bits, round to nearest even; NaN stays NaN (quiet).
FLASHKV_HD uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

/// IEEE binary16 bits -> float (exact, subnormals included).
FLASHKV_HD float fp16_to_float(uint16_t h) {
  uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while ((man & 0x400u) == 0) {
        man <<= 1;
        --exp;
      }
      man &= 0x3ffu;
      u = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  return bits_to_float(u);
}

/// float -> IEEE binary16 bits, round to nearest even; overflow -> ±Inf; NaN stays NaN.
FLASHKV_HD uint16_t float_to_fp16(float f) {
  uint32_t u = float_to_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (absu > 0x7f800000u ? 0x200u : 0u));
  if (absu >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520 -> Inf
  if (absu < 0x38800000u) {  // result is subnormal or zero: scale into integer units of 2^-24
    // value = absf; units = value / 2^-24, round half even
    float absf = bits_to_float(absu);
    float units = absf * 16777216.0f;  // 2^24, exact
    // round half to even on the float
    uint32_t iu = static_cast<uint32_t>(units);
    float frac = units - static_cast<float>(iu);
    if (frac > 0.5f || (frac == 0.5f && (iu & 1u))) ++iu;
    return static_cast<uint16_t>(sign | iu);
  }
  uint32_t exp = ((absu >> 23) - 127 + 15);
  uint32_t man = absu & 0x7fffffu;
  uint32_t half = (exp << 10) | (man >> 13);
  uint32_t rest = man & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

}  // namespace flashkv
