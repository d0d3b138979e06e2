// Host launcher of the sm90 (wgmma) forward: the tile table's configuration (common/tile_size.hpp) as a kernel type
// and the launch of kernel/fwd_kernel.cuh. Which family runs is decided once, by the dispatcher (kernels.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/common/scheduler.cuh"
#include "cuda/common/tile_size.hpp"
#include "cuda/kernel/fwd_kernel.cuh"
#include "cuda/sm90/mainloop_fwd.cuh"

namespace flashkv::cuda {

namespace sm90 {
template <int kHeadDim>
using FwdConfigFor = FwdConfig<kHeadDim, fwd_tile_sm90(kHeadDim).block_m, fwd_tile_sm90(kHeadDim).block_n>;
}  // namespace sm90

/// Launches the sm90 forward kernel of configuration Cfg (a sm90::FwdConfig); Hopper with sm_90a code only.
template <class Cfg, class T>
void run_fwd_sm90_cfg(const FwdParams& p, cudaStream_t stream) {
  launch_fwd<Cfg, sm90::FwdMainloop<Cfg, T, false>, sm90::FwdMainloop<Cfg, T, true>,
             attn::FwdSingleTile<Cfg::kBlockM>>(p, stream, "fwd sm90 kernel launch");
}

/// Dynamic shared memory of the sm90 forward for kHeadDim (the dispatcher's fit test).
template <int kHeadDim>
int fwd_smem_bytes_sm90() {
  return sm90::FwdConfigFor<kHeadDim>::kSmemBytes;
}

/// The sm90 forward for kHeadDim (the dispatcher has checked device, build and shared memory).
template <int kHeadDim, class T>
LaunchInfo run_fwd_sm90(const FwdParams& p, cudaStream_t stream) {
  static_assert(fwd_tile_sm90(kHeadDim).available, "no sm90 forward for this head dim (generate_instantiations.py)");
  using Cfg = sm90::FwdConfigFor<kHeadDim>;
  run_fwd_sm90_cfg<Cfg, T>(p, stream);
  return {Cfg::kBlockM, Cfg::kBlockN, Cfg::kThreads / 32, false};
}


}  // namespace flashkv::cuda
