// Host launcher of the sm80 (mma.sync) backward: the tile table's configurations (common/tile_size.hpp) as kernel types
// and the choice between them (small shared memory), through the shared driver (common/bwd_driver.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include <type_traits>

#include "cuda/common/tile_size.hpp"
#include "cuda/kernel/bwd_kernel.cuh"
#include "cuda/sm80/mainloop_bwd.cuh"
#include "cuda/util.hpp"

namespace flashkv::cuda {

/// The backward with the sm80 (mma.sync) main kernel of configuration Cfg (a sm80::BwdConfig).
template <class Cfg, class T>
void run_bwd_cfg(const BwdParams& p, cudaStream_t stream) {
  launch_bwd<Cfg, T, sm80::BwdMainloop>(p, stream);
}

/// The sm80 backward for kHeadDim: the tile table's configuration, or its small-shared-memory one.
template <int kHeadDim, class T>
LaunchInfo run_bwd_sm80(const BwdParams& p, cudaStream_t stream) {
  constexpr BwdTilesSm80 kTiles = bwd_tiles_sm80(kHeadDim);
  using Cfg = sm80::BwdConfig<kHeadDim, kTiles.main.block_m, kTiles.main.block_n, kTiles.main.warps, kTiles.main.nw1,
                              kTiles.main.nw2, kTiles.main.mw3, kTiles.main.dq_chunks>;
  using CfgSmall = sm80::BwdConfig<kHeadDim, kTiles.small.block_m, kTiles.small.block_n, kTiles.small.warps,
                                   kTiles.small.nw1, kTiles.small.nw2, kTiles.small.mw3, kTiles.small.dq_chunks>;
  if constexpr (!std::is_same_v<Cfg, CfgSmall>) {
    if (max_smem_per_block() < Cfg::kSmemBytes) {
      run_bwd_cfg<CfgSmall, T>(p, stream);
      return {kTiles.small.block_m, kTiles.small.block_n, kTiles.small.warps, true};
    }
  }
  run_bwd_cfg<Cfg, T>(p, stream);
  return {kTiles.main.block_m, kTiles.main.block_n, kTiles.main.warps, false};
}

}  // namespace flashkv::cuda
