// Host side of the sm90 (wgmma) backward: tile table and launch through the shared backward driver (preprocess,
// main kernel, dq conversion, GQA reduction; src/cuda/sm80/bwd_launch.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/check.hpp"
#include "cuda/sm80/bwd_launch.cuh"
#include "cuda/sm90/bwd_kernel.cuh"
#include "cuda/util.hpp"

namespace flashkv::cuda {

/// sm90 backward tiles per head dim (kBlockM queries, kBlockN keys; two warpgroups). Head dims without an entry
/// (96, 192) run the sm80 kernels on every GPU. Chosen from the sweep in bench/gpu/tune (H200).
template <int kHeadDim>
struct Sm90BwdTiles {
  static constexpr bool kAvailable = false;
};
template <>
struct Sm90BwdTiles<64> {
  static constexpr bool kAvailable = true;
  using Cfg = sm90::BwdConfig<64, 128, 128>;
};
template <>
struct Sm90BwdTiles<128> {
  static constexpr bool kAvailable = true;
  using Cfg = sm90::BwdConfig<128, 64, 128>;
};
template <>
struct Sm90BwdTiles<256> {
  static constexpr bool kAvailable = true;
  using Cfg = sm90::BwdConfig<256, 64, 64>;
};

/// The backward with the sm90 main kernel of configuration Cfg (a sm90::BwdConfig); Hopper only.
template <class Cfg, class T>
void run_bwd_sm90_cfg(const BwdParams& p, cudaStream_t stream) {
  run_bwd_with<Cfg, T>(p, stream, sm90::bwd_kernel<Cfg, T, false>, sm90::bwd_kernel<Cfg, T, true>);
}

/// Backward for kHeadDim: the sm90 kernel on Hopper when this build carries its sm_90a code (and
/// FLASHKV_CUDA_SM80_ONLY is unset), else the sm80 kernel.
template <int kHeadDim, class T>
void run_bwd(const BwdParams& p, cudaStream_t stream) {
  if constexpr (Sm90BwdTiles<kHeadDim>::kAvailable) {
    using Cfg = typename Sm90BwdTiles<kHeadDim>::Cfg;
    if (use_sm90_kernels() && kernel_has_sm90a(reinterpret_cast<const void*>(sm90::bwd_kernel<Cfg, T, false>)) &&
        max_smem_per_block() >= Cfg::kSmemBytes) {
      return run_bwd_sm90_cfg<Cfg, T>(p, stream);
    }
  }
  run_bwd_sm80<kHeadDim, T>(p, stream);
}

}  // namespace flashkv::cuda
