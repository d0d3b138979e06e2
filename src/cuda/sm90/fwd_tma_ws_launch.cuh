// Host side of the TMA warp-specialized forward: tensor maps, shared-memory attribute, launch.
// Fixed-length [batch, seqlen, heads, head_dim] tensors with 16-byte aligned rows (varlen: see docs/gpu.md, not yet).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/sm90/fwd_tma_ws_kernel.cuh"
#include "cuda/sm90/tma_desc.hpp"

namespace flashkv::cuda::sm90 {

/// How the CTAs cover the tiles: kAuto = persistent (one CTA per SM striding over the tiles) without a mask
/// (equal tiles), one tile per CTA with one (causal / window: the hardware hands the longest tiles out first).
enum class WsSchedule { kAuto, kSingleTile, kPersistent };

inline int num_sms() {
  static const int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      return 132;
    return v;
  }();
  return n;
}

/// Launches fwd_tma_ws_kernel<Mainloop> on `stream`; returns the launch error (cudaSuccess when launched).
template <class Mainloop>
cudaError_t run_fwd_tma_ws(const FwdParams& p, cudaStream_t stream, WsSchedule schedule = WsSchedule::kAuto) {
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
                             p.q_s.batch, 64);  // one box per consumer warpgroup's half
  tp.tma_k = make_tma_map_4d(p.k, dt, 2, p.head_dim, p.seqlen_k, p.num_heads_kv, p.batch, p.k_s.row, p.k_s.head,
                             p.k_s.batch, Mainloop::kBlockN);
  tp.tma_v = make_tma_map_4d(p.v, dt, 2, p.head_dim, p.seqlen_k, p.num_heads_kv, p.batch, p.v_s.row, p.v_s.head,
                             p.v_s.batch, Mainloop::kBlockN);
  auto kernel = fwd_tma_ws_kernel<Mainloop>;
  static const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Mainloop::kSmemBytes);
  if (attr != cudaSuccess) return attr;
  tp.num_m_blocks = (p.seqlen_q + Mainloop::kBlockM - 1) / Mainloop::kBlockM;
  const int64_t tiles = int64_t(tp.num_m_blocks) * p.num_heads * p.batch;
  if (tiles == 0) return cudaSuccess;
  if (tiles > INT32_MAX) throw std::invalid_argument("fwd_tma_ws: more than 2^31 work tiles");
  tp.num_tiles = static_cast<int>(tiles);
  const bool masked = p.window_left >= 0 || p.window_right >= 0;
  const bool persistent =
      schedule == WsSchedule::kPersistent || (schedule == WsSchedule::kAuto && !masked);
  const int grid = persistent ? static_cast<int>(std::min<int64_t>(tiles, num_sms())) : tp.num_tiles;
  kernel<<<grid, Mainloop::kThreads, Mainloop::kSmemBytes, stream>>>(tp);
  return cudaGetLastError();
}

}  // namespace flashkv::cuda::sm90
