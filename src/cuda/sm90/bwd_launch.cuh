// Host launcher of the sm90 (wgmma) backward: the tile table's configuration (common/tile_size.hpp) as a kernel type,
// through the shared driver (common/bwd_driver.cuh). Which family runs is decided once, by the dispatcher.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/common/tile_size.hpp"
#include "cuda/kernel/bwd_kernel.cuh"
#include "cuda/sm90/mainloop_bwd.cuh"

namespace flashkv::cuda {

namespace sm90 {
template <int kHeadDim>
using BwdConfigFor = BwdConfig<kHeadDim, bwd_tile_sm90(kHeadDim).block_m, bwd_tile_sm90(kHeadDim).block_n>;
}  // namespace sm90

/// The backward with the sm90 main kernel of configuration Cfg (a sm90::BwdConfig); Hopper with sm_90a code only.
template <class Cfg, class T>
void run_bwd_sm90_cfg(const BwdParams& p, cudaStream_t stream) {
  launch_bwd<Cfg, T, sm90::BwdMainloop>(p, stream);
}

/// Dynamic shared memory of the sm90 backward main kernel for kHeadDim (the dispatcher's fit test).
template <int kHeadDim>
int bwd_smem_bytes_sm90() {
  return sm90::BwdConfigFor<kHeadDim>::kSmemBytes;
}

/// The sm90 backward for kHeadDim (the dispatcher has checked device, build and shared memory).
template <int kHeadDim, class T>
LaunchInfo run_bwd_sm90(const BwdParams& p, cudaStream_t stream) {
  static_assert(bwd_tile_sm90(kHeadDim).available, "no sm90 backward for this head dim (generate_instantiations.py)");
  using Cfg = sm90::BwdConfigFor<kHeadDim>;
  run_bwd_sm90_cfg<Cfg, T>(p, stream);
  return {Cfg::kBlockM, Cfg::kBlockN, Cfg::kThreads / 32, false};
}


}  // namespace flashkv::cuda
