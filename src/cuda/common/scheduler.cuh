// Tile schedulers: which output tile a CTA computes and the grid that covers them (FA3 tile_scheduler.hpp's
// SingleTile). Persistent / LPT-ordered schedulers plug in here with the same two functions.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/common/block.cuh"
#include "cuda/params.hpp"

namespace flashkv::cuda::attn {

/// Forward: one CTA per (query block, head, batch); the heaviest (causal: last) query blocks get the lowest block
/// index, so they start first.
template <int kBlockM>
struct FwdSingleTile {
  static dim3 grid(const FwdParams& p) { return dim3((p.seqlen_q + kBlockM - 1) / kBlockM, p.num_heads, p.batch); }
  __device__ __forceinline__ static TileCoord tile() {
    return TileCoord{static_cast<int>(gridDim.x - 1 - blockIdx.x), static_cast<int>(blockIdx.y),
                     static_cast<int>(blockIdx.z)};
  }
};

/// Backward: one CTA per (key block, query head, batch).
template <int kBlockN>
struct BwdSingleTile {
  static dim3 grid(const FwdParams& p) { return dim3((p.seqlen_k + kBlockN - 1) / kBlockN, p.num_heads, p.batch); }
  __device__ __forceinline__ static TileCoord tile() {
    return TileCoord{static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z)};
  }
};

}  // namespace flashkv::cuda::attn
