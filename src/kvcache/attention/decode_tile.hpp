// One K/V tile of the cache-attention loop (cache_attention.cpp) against the query rows of one task: scores, online
// softmax, O += P·V. Each half of the tile comes either packed (read in place by the fused AVX-512 kernels of
// decode_fused.hpp, with the format's affine part applied per key) or already decoded by the codec
// (kv::FactoredTile, the generic path for CPUs without AVX-512, fp32 / fp16 storage and grouped int keys).
#pragma once

#include <cstdint>
#include <vector>

#include "core/mask.hpp"
#include "kvcache/format/codec.hpp"
#include "kvcache/attention/decode_fused.hpp"

namespace flashkv::kv {

inline constexpr int64_t kDecodeTile = 64;  ///< max tokens per tile

/// How the fused kernels get a packed tile's affine part x̂ = alpha·raw + beta (per key, or per key and channel
/// group), or KIVI's per-channel key scale / min.
enum class TileFactors : int32_t {
  none,        ///< x̂ = raw (bf16)
  uniform,     ///< x̂ = mul · raw (fp8 static scale)
  token_f32,   ///< x̂ = mul · scale_t · raw, float32 scale per token in the metadata (fp8 dynamic)
  token_int,   ///< x̂ = scale_{t,g} · code + min_{t,g}, fp16 [scale, min] per token and channel group
  kivi_key,    ///< x̂ = scale_{u,c} · code + min_{u,c}, fp16 [scale × d][min × d] per group u of kivi_g tokens
};

/// One half (K or V) of tile [t0, t1).
struct HalfTile {
  RawCode code = RawCode::none;      ///< none: use `dec`
  const uint8_t* codes = nullptr;    ///< packed row of token t0
  int64_t rb = 0;                    ///< bytes per token row
  TileFactors factors = TileFactors::none;
  float mul = 1.0f;                  ///< uniform / token_f32 multiplier (includes the e4m3 route's 2^8)
  const uint8_t* meta = nullptr;     ///< token_f32 / token_int: metadata of token t0; kivi_key: of the page-head
  int32_t ng = 1;                    ///< token_int: channel groups per token
  int32_t group = 0;                 ///< channels per group (head_dim when ng == 1)
  int32_t kivi_g = 0;                ///< kivi_key: tokens per group
  int32_t slot0 = 0;                 ///< kivi_key: page slot of token t0
  int64_t kivi_meta_bytes = 0;       ///< kivi_key: metadata bytes per token group
  const FactoredTile* dec = nullptr; ///< code == none: the decoded tile
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
