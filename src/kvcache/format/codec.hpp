// KVCodec: the CPU side of one cache half's storage format — encode float token rows into packed codes + metadata
// (quantize-on-write) and decode them back (dequantize(), the generic tile path of the attention). It is generic over
// the format trait (kvcache/format/traits.hpp: KVHalfFormat::encode_unit / dequant are the definition); vectorized
// decode loops for the existing (KVCode, KVScaling) pairs (codec.cpp, codec_int.cpp) are fast paths that return the
// same values, and any other pair decodes through the trait. Page-head layout: see traits.hpp.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "flashkv/kvcache.hpp"
#include "kvcache/format/traits.hpp"

namespace flashkv::kv {

/// The trait of one half from its spec (the grammar's KVFormatSpec).
inline KVHalfFormat describe(const KVFormatSpec& spec, bool is_key, int32_t head_dim) {
  return describe(static_cast<KVFormatId>(spec.format), spec.dynamic_scale, spec.group_size, is_key, head_dim);
}

/// A decoded tile in factored form, so that attention can apply the affine part of a format once per key (on the
/// score, or on p for V) instead of once per element:
///   x̂[t][c] = alpha[t][c / group] · cs[c] · raw[t][c] + beta[t][c / group] + cz[c]
/// group == 0: no per-token factors (alpha = 1, beta = 0); per_channel == false: cs = 1, cz = 0. raw is [n][head_dim];
/// alpha / beta are channel-group major [head_dim / group][n] (unit stride over tokens); cs / cz are
/// [ceil(n / tokens)][head_dim]: KIVI keys, one row per token group of `tokens` tokens (the tile starts on a group).
struct FactoredTile {
  float* raw = nullptr;
  float* alpha = nullptr;
  float* beta = nullptr;
  float* cs = nullptr;
  float* cz = nullptr;
  int32_t group = 0;
  bool per_channel = false;
  int32_t tokens = 0;  ///< per_channel: tokens per cs / cz row
};

class KVCodec {
 public:
  /// `scales`: static fp8 scales (empty = 1.0, 1 value = per tensor, num_heads_kv values = per kv-head).
  KVCodec(const KVFormatSpec& spec, bool is_key, int32_t head_dim, int32_t page_size, int32_t num_heads_kv,
          const std::vector<float>& scales);
  /// The codec of a described half (decode problems carry the trait, not the spec); scales as above, per kv-head.
  KVCodec(const KVHalfFormat& fmt, int32_t page_size, std::vector<float> head_scales);

  const KVFormatSpec& spec() const { return spec_; }
  const KVHalfFormat& format() const { return fmt_; }
  const KVFormatBytes& bytes() const { return bytes_; }
  int32_t head_dim() const { return fmt_.head_dim; }
  /// Tokens encoded together (G for KIVI keys, else 1); encode() takes a multiple of it, starting at a multiple.
  int32_t tokens_per_group() const { return fmt_.tokens_per_unit; }
  /// The static scale of kv-head `head` (head_static formats; 1 otherwise).
  float head_scale(int32_t head) const { return scales_[static_cast<size_t>(head)]; }
  const std::vector<float>& head_scales() const { return scales_; }

  /// Encodes n tokens x [n][head_dim] (row-major float, finite) of kv-head `head` into slots [slot, slot + n) of one
  /// page-head (KVHalfFormat::encode_unit per unit).
  void encode(int32_t head, const float* x, int32_t n, uint8_t* codes, uint8_t* meta, int32_t slot) const;
  /// Decodes slots [slot, slot + n) of one page-head into out [n][head_dim].
  void decode(int32_t head, const uint8_t* codes, const uint8_t* meta, int32_t slot, int32_t n, float* out) const;
  /// Decodes slots [slot, slot + n) into the factored form of t (raw, alpha, beta must hold n·head_dim floats, cs, cz
  /// ceil(n / 16)·head_dim; sets t.group / t.per_channel / t.tokens). Falls back to the full decode (group 0).
  void decode_factored(int32_t head, const uint8_t* codes, const uint8_t* meta, int32_t slot, int32_t n,
                       FactoredTile& t) const;

 private:
  KVFormatSpec spec_;
  KVHalfFormat fmt_;
  KVFormatBytes bytes_;
  std::vector<float> scales_;
};

/// Creates the codec for one half (see the constructor).
std::unique_ptr<KVCodec> make_codec(const KVFormatSpec& spec, bool is_key, int32_t head_dim, int32_t page_size,
                                    int32_t num_heads_kv, const std::vector<float>& scales);

// ---- scalar helpers (the trait's functions under the names the tests and tools use) --------------------------------
inline uint8_t float_to_fp8(float x, bool e4m3) { return float_to_fp8_bits(x, e4m3); }
inline float fp8_to_float(uint8_t code, bool e4m3) { return fp8_bits_to_float(code, e4m3); }
inline float fp8_max(bool e4m3) { return fp8_spec(e4m3).max_value; }
inline uint16_t fp16_round_down(float x) { return fp16_bits_round_down(x); }
inline uint16_t fp16_round_up(float x) { return fp16_bits_round_up(x); }
/// Asymmetric uniform quantization of n values with qmax = 2^bits − 1 (KVHalfFormat::quantize_asym_n).
inline void quantize_asym(const float* x, int32_t n, int32_t stride, int32_t qmax, uint8_t* codes, int32_t code_stride,
                          uint16_t* scale_bits, uint16_t* min_bits) {
  KVHalfFormat::quantize_asym_n(x, n, stride, qmax, codes, code_stride, scale_bits, min_bits);
}
/// Packs n codes (one per byte) of `bits` (8, 4 or 2) into n·bits/8 bytes (planar layout, traits.hpp).
inline void pack_codes(const uint8_t* codes, int32_t n, int32_t bits, uint8_t* out) {
  KVHalfFormat::pack_codes_n(codes, n, bits, out);
}
/// Inverse of pack_codes.
void unpack_codes(const uint8_t* packed, int32_t n, int32_t bits, uint8_t* codes);

}  // namespace flashkv::kv
