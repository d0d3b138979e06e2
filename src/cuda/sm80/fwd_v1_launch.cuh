// Host launcher of the FA1-loop-order forward kernel (progression benchmark only).
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/check.hpp"
#include "cuda/sm80/fwd_v1_kernel.cuh"

namespace flashkv::cuda {

template <int kHeadDim, class T>
LaunchInfo run_fwd_v1(const FwdParams& p, cudaStream_t stream) {
  using Cfg = sm80::FwdV1Config<kHeadDim>;
  auto kernel = sm80::fwd_v1_kernel<Cfg, T>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes),
             "cudaFuncSetAttribute(fwd_v1)");
  const dim3 grid(p.num_heads, p.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  check_cuda(cudaGetLastError(), "fwd_v1 kernel launch");
  return {Cfg::kBlockM, Cfg::kBlockN, Cfg::kNWarps, false};
}

}  // namespace flashkv::cuda
