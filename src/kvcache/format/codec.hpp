// KVCodec: one storage format of one cache half (K or V) — encode float vectors into the packed page layout and decode
// them back. One small class per format (codec_*.cpp), chosen once per cache by make_codec(); the paged cache and the
// attention loop only see this interface.
//
// PAGE-HEAD LAYOUT. A codec works on one (page, layer, half, kv-head) block:
//   codes: page_size slots × code_bytes_per_token_head bytes, slot-major (slot s at codes + s·code_bytes)
//   meta:  page_size / tokens_per_group groups × meta_bytes_per_group bytes (the parallel per-page metadata array)
// Packing of one token-head vector of d codes is PLANAR so that unpacking is unit-stride SIMD: int4 two codes per
// byte, byte i holds element i (low nibble) and element i + d/2 (high nibble); int2 four per byte, bits 2k..2k+1 of
// byte i hold element i + k·d/4 (k = 0..3). fp16/bf16 little-endian uint16; fp32 little-endian float.
// Metadata: int8/int4 and KIVI-V: per (token, channel group) [fp16 scale, fp16 min]; KIVI-K: per group of G tokens
// [fp16 scale × head_dim][fp16 min × head_dim]; fp8 dynamic: float32 scale per token.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "flashkv/kvcache.hpp"

namespace flashkv::kv {

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
  virtual ~KVCodec() = default;

  const KVFormatSpec& spec() const { return spec_; }
  const KVFormatBytes& bytes() const { return bytes_; }
  int32_t head_dim() const { return head_dim_; }
  /// Tokens encoded together (G for KIVI keys, else 1); encode() takes a multiple of it, starting at a multiple.
  int32_t tokens_per_group() const { return bytes_.tokens_per_group; }

  /// Encodes n tokens x [n][head_dim] (row-major float) of kv-head `head` into slots [slot, slot + n) of one page-head.
  /// For KIVI keys slot and n are multiples of G.
  virtual void encode(int32_t head, const float* x, int32_t n, uint8_t* codes, uint8_t* meta,
                      int32_t slot) const = 0;
  /// Decodes slots [slot, slot + n) of one page-head into out [n][head_dim].
  virtual void decode(int32_t head, const uint8_t* codes, const uint8_t* meta, int32_t slot, int32_t n,
                      float* out) const = 0;
  /// Decodes slots [slot, slot + n) into the factored form of t (raw, alpha, beta must hold n·head_dim floats,
  /// cs, cz ceil(n / 16)·head_dim; the codec sets t.group / t.per_channel / t.tokens). Default: the full
  /// decode into t.raw with group = 0.
  virtual void decode_factored(int32_t head, const uint8_t* codes, const uint8_t* meta, int32_t slot, int32_t n,
                               FactoredTile& t) const {
    t.group = 0;
    t.per_channel = false;
    decode(head, codes, meta, slot, n, t.raw);
  }

 protected:
  KVCodec(const KVFormatSpec& spec, bool is_key, int32_t head_dim, int32_t page_size);
  KVFormatSpec spec_;
  KVFormatBytes bytes_;
  int32_t head_dim_;
  bool is_key_;
};

/// Creates the codec for one half. `scales`: static fp8 scales (empty, 1 or num_heads_kv values).
std::unique_ptr<KVCodec> make_codec(const KVFormatSpec& spec, bool is_key, int32_t head_dim, int32_t page_size,
                                    int32_t num_heads_kv, const std::vector<float>& scales);

// ---- scalar helpers shared by the codecs and their tests ------------------------------------------------------------
/// OCP FP8 encode with round-to-nearest-even and saturation to ±max (E4M3FN: 448, E5M2: 57344); NaN never produced
/// for finite input.
uint8_t float_to_fp8(float x, bool e4m3);
/// OCP FP8 decode (exact).
float fp8_to_float(uint8_t code, bool e4m3);
/// Largest finite value: 448 (E4M3FN) or 57344 (E5M2).
float fp8_max(bool e4m3);
/// float -> fp16 bits rounded toward −inf / +inf (used for min / scale so that [min, min + scale·qmax] covers the
/// group's range).
uint16_t fp16_round_down(float x);
uint16_t fp16_round_up(float x);

/// Asymmetric uniform quantization of n values with qmax = 2^bits − 1 (stored metadata fp16; see codec.cpp):
/// writes codes[n] (one per byte, unpacked) and returns (scale_bits, min_bits).
void quantize_asym(const float* x, int32_t n, int32_t stride, int32_t qmax, uint8_t* codes, int32_t code_stride,
                   uint16_t* scale_bits, uint16_t* min_bits);
/// Packs n codes (one per byte) of `bits` (8, 4 or 2) into n·bits/8 bytes (layout above).
void pack_codes(const uint8_t* codes, int32_t n, int32_t bits, uint8_t* out);
/// Inverse of pack_codes.
void unpack_codes(const uint8_t* packed, int32_t n, int32_t bits, uint8_t* codes);

}  // namespace flashkv::kv
