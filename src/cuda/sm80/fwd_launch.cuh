// Host launcher of the sm80 (mma.sync) forward: the tile table's configurations (common/tile_size.hpp) as kernel types,
// the choice between them (causal, small shared memory) and the launch of kernel/fwd_kernel.cuh.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/common/scheduler.cuh"
#include "cuda/common/tile_size.hpp"
#include "cuda/kernel/fwd_kernel.cuh"
#include "cuda/sm80/mainloop_fwd.cuh"
#include "cuda/util.hpp"

namespace flashkv::cuda {

/// Launches the sm80 forward kernel of configuration Cfg (a sm80::FwdConfig) for dtype T.
template <class Cfg, class T>
void run_fwd_cfg(const FwdParams& p, cudaStream_t stream) {
  launch_fwd<Cfg, sm80::FwdMainloop<Cfg, T, false>, sm80::FwdMainloop<Cfg, T, true>,
             attn::FwdSingleTile<Cfg::kBlockM>>(p, stream, "fwd sm80 kernel launch");
}

/// The sm80 forward for kHeadDim: the tile table's configuration (causal / small-shared-memory variants).
template <int kHeadDim, class T>
LaunchInfo run_fwd_sm80(const FwdParams& p, cudaStream_t stream) {
  constexpr FwdTilesSm80 kTiles = fwd_tiles_sm80(kHeadDim);
  using Cfg = sm80::FwdConfig<kHeadDim, kTiles.main.block_m, kTiles.main.block_n, kTiles.main.warps>;
  using CfgCausal = sm80::FwdConfig<kHeadDim, kTiles.causal.block_m, kTiles.causal.block_n, kTiles.causal.warps>;
  using CfgSmall = sm80::FwdConfig<kHeadDim, kTiles.small.block_m, kTiles.small.block_n, kTiles.small.warps>;
  const bool causal_like = p.window_right == 0;  // causal (bottom-right) masking, with or without a left window
  if constexpr (!same_tile(kTiles.main, kTiles.small)) {
    if (max_smem_per_block() < Cfg::kSmemBytes) {
      run_fwd_cfg<CfgSmall, T>(p, stream);
      return {kTiles.small.block_m, kTiles.small.block_n, kTiles.small.warps, true};
    }
  }
  if constexpr (!same_tile(kTiles.main, kTiles.causal)) {
    if (causal_like) {
      run_fwd_cfg<CfgCausal, T>(p, stream);
      return {kTiles.causal.block_m, kTiles.causal.block_n, kTiles.causal.warps, false};
    }
  }
  run_fwd_cfg<Cfg, T>(p, stream);
  return {kTiles.main.block_m, kTiles.main.block_n, kTiles.main.warps, false};
}

}  // namespace flashkv::cuda
