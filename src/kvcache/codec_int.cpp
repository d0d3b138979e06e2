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

inline void load_meta(const uint8_t* p, float* scale, float* mn) {
  uint16_t s, m;
  std::memcpy(&s, p, 2);
  std::memcpy(&m, p + 2, 2);
  *scale = fp16_to_float(s);
  *mn = fp16_to_float(m);
}

/// Decodes `n` packed codes of `bits` with x̂ = mn + scale · code into out (vectorizable inner loops).
FLASHKV_CPU_CLONES
void decode_affine(const uint8_t* src, int32_t n, int32_t bits, float scale, float mn, float* out) {
  if (bits == 8) {
    for (int32_t i = 0; i < n; ++i) out[i] = mn + scale * static_cast<float>(src[i]);
  } else if (bits == 4) {
    for (int32_t i = 0; i < n / 2; ++i) {
      const uint8_t b = src[i];
      out[2 * i] = mn + scale * static_cast<float>(b & 0xF);
      out[2 * i + 1] = mn + scale * static_cast<float>(b >> 4);
    }
  } else {
    for (int32_t i = 0; i < n / 4; ++i) {
      const uint8_t b = src[i];
      out[4 * i] = mn + scale * static_cast<float>(b & 3);
      out[4 * i + 1] = mn + scale * static_cast<float>((b >> 2) & 3);
      out[4 * i + 2] = mn + scale * static_cast<float>((b >> 4) & 3);
      out[4 * i + 3] = mn + scale * static_cast<float>(b >> 6);
    }
  }
}

/// KIVI keys: x̂[c] = mn[c] + sc[c] · code[c] (per-channel scale and min of the token's group).
FLASHKV_CPU_CLONES
void decode_channelwise(const uint8_t* __restrict src, int32_t d, int32_t bits, const float* __restrict sc,
                        const float* __restrict mn, float* __restrict o) {
  if (bits == 4) {
    for (int32_t i = 0; i < d / 2; ++i) {
      const uint8_t b = src[i];
      o[2 * i] = mn[2 * i] + sc[2 * i] * static_cast<float>(b & 0xF);
      o[2 * i + 1] = mn[2 * i + 1] + sc[2 * i + 1] * static_cast<float>(b >> 4);
    }
  } else {
    for (int32_t i = 0; i < d / 4; ++i) {
      const uint8_t b = src[i];
      o[4 * i] = mn[4 * i] + sc[4 * i] * static_cast<float>(b & 3);
      o[4 * i + 1] = mn[4 * i + 1] + sc[4 * i + 1] * static_cast<float>((b >> 2) & 3);
      o[4 * i + 2] = mn[4 * i + 2] + sc[4 * i + 2] * static_cast<float>((b >> 4) & 3);
      o[4 * i + 3] = mn[4 * i + 3] + sc[4 * i + 3] * static_cast<float>(b >> 6);
    }
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
    const int32_t ng = head_dim_ / group_;
    const int64_t cb = bytes_.code_bytes_per_token_head;
    const int32_t gbytes = group_ * bits_ / 8;
    for (int32_t t = 0; t < n; ++t) {
      const uint8_t* src = codes + (slot + t) * cb;
      const uint8_t* m = meta + static_cast<int64_t>(slot + t) * ng * 4;
      float* o = out + static_cast<int64_t>(t) * head_dim_;
      for (int32_t g = 0; g < ng; ++g) {
        float scale, mn;
        load_meta(m + g * 4, &scale, &mn);
        decode_affine(src + g * gbytes, group_, bits_, scale, mn, o + g * group_);
      }
    }
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
    const int32_t G = bytes_.tokens_per_group;
    const int64_t cb = bytes_.code_bytes_per_token_head;
    std::array<float, 256> sc{}, mn{};
    int32_t cur_group = -1;
    for (int32_t t = 0; t < n; ++t) {
      const int32_t gi = (slot + t) / G;
      if (gi != cur_group) {
        const uint8_t* m = meta + static_cast<int64_t>(gi) * bytes_.meta_bytes_per_group;
        for (int32_t c = 0; c < head_dim_; ++c) {
          uint16_t s, z;
          std::memcpy(&s, m + 2 * c, 2);
          std::memcpy(&z, m + 2 * (head_dim_ + c), 2);
          sc[static_cast<size_t>(c)] = fp16_to_float(s);
          mn[static_cast<size_t>(c)] = fp16_to_float(z);
        }
        cur_group = gi;
      }
      decode_channelwise(codes + (slot + t) * cb, head_dim_, bits_, sc.data(), mn.data(),
                         out + static_cast<int64_t>(t) * head_dim_);
    }
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
