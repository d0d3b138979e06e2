// Host launcher of the sm80 forward kernel: the tile configuration per head dim (FA2's choices for sm80) and the
// grid (query blocks, heads, batch).
#pragma once

#include <cuda_runtime_api.h>

#include <type_traits>

#include "cuda/check.hpp"
#include "cuda/util.hpp"
#include "cuda/sm80/fwd_kernel.cuh"

namespace flashkv::cuda {

/// Tile configuration per head dim, chosen from the sweep in bench/gpu/tune (H200, bench/results/h200-tune-*.md):
/// kBlockM x kBlockN, warps, conditional rescaling on. CfgCausal may differ where square tiles win under causal
/// masking (less work wasted on the diagonal). CfgSmall is used when the device cannot give a block Cfg's shared
/// memory (e.g. A100: 163 KiB, sm_86/sm_89: 99 KiB, against 227 KiB on Hopper).
template <int kHeadDim>
struct FwdTiles;
/// One configuration for every case.
template <class C>
struct OneFwdTile {
  using Cfg = C;
  using CfgCausal = C;
  using CfgSmall = C;
};
template <> struct FwdTiles<64> : OneFwdTile<sm80::FwdConfig<64, 128, 128, 4>> {};
template <> struct FwdTiles<96> : OneFwdTile<sm80::FwdConfig<96, 128, 64, 4>> {};
template <> struct FwdTiles<128> : OneFwdTile<sm80::FwdConfig<128, 128, 64, 4>> {};
template <> struct FwdTiles<192> : OneFwdTile<sm80::FwdConfig<192, 128, 64, 8>> {};
template <> struct FwdTiles<256> {
  using Cfg = sm80::FwdConfig<256, 128, 128, 8>;      // 192 KiB
  using CfgCausal = sm80::FwdConfig<256, 64, 64, 4>;  // 96 KiB
  using CfgSmall = CfgCausal;
};

/// Launches the forward kernel of configuration Cfg (a FwdConfig) for dtype T.
template <class Cfg, class T>
void run_fwd_cfg(const FwdParams& p, cudaStream_t stream) {
  require_smem(Cfg::kSmemBytes, "forward", Cfg::kHeadDim);
  auto kernel = p.softcap ? sm80::fwd_kernel<Cfg, T, true> : sm80::fwd_kernel<Cfg, T, false>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes),
             "cudaFuncSetAttribute(fwd)");
  const dim3 grid((p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM, p.num_heads, p.batch);
  if (grid.x == 0 || p.batch == 0 || p.num_heads == 0) return;
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  check_cuda(cudaGetLastError(), "fwd kernel launch");
}

/// The sm80 forward for kHeadDim: the tile table's configuration (causal / small-shared-memory variants).
template <int kHeadDim, class T>
void run_fwd_sm80(const FwdParams& p, cudaStream_t stream) {
  using Tiles = FwdTiles<kHeadDim>;
  const bool causal_like = p.window_right == 0;  // causal (bottom-right) masking, with or without a left window
  if constexpr (!std::is_same_v<typename Tiles::Cfg, typename Tiles::CfgSmall>) {
    if (max_smem_per_block() < Tiles::Cfg::kSmemBytes) return run_fwd_cfg<typename Tiles::CfgSmall, T>(p, stream);
  }
  if constexpr (!std::is_same_v<typename Tiles::Cfg, typename Tiles::CfgCausal>) {
    if (causal_like) return run_fwd_cfg<typename Tiles::CfgCausal, T>(p, stream);
  }
  run_fwd_cfg<typename Tiles::Cfg, T>(p, stream);
}

}  // namespace flashkv::cuda
