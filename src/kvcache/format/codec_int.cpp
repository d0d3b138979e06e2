// Integer codecs: asymmetric uniform int8/int4 per (token, kv-head, channel group) — also KIVI's per-token V — and
// KIVI's per-channel K over groups of G tokens (Liu et al., "KIVI", arXiv 2402.02750, §3.2–3.3). Metadata is fp16
// (scale, min); x̂ = min + scale · code, code in [0, 2^bits − 1]. Layout: see codec.hpp.
#include <algorithm>
#include <array>
#include <cstring>

#include "core/float16.hpp"
#include "cpu/tile_math.hpp"
#include "kvcache/format/codec.hpp"

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
      const uint8_t* m = meta + static_cast<int64_t>(gi) * meta_group_bytes;
      for (int32_t c = 0; c < d; ++c) {
        uint16_t s, z;
        std::memcpy(&s, m + 2 * c, 2);
        std::memcpy(&z, m + 2 * (d + c), 2);
        sc[c] = half_to_float_finite(s);
        mn[c] = half_to_float_finite(z);
      }
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

/// int8 / int4 / KIVI-V: per token, groups of `group` channels, [fp16 scale, fp16 min] per group.
class IntTokenCodec final : public KVCodec {
 public:
  IntTokenCodec(const KVFormatSpec& s, bool k, int32_t d, int32_t p, int32_t group)
      : KVCodec(s, k, d, p), bits_(s.code_bits()), group_(group), qmax_((1 << s.code_bits()) - 1) {}

  void encode(int32_t, const float* x, int32_t n, uint8_t* codes, uint8_t* meta, int32_t slot) const override {
    const int32_t ng = head_dim_ / group_;
    const int64_t cb = bytes_.code_bytes_per_token_head;
    std::array<uint8_t, 256> tmp{};
    for (int32_t t = 0; t < n; ++t) {
      const float* row = x + static_cast<int64_t>(t) * head_dim_;
      uint8_t* m = meta + static_cast<int64_t>(slot + t) * ng * 4;
      for (int32_t g = 0; g < ng; ++g) {
        uint16_t sc, mn;
        quantize_asym(row + g * group_, group_, 1, qmax_, tmp.data() + g * group_, 1, &sc, &mn);
        std::memcpy(m + g * 4, &sc, 2);
        std::memcpy(m + g * 4 + 2, &mn, 2);
      }
      pack_codes(tmp.data(), head_dim_, bits_, codes + (slot + t) * cb);
    }
  }

  void decode(int32_t, const uint8_t* codes, const uint8_t* meta, int32_t slot, int32_t n,
              float* out) const override {
    decode_token_tile(codes, meta, slot, n, head_dim_, group_, bits_, out);
  }

  /// One group per token: raw = codes, alpha = scale, beta = min. Several groups per token (int _gN, KIVI values) keep
  /// the full decode: a key score would need one dot product per group, and for values the per-group p weights cost
  /// more than the one FMA per element they save (measured: KIVI-V 0.95× vs 1.17× bf16 speed).
  void decode_factored(int32_t head, const uint8_t* codes, const uint8_t* meta, int32_t slot, int32_t n,
                       FactoredTile& t) const override {
    const int32_t ng = head_dim_ / group_;
    if (ng > 1) {
      KVCodec::decode_factored(head, codes, meta, slot, n, t);
      return;
    }
    codes_tile(codes, slot, n, head_dim_, bits_, t.raw);
    const uint8_t* m = meta + static_cast<int64_t>(slot) * ng * 4;
    for (int32_t i = 0; i < n; ++i) {
      for (int32_t g = 0; g < ng; ++g) load_meta(m + 4 * (i * ng + g), t.alpha + g * n + i, t.beta + g * n + i);
    }
    t.group = group_;
    t.per_channel = false;
  }

 private:
  int32_t bits_, group_, qmax_;
};

