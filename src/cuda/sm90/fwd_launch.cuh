// Host side of the forward: the sm90 (wgmma) kernel's tile table and launch, and the dispatch between it and the
// sm80 (mma.sync) kernel (src/cuda/sm80/fwd_launch.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/check.hpp"
#include "cuda/sm80/fwd_launch.cuh"
#include "cuda/sm90/fwd_kernel.cuh"
#include "cuda/util.hpp"

namespace flashkv::cuda {

/// sm90 forward tiles per head dim (kBlockM queries = 64 per warpgroup, kBlockN keys). Head dims without an entry
/// (96, 192) run the sm80 kernels on every GPU. Chosen from the sweep in bench/gpu/tune (H200).
template <int kHeadDim>
struct Sm90FwdTiles {
  static constexpr bool kAvailable = false;
};
template <>
struct Sm90FwdTiles<64> {
  static constexpr bool kAvailable = true;
  using Cfg = sm90::FwdConfig<64, 128, 64>;
};
template <>
struct Sm90FwdTiles<128> {
  static constexpr bool kAvailable = true;
  using Cfg = sm90::FwdConfig<128, 128, 128>;
};
template <>
struct Sm90FwdTiles<256> {
  static constexpr bool kAvailable = true;
  using Cfg = sm90::FwdConfig<256, 128, 64>;
};

/// Launches the sm90 forward kernel of configuration Cfg (a sm90::FwdConfig); Hopper only.
template <class Cfg, class T>
void run_fwd_sm90_cfg(const FwdParams& p, cudaStream_t stream) {
  require_smem(Cfg::kSmemBytes, "forward", Cfg::kHeadDim);
  auto kernel = p.softcap ? sm90::fwd_kernel<Cfg, T, true> : sm90::fwd_kernel<Cfg, T, false>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes),
             "cudaFuncSetAttribute(fwd sm90)");
  const dim3 grid((p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM, p.num_heads, p.batch);
  if (grid.x == 0 || p.batch == 0 || p.num_heads == 0) return;
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  check_cuda(cudaGetLastError(), "fwd sm90 kernel launch");
}

/// Forward for kHeadDim: the sm90 kernel on Hopper when this build carries its sm_90a code (and
/// FLASHKV_CUDA_SM80_ONLY is unset), else the sm80 kernel.
template <int kHeadDim, class T>
void run_fwd(const FwdParams& p, cudaStream_t stream) {
  if constexpr (Sm90FwdTiles<kHeadDim>::kAvailable) {
    using Cfg = typename Sm90FwdTiles<kHeadDim>::Cfg;
    if (use_sm90_kernels() && kernel_has_sm90a(reinterpret_cast<const void*>(sm90::fwd_kernel<Cfg, T, false>)) &&
        max_smem_per_block() >= Cfg::kSmemBytes) {
      return run_fwd_sm90_cfg<Cfg, T>(p, stream);
    }
  }
  run_fwd_sm80<kHeadDim, T>(p, stream);
}

}  // namespace flashkv::cuda
