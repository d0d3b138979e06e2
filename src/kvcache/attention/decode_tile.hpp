// One K/V tile of the cache-attention loop (cache_attention.cpp) against the query rows of one task: scores, online
// softmax, O += P·V. Each half of the tile comes either packed (read in place by the fused AVX-512 kernels of
// decode_fused.hpp, with the format's affine part applied per key) or already decoded by the codec
// (kv::FactoredTile, the generic path for CPUs without AVX-512 and head dims other than 64 / 128 / 256).
#pragma once

#include <cstdint>
#include <vector>

#include "core/mask.hpp"
#include "kvcache/attention/decode_fused.hpp"
#include "kvcache/format/codec.hpp"

namespace flashkv::kv {

inline constexpr int64_t kDecodeTile = 64;  ///< max tokens per tile

/// One half (K or V) of tile [t0, t1): packed codes read in place by the fused kernels (the format's KVCode, its
/// affine part by KVScaling, format/traits.hpp), or a tile the codec decoded.
struct HalfTile {
  bool packed = false;                ///< false: use `dec`
  KVCode code = KVCode::bf16;
  KVScaling scaling = KVScaling::none;
  const uint8_t* codes = nullptr;     ///< packed row of token t0
  int64_t rb = 0;                     ///< bytes per token row
  float mul = 1.0f;                   ///< head_static: the kv-head's scale; token_f32: multiplier of the stored scale
                                      ///< (both include the e4m3 route's 2^8)
  const uint8_t* meta = nullptr;      ///< token_f32 / token_affine: metadata of token t0; channel_affine: of the page-head
  int32_t ng = 1;                     ///< token_affine: channel groups per token
  int32_t group = 0;                  ///< channels per group (head_dim when ng == 1)
  int32_t kivi_g = 0;                 ///< channel_affine: tokens per group
  int32_t slot0 = 0;                  ///< channel_affine: page slot of token t0
  int64_t kivi_meta_bytes = 0;        ///< channel_affine: metadata bytes per token group
  const FactoredTile* dec = nullptr;  ///< packed == false: the decoded tile
};

/// Per-worker scratch, sized once per attention call.
struct TileScratch {
  TileScratch(int64_t g, int64_t d);
  std::vector<float> sc, w, z, qe, bias, ka, kb, va, vb, cs, cz;
};

/// Updates the online-softmax state (acc [rows][d], mm, ll) of query tokens [qa, qb) (rows r = qi·g + h) with tile
/// [t0, t1); row qi sees keys [rule.row_first(qi), rule.row_last(qi)). qrow: [rows][d] scaled (and rotated) queries,
/// qsum: their sums.
void tile_update(const core::MaskRule& rule, int64_t qa, int64_t qb, int64_t g, int64_t d, int64_t t0, int64_t t1,
                 const float* qrow, const float* qsum, const HalfTile& K, const HalfTile& V, float softcap, float* acc,
                 float* mm, float* ll, TileScratch& scr);

}  // namespace flashkv::kv