/// KIVI keys: per channel over G consecutive tokens; metadata per group [fp16 scale × d][fp16 min × d].
class KiviKeyCodec final : public KVCodec {
 public:
  KiviKeyCodec(const KVFormatSpec& s, int32_t d, int32_t p)
      : KVCodec(s, true, d, p), bits_(s.code_bits()), qmax_((1 << s.code_bits()) - 1) {}

  void encode(int32_t, const float* x, int32_t n, uint8_t* codes, uint8_t* meta, int32_t slot) const override {
    const int32_t G = bytes_.tokens_per_group;
    const int64_t cb = bytes_.code_bytes_per_token_head;
    std::vector<uint8_t> tmp(static_cast<size_t>(G) * head_dim_);
    for (int32_t g0 = 0; g0 < n; g0 += G) {
      uint8_t* m = meta + static_cast<int64_t>((slot + g0) / G) * bytes_.meta_bytes_per_group;
      for (int32_t c = 0; c < head_dim_; ++c) {
        uint16_t sc, mn;
        quantize_asym(x + static_cast<int64_t>(g0) * head_dim_ + c, G, head_dim_, qmax_, tmp.data() + c, head_dim_,
                      &sc, &mn);
        std::memcpy(m + 2 * c, &sc, 2);
        std::memcpy(m + 2 * (head_dim_ + c), &mn, 2);
      }
      for (int32_t t = 0; t < G; ++t) {
        pack_codes(tmp.data() + static_cast<int64_t>(t) * head_dim_, head_dim_, bits_, codes + (slot + g0 + t) * cb);
      }
    }
  }

  void decode(int32_t, const uint8_t* codes, const uint8_t* meta, int32_t slot, int32_t n,
              float* out) const override {
    decode_kivi_key_tile(codes, meta, slot, n, head_dim_, bytes_.tokens_per_group, bits_, bytes_.meta_bytes_per_group,
                         out);
  }

  /// raw = codes, cs / cz = per-channel scale / min, one row per token group of the tile (KIVI §3.2; attention folds
  /// cs into q once per group). A tile that starts mid-group and straddles groups keeps the full decode.
  void decode_factored(int32_t head, const uint8_t* codes, const uint8_t* meta, int32_t slot, int32_t n,
                       FactoredTile& t) const override {
    const int32_t G = bytes_.tokens_per_group;
    if (n <= 0 || (slot % G != 0 && slot / G != (slot + n - 1) / G)) {
      KVCodec::decode_factored(head, codes, meta, slot, n, t);
      return;
    }
    codes_tile(codes, slot, n, head_dim_, bits_, t.raw);
    for (int32_t gi = slot / G, row = 0; gi * G < slot + n; ++gi, ++row) {
      const uint8_t* m = meta + static_cast<int64_t>(gi) * bytes_.meta_bytes_per_group;
      float* cs = t.cs + static_cast<int64_t>(row) * head_dim_;
      float* cz = t.cz + static_cast<int64_t>(row) * head_dim_;
      for (int32_t c = 0; c < head_dim_; ++c) {
        uint16_t sb, zb;
        std::memcpy(&sb, m + 2 * c, 2);
        std::memcpy(&zb, m + 2 * (head_dim_ + c), 2);
        cs[c] = half_to_float_finite(sb);
        cz[c] = half_to_float_finite(zb);
      }
    }
    t.group = 0;
    t.per_channel = true;
    t.tokens = slot % G == 0 ? G : n;  // a tile inside one group that starts mid-group: one row
  }

 private:
  int32_t bits_, qmax_;
};

}  // namespace

std::unique_ptr<KVCodec> make_int_codec(const KVFormatSpec& spec, bool is_key, int32_t head_dim, int32_t page_size) {
  if (spec.is_kivi()) {
    if (is_key) return std::make_unique<KiviKeyCodec>(spec, head_dim, page_size);
    const int32_t g = spec.group_size > 0 ? spec.group_size : 32;
    return std::make_unique<IntTokenCodec>(spec, false, head_dim, page_size, g);
  }
  const int32_t g = spec.group_size > 0 ? spec.group_size : head_dim;
  return std::make_unique<IntTokenCodec>(spec, is_key, head_dim, page_size, g);
}

}  // namespace flashkv::kv
