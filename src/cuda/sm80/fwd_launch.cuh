// Host launcher of the sm80 forward kernel: the tile configuration per head dim (FA2's choices for sm80) and the
// grid (query blocks, heads, batch).
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/check.hpp"
#include "cuda/sm80/fwd_kernel.cuh"

namespace flashkv::cuda {

template <int kHeadDim>
struct FwdTiles;  // kBlockM x kBlockN, warps
template <> struct FwdTiles<64> { using Cfg = sm80::FwdConfig<64, 128, 64, 4>; };
template <> struct FwdTiles<96> { using Cfg = sm80::FwdConfig<96, 128, 64, 4>; };
template <> struct FwdTiles<128> { using Cfg = sm80::FwdConfig<128, 128, 64, 4>; };
template <> struct FwdTiles<192> { using Cfg = sm80::FwdConfig<192, 128, 64, 8>; };
template <> struct FwdTiles<256> { using Cfg = sm80::FwdConfig<256, 128, 64, 8>; };

template <int kHeadDim, class T>
void run_fwd(const FwdParams& p, cudaStream_t stream) {
  using Cfg = typename FwdTiles<kHeadDim>::Cfg;
  auto kernel = sm80::fwd_kernel<Cfg, T>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes),
             "cudaFuncSetAttribute(fwd)");
  const dim3 grid((p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM, p.num_heads, p.batch);
  if (grid.x == 0 || p.batch == 0 || p.num_heads == 0) return;
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  check_cuda(cudaGetLastError(), "fwd kernel launch");
}

}  // namespace flashkv::cuda
