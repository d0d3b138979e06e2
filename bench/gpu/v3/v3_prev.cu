// The previous sm90 forward (src/cuda/sm90/fwd_launch.cuh: wgmma, cp.async, no specialization; the library's kernel
// family sm90) as "sm90v1/hd<d>", with the library's tile table, for the same-run comparison.
#include <cuda_bf16.h>

#include "cuda/sm90/fwd_launch.cuh"
#include "v3.hpp"

namespace {
using flashkv::cuda::FwdParams;
template <int kHeadDim>
cudaError_t launch_prev(const FwdParams& p, cudaStream_t s) {
  flashkv::cuda::run_fwd_sm90<kHeadDim, __nv_bfloat16>(p, s);  // throws on a launch error (v3_run reports it)
  return cudaSuccess;
}
v3::Register r64("sm90v1/hd64", 64, 0, launch_prev<64>, "sm90 family kernel (cp.async wgmma)");
v3::Register r128("sm90v1/hd128", 128, 0, launch_prev<128>, "sm90 family kernel (cp.async wgmma)");
v3::Register r256("sm90v1/hd256", 256, 0, launch_prev<256>, "sm90 family kernel (cp.async wgmma)");
}  // namespace
