// Vectorized CPU decode loops behind KVCodec (codec.cpp: bf16 rows, fp8 tiles; codec_int.cpp: integer tiles). Each
// returns exactly what the format trait's dequant() defines (kvcache/format/traits.hpp). Private to format/.
#pragma once

#include <cstdint>

namespace flashkv::kv {

void decode_bf16_row(const uint8_t* src, int64_t n, float* out);
/// fp8 codes of slots [slot, slot + n) × d -> float · scale (static) or · the per-token float32 scale (dynamic).
void decode_fp8_tile(const uint8_t* codes, const uint8_t* meta, int32_t slot, int32_t n, int32_t d, bool e4m3,
                     bool dynamic, float static_scale, float* out);
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
void decode_fp8_tile_avx512(const uint8_t* codes, const uint8_t* meta, int32_t slot, int32_t n, int32_t d, bool e4m3,
                            bool dynamic, float static_scale, float* out);
bool fp8_avx512_supported();
#endif
/// token_affine integer tiles: groups of `group` channels, [fp16 scale, fp16 min] per group.
void decode_token_tile(const uint8_t* codes, const uint8_t* meta, int32_t slot, int32_t n, int32_t d, int32_t group,
                       int32_t bits, float* out);
/// channel_affine (KIVI keys) tiles: [fp16 scale × d][fp16 min × d] per unit of G tokens.
void decode_kivi_key_tile(const uint8_t* codes, const uint8_t* meta, int32_t slot, int32_t n, int32_t d, int32_t G,
                          int32_t bits, int64_t meta_group_bytes, float* out);
/// Raw integer codes of a tile as floats (no affine).
void codes_tile(const uint8_t* codes, int32_t slot, int32_t n, int32_t d, int32_t bits, float* out);
/// n per-token [fp16 scale, fp16 min] pairs -> alpha[i], beta[i].
void token_meta_scalar(const uint8_t* meta, int32_t n, float* alpha, float* beta);
/// One KIVI key unit's [scale × d][min × d] -> cs[c], cz[c].
void kivi_meta_scalar(const uint8_t* meta, int32_t d, float* cs, float* cz);

}  // namespace flashkv::kv
