// Host side of the TMA warp-specialized forward: tensor maps, shared-memory attribute, launch.
// Fixed-length [batch, seqlen, heads, head_dim] tensors with 16-byte aligned rows (varlen: see docs/gpu.md, not yet).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/sm90/fwd_tma_ws_kernel.cuh"
#include "cuda/sm90/tma_desc.hpp"

namespace flashkv::cuda::sm90 {

/// Launches fwd_tma_ws_kernel<Mainloop> on `stream`; returns the launch error (cudaSuccess when launched).
template <class Mainloop>
cudaError_t run_fwd_tma_ws(const FwdParams& p, cudaStream_t stream) {
  using T = typename Mainloop::T;
  if (p.cu_seqlens_q != nullptr || p.cu_seqlens_k != nullptr)
    throw std::invalid_argument("fwd_tma_ws: varlen (cu_seqlens) is not supported by this kernel yet");
  if (p.head_dim > Mainloop::kHeadDim)
    throw std::invalid_argument("fwd_tma_ws: head_dim " + std::to_string(p.head_dim) + " > kernel head dim " +
                                std::to_string(Mainloop::kHeadDim));
  const CUtensorMapDataType dt =
      std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  TmaWsParams tp;
  tp.p = p;
  tp.tma_q = make_tma_map_4d(p.q, dt, 2, p.head_dim, p.seqlen_q, p.num_heads, p.batch, p.q_s.row, p.q_s.head,
                             p.q_s.batch, Mainloop::kBlockM);
  tp.tma_k = make_tma_map_4d(p.k, dt, 2, p.head_dim, p.seqlen_k, p.num_heads_kv, p.batch, p.k_s.row, p.k_s.head,
                             p.k_s.batch, Mainloop::kBlockN);
  tp.tma_v = make_tma_map_4d(p.v, dt, 2, p.head_dim, p.seqlen_k, p.num_heads_kv, p.batch, p.v_s.row, p.v_s.head,
                             p.v_s.batch, Mainloop::kBlockN);
  auto kernel = fwd_tma_ws_kernel<Mainloop>;
  static const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Mainloop::kSmemBytes);
  if (attr != cudaSuccess) return attr;
  const dim3 grid = SingleTileSchedulerWs::grid<Mainloop::kBlockM>(p);
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return cudaSuccess;
  kernel<<<grid, Mainloop::kThreads, Mainloop::kSmemBytes, stream>>>(tp);
  return cudaGetLastError();
}

}  // namespace flashkv::cuda::sm90
