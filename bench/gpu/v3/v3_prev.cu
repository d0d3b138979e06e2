// The previous sm90 forward (src/cuda/sm90/fwd_kernel.cuh: wgmma, cp.async, no specialization) as "sm90v1/hd<d>",
// with its tile table (src/cuda/sm90/fwd_launch.cuh, Sm90FwdTiles), for the same-run comparison.
#include <cuda_bf16.h>

#include "cuda/sm90/fwd_kernel.cuh"
#include "v3.hpp"

namespace {
using flashkv::cuda::FwdParams;
template <class Cfg>
cudaError_t launch_prev(const FwdParams& p, cudaStream_t s) {
  auto kernel = flashkv::cuda::sm90::fwd_kernel<Cfg, __nv_bfloat16, false>;
  static const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (attr != cudaSuccess) return attr;
  const dim3 grid((p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM, p.num_heads, p.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, s>>>(p);
  return cudaGetLastError();
}
using C64 = flashkv::cuda::sm90::FwdConfig<64, 128, 64>;
using C128 = flashkv::cuda::sm90::FwdConfig<128, 128, 128>;
using C256 = flashkv::cuda::sm90::FwdConfig<256, 128, 64>;
v3::Register r64("sm90v1/hd64", 64, 0, launch_prev<C64>, "previous sm90 kernel M128 N64");
v3::Register r128("sm90v1/hd128", 128, 0, launch_prev<C128>, "previous sm90 kernel M128 N128");
v3::Register r256("sm90v1/hd256", 256, 0, launch_prev<C256>, "previous sm90 kernel M128 N64");
}  // namespace
