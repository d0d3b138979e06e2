// Tile schedulers: which output tile a CTA computes and the grid that covers them (FA3 tile_scheduler.hpp's
// SingleTile, and the linear / static persistent order of the warp-specialized forward). A dynamic longest-first
// (LPT) scheduler for causal plugs in here.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

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

/// Forward, tiles by linear index (the warp-specialized kernel, kernel/fwd_kernel_ws.cuh): tile t is query block
/// (last first: the longest under causal masking) fastest, then head, then batch. A grid of num_tiles CTAs takes one
/// tile each (the hardware hands the longest out first); a grid of #SMs is persistent, CTA c taking tiles c,
/// c + gridDim.x, ... (FA3 tile_scheduler.hpp's SingleTile / StaticPersistent). Varlen: p.seqlen_q is max_seqlen_q
/// and blocks past a sequence's end are skipped (FwdBlock::valid).
template <int kBlockM>
struct FwdLinearTiles {
  __host__ __device__ static int num_m_blocks(const FwdParams& p) { return (p.seqlen_q + kBlockM - 1) / kBlockM; }
  static int64_t num_tiles(const FwdParams& p) {
    return static_cast<int64_t>(num_m_blocks(p)) * p.num_heads * p.batch;
  }
  __device__ __forceinline__ static TileCoord tile(const FwdParams& p, int t) {
    const int nm = num_m_blocks(p);
    const int hb = t / nm;
    return TileCoord{nm - 1 - (t - hb * nm), hb % p.num_heads, hb / p.num_heads};
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
