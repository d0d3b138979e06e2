// Vectorized decode loops of the integer formats (codec_fast.hpp): asymmetric uniform int8/int4/int2 per (token,
// kv-head, channel group) — also KIVI's per-token V — and KIVI's per-channel K over groups of G tokens (Liu et al.,
// "KIVI", arXiv 2402.02750, §3.2–3.3). Metadata fp16 (scale, min); x̂ = min + scale · code. They return what
// KVHalfFormat::dequant (format/traits.hpp) defines; layout there.
#include <algorithm>
#include <array>
#include <cstring>

#include "core/float16.hpp"
#include "cpu/tile_math.hpp"
#include "kvcache/format/codec_fast.hpp"

namespace flashkv::kv {

namespace {

/// fp16 bits -> float for finite values (normals and subnormals exact; the metadata of written slots is always finite):
/// shift exponent+mantissa into float position and rebias by multiplying with 2^112. Branch-free, vectorizable.
inline float half_to_float_finite(uint16_t h) {
  const float mag = bits_to_float(static_cast<uint32_t>(h & 0x7fffu) << 13) * 5.192296858534828e33f;  // 2^112
  return bits_to_float(float_to_bits(mag) | (static_cast<uint32_t>(h & 0x8000u) << 16));
}

inline void load_meta(const uint8_t* p, float* scale, float* mn) {
  uint16_t s, m;
  std::memcpy(&s, p, 2);
  std::memcpy(&m, p + 2, 2);
  *scale = half_to_float_finite(s);
  *mn = half_to_float_finite(m);
}

}  // namespace

/// Per-token codes of one tile: slots [slot, slot + n), groups of `group` channels with [fp16 scale, fp16 min] each.
/// One call per tile (compiled per ISA, see FLASHKV_CPU_CLONES) so the inner loops inline and vectorize.
template <int kBits, int kD>
FLASHKV_ALWAYS_INLINE void decode_token_tile_bits(const uint8_t* __restrict codes, const uint8_t* __restrict meta,
                                                  int32_t slot, int32_t n, int32_t d_rt, int32_t group,
                                                  float* __restrict out) {
  // Fused unpack + affine, one unit-stride loop per (plane, group) chunk: with the planar layout channel c lives in
  // plane p = c / plane_len at bits [p·kBits, (p + 1)·kBits) of byte c − p·plane_len. kD > 0 fixes head_dim at
  // compile time (constant trip counts: no loop epilogues), kD = 0 is the generic path.
  constexpr int32_t kPlanes = 8 / kBits;
  constexpr uint32_t kMask = (1u << kBits) - 1u;
  const int32_t d = kD > 0 ? kD : d_rt;
  const int32_t ng = d / group, plane_len = d / kPlanes;
  const int64_t cb = static_cast<int64_t>(d) * kBits / 8;
  for (int32_t t = 0; t < n; ++t) {
    const uint8_t* src = codes + (slot + t) * cb;
    const uint8_t* m = meta + static_cast<int64_t>(slot + t) * ng * 4;
    float* o = out + static_cast<int64_t>(t) * d;
    if (ng == 1) {  // one (scale, min) per token-head: the common per-token-head formats
      float scale, mn;
      load_meta(m, &scale, &mn);
      for (int32_t p = 0; p < kPlanes; ++p) {
        float* op = o + p * plane_len;
        for (int32_t c = 0; c < plane_len; ++c) {
          op[c] = mn + scale * static_cast<float>((static_cast<uint32_t>(src[c]) >> (p * kBits)) & kMask);
        }
      }
      continue;
    }
    if (group == 32 && plane_len % 32 == 0) {  // KIVI-V / _g32: whole 32-channel groups inside each plane
      for (int32_t p = 0; p < kPlanes; ++p) {
        for (int32_t c0 = p * plane_len; c0 < (p + 1) * plane_len; c0 += 32) {
          float scale, mn;
          load_meta(m + (c0 / 32) * 4, &scale, &mn);
          const uint8_t* sp = src + (c0 - p * plane_len);
          float* og = o + c0;
          for (int32_t c = 0; c < 32; ++c) {
            og[c] = mn + scale * static_cast<float>((static_cast<uint32_t>(sp[c]) >> (p * kBits)) & kMask);
          }
        }
      }
      continue;
    }
    for (int32_t p = 0; p < kPlanes; ++p) {
      const int32_t pc0 = p * plane_len, pc1 = pc0 + plane_len;
      for (int32_t c0 = pc0; c0 < pc1;) {
        const int32_t g = c0 / group;
        const int32_t c1 = std::min(pc1, (g + 1) * group);
        float scale, mn;
        load_meta(m + g * 4, &scale, &mn);
        const uint8_t* sp = src - pc0;
        for (int32_t c = c0; c < c1; ++c) {
          o[c] = mn + scale * static_cast<float>((static_cast<uint32_t>(sp[c]) >> (p * kBits)) & kMask);
        }
        c0 = c1;
      }
    }
  }
}

template <int kBits>
FLASHKV_ALWAYS_INLINE void decode_token_tile_d(const uint8_t* codes, const uint8_t* meta, int32_t slot, int32_t n,
                                               int32_t d, int32_t group, float* out) {
  if (d == 128) {
    decode_token_tile_bits<kBits, 128>(codes, meta, slot, n, d, group, out);
  } else if (d == 64) {
    decode_token_tile_bits<kBits, 64>(codes, meta, slot, n, d, group, out);
  } else {
    decode_token_tile_bits<kBits, 0>(codes, meta, slot, n, d, group, out);
  }
}

FLASHKV_CPU_CLONES
void decode_token_tile(const uint8_t* codes, const uint8_t* meta, int32_t slot, int32_t n, int32_t d, int32_t group,
                       int32_t bits, float* out) {
  if (bits == 8) {
    decode_token_tile_d<8>(codes, meta, slot, n, d, group, out);
  } else if (bits == 4) {
    decode_token_tile_d<4>(codes, meta, slot, n, d, group, out);
  } else {
    decode_token_tile_d<2>(codes, meta, slot, n, d, group, out);
  }
}

/// KIVI key codes of one tile: per-channel [fp16 scale × d][fp16 min × d] per group of G tokens.
template <int kBits, int kD>
FLASHKV_ALWAYS_INLINE void decode_kivi_key_tile_t(const uint8_t* __restrict codes, const uint8_t* __restrict meta,
                                                  int32_t slot, int32_t n, int32_t d_rt, int32_t G,
                                                  int64_t meta_group_bytes, float* __restrict out) {
  constexpr int32_t kPlanes = 8 / kBits;
  constexpr uint32_t kMask = (1u << kBits) - 1u;
  const int32_t d = kD > 0 ? kD : d_rt;
  const int64_t cb = static_cast<int64_t>(d) * kBits / 8;
  const int32_t plane_len = d / kPlanes;
  alignas(64) float sc[256], mn[256];
  int32_t cur_group = -1;
  for (int32_t t = 0; t < n; ++t) {
    const int32_t gi = (slot + t) / G;
    if (gi != cur_group) {
      kivi_meta_scalar(meta + static_cast<int64_t>(gi) * meta_group_bytes, d, sc, mn);
      cur_group = gi;
    }
    float* o = out + static_cast<int64_t>(t) * d;
    const uint8_t* src = codes + (slot + t) * cb;
    for (int32_t p = 0; p < kPlanes; ++p) {
      float* op = o + p * plane_len;
      const float* sp = sc + p * plane_len;
      const float* mp = mn + p * plane_len;
      for (int32_t c = 0; c < plane_len; ++c) {
        op[c] = mp[c] + sp[c] * static_cast<float>((static_cast<uint32_t>(src[c]) >> (p * kBits)) & kMask);
      }
    }
  }
}

FLASHKV_CPU_CLONES
void decode_kivi_key_tile(const uint8_t* codes, const uint8_t* meta, int32_t slot, int32_t n, int32_t d, int32_t G,
                          int32_t bits, int64_t meta_group_bytes, float* out) {
  if (bits == 4) {
    if (d == 128) {
      decode_kivi_key_tile_t<4, 128>(codes, meta, slot, n, d, G, meta_group_bytes, out);
    } else {
      decode_kivi_key_tile_t<4, 0>(codes, meta, slot, n, d, G, meta_group_bytes, out);
    }
  } else {
    if (d == 128) {
      decode_kivi_key_tile_t<2, 128>(codes, meta, slot, n, d, G, meta_group_bytes, out);
    } else {
      decode_kivi_key_tile_t<2, 0>(codes, meta, slot, n, d, G, meta_group_bytes, out);
    }
  }
}

/// Raw codes of one tile as floats (no affine): out[t][c] = code of channel c. Planar unpack as above.
template <int kBits, int kD>
FLASHKV_ALWAYS_INLINE void codes_tile_t(const uint8_t* __restrict codes, int32_t slot, int32_t n, int32_t d_rt,
                                        float* __restrict out) {
  constexpr int32_t kPlanes = 8 / kBits;
  constexpr uint32_t kMask = (1u << kBits) - 1u;
  const int32_t d = kD > 0 ? kD : d_rt;
  const int64_t cb = static_cast<int64_t>(d) * kBits / 8;
  const int32_t plane_len = d / kPlanes;
  for (int32_t t = 0; t < n; ++t) {
    const uint8_t* src = codes + (slot + t) * cb;
    float* o = out + static_cast<int64_t>(t) * d;
    for (int32_t p = 0; p < kPlanes; ++p) {
      float* op = o + p * plane_len;
      for (int32_t c = 0; c < plane_len; ++c) {
        op[c] = static_cast<float>((static_cast<uint32_t>(src[c]) >> (p * kBits)) & kMask);
      }
    }
  }
}

FLASHKV_CPU_CLONES
void codes_tile(const uint8_t* codes, int32_t slot, int32_t n, int32_t d, int32_t bits, float* out) {
  if (bits == 8) {
    if (d == 128) { codes_tile_t<8, 128>(codes, slot, n, d, out); } else { codes_tile_t<8, 0>(codes, slot, n, d, out); }
  } else if (bits == 4) {
    if (d == 128) { codes_tile_t<4, 128>(codes, slot, n, d, out); } else { codes_tile_t<4, 0>(codes, slot, n, d, out); }
  } else {
    if (d == 128) { codes_tile_t<2, 128>(codes, slot, n, d, out); } else { codes_tile_t<2, 0>(codes, slot, n, d, out); }
  }
}

void token_meta_scalar(const uint8_t* meta, int32_t n, float* alpha, float* beta) {
  for (int32_t i = 0; i < n; ++i) load_meta(meta + 4 * i, alpha + i, beta + i);
}

void kivi_meta_scalar(const uint8_t* meta, int32_t d, float* cs, float* cz) {
  for (int32_t c = 0; c < d; ++c) {
    uint16_t sb, zb;
    std::memcpy(&sb, meta + 2 * c, 2);
    std::memcpy(&zb, meta + 2 * (d + c), 2);
    cs[c] = half_to_float_finite(sb);
    cz[c] = half_to_float_finite(zb);
  }
}

}  // namespace flashkv::kv
