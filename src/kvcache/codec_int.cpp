// Integer codecs: asymmetric uniform int8/int4 per (token, kv-head, channel group) — also KIVI's per-token V — and
// KIVI's per-channel K over groups of G tokens (Liu et al., "KIVI", arXiv 2402.02750, §3.2–3.3). Metadata is fp16
// (scale, min); x̂ = min + scale · code, code in [0, 2^bits − 1]. Layout: see codec.hpp.
#include <algorithm>
#include <array>
#include <cstring>

#include "core/float16.hpp"
#include "cpu/tile_math.hpp"
#include "kvcache/codec.hpp"

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

/// Unpacks the planar codes of one token-head (d values; layout in codec.hpp) into floats (code values, no affine).
/// Every loop has unit stride and vectorizes.
FLASHKV_ALWAYS_INLINE void codes_to_float(const uint8_t* __restrict src, int32_t d, int32_t bits, float* __restrict o) {
  if (bits == 8) {
    for (int32_t i = 0; i < d; ++i) o[i] = static_cast<float>(src[i]);
  } else if (bits == 4) {
    const int32_t h = d / 2;
    for (int32_t i = 0; i < h; ++i) o[i] = static_cast<float>(src[i] & 0xF);
    for (int32_t i = 0; i < h; ++i) o[i + h] = static_cast<float>(src[i] >> 4);
  } else {
    const int32_t q = d / 4;
    for (int32_t i = 0; i < q; ++i) o[i] = static_cast<float>(src[i] & 3);
    for (int32_t i = 0; i < q; ++i) o[i + q] = static_cast<float>((src[i] >> 2) & 3);
    for (int32_t i = 0; i < q; ++i) o[i + 2 * q] = static_cast<float>((src[i] >> 4) & 3);
    for (int32_t i = 0; i < q; ++i) o[i + 3 * q] = static_cast<float>(src[i] >> 6);
  }
}

/// Per-token codes of one tile: slots [slot, slot + n), groups of `group` channels with [fp16 scale, fp16 min] each.
/// One call per tile (compiled per ISA, see FLASHKV_CPU_CLONES) so the inner loops inline and vectorize.
FLASHKV_CPU_CLONES
void decode_token_tile(const uint8_t* codes, const uint8_t* meta, int32_t slot, int32_t n, int32_t d, int32_t group,
                       int32_t bits, float* out) {
  const int32_t ng = d / group;
  const int64_t cb = static_cast<int64_t>(d) * bits / 8;
  for (int32_t t = 0; t < n; ++t) {
    const uint8_t* m = meta + static_cast<int64_t>(slot + t) * ng * 4;
    float* o = out + static_cast<int64_t>(t) * d;
    codes_to_float(codes + (slot + t) * cb, d, bits, o);
    for (int32_t g = 0; g < ng; ++g) {
      float scale, mn;
      load_meta(m + g * 4, &scale, &mn);
      float* og = o + g * group;
      for (int32_t i = 0; i < group; ++i) og[i] = mn + scale * og[i];
    }
  }
}

/// KIVI key codes of one tile: per-channel [fp16 scale × d][fp16 min × d] per group of G tokens.
FLASHKV_CPU_CLONES
void decode_kivi_key_tile(const uint8_t* codes, const uint8_t* meta, int32_t slot, int32_t n, int32_t d, int32_t G,
                          int32_t bits, int64_t meta_group_bytes, float* out) {
  const int64_t cb = static_cast<int64_t>(d) * bits / 8;
  float sc[256], mn[256];
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
    codes_to_float(codes + (slot + t) * cb, d, bits, o);
    for (int32_t c = 0; c < d; ++c) o[c] = mn[c] + sc[c] * o[c];
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
