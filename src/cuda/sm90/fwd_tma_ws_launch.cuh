// Host launcher of the TMA warp-specialized sm90 forward (kernel family sm90ws): the tile table's configuration
// (common/tile_size.hpp fwd_tile_sm90ws) as a mainloop type, the tensor maps of Q/K/V (sm90/tma_desc.hpp), the tile
// schedule, and the launch of kernel/fwd_kernel_ws.cuh. Which family runs is decided once, by the dispatcher
// (kernels.cpp); this launcher only runs what it was given.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/check.hpp"
#include "cuda/common/scheduler.cuh"
#include "cuda/common/tile_size.hpp"
#include "cuda/kernel/fwd_kernel_ws.cuh"
#include "cuda/sm90/mainloop_fwd_tma_ws.cuh"
#include "cuda/sm90/mainloop_fwd_tma_ws_fp8.cuh"
#include "cuda/sm90/tma_desc.hpp"
#include "cuda/util.hpp"
#include "flashkv/error.hpp"

namespace flashkv::cuda {

namespace sm90 {

/// How the CTAs cover the tiles: kAuto = persistent (one CTA per SM striding over the tiles) for fixed-length calls
/// without a mask (equal tiles), else one tile per CTA (causal / window / varlen tiles differ in length: the hardware
/// hands the longest, first-numbered, out first; a static stride measured 7-21% slower for causal on the H200).
enum class WsSchedule { kAuto, kSingleTile, kPersistent };

/// How a mainloop's q/k/v are loaded: TMA or not, the tensor-map element type and size, the boxes' swizzle width.
template <class Mainloop>
struct WsLoadTraits {
  static constexpr bool kTma = Mainloop::kOpt.tma;
  static constexpr int kElemBytes = 2, kSwizzle = 128;
  static CUtensorMapDataType dtype() {
    return std::is_same_v<typename Mainloop::T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                        : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  }
};
template <int kD, int kN, int kS, bool kSoftcap, class Opt>
struct WsLoadTraits<FwdMainloopTmaWsFp8<kD, kN, kS, kSoftcap, Opt>> {
  static constexpr bool kTma = true;
  static constexpr int kElemBytes = 1, kSwizzle = FwdMainloopTmaWsFp8<kD, kN, kS, kSoftcap, Opt>::kWQ;
  static CUtensorMapDataType dtype() { return CU_TENSOR_MAP_DATA_TYPE_UINT8; }
};

/// Tensor map of a q/k/v operand with `rows` rows (packed rows when varlen: batch 1).
template <class Traits>
CUtensorMap ws_tensor_map(const FwdParams& p, const void* base, int64_t rows, int64_t heads, const TensorStrides& s,
                          int box_rows) {
  const bool varlen = p.cu_seqlens_q != nullptr;
  return make_tma_map_4d(base, Traits::dtype(), Traits::kElemBytes, p.head_dim, rows, heads, varlen ? 1 : p.batch,
                         s.row, s.head, varlen ? 0 : s.batch, box_rows, Traits::kSwizzle);
}

/// Launches fwd_ws_kernel<Mainloop> for p on `stream` (throws on a launch error); returns what ran.
template <class Mainloop>
LaunchInfo launch_fwd_tma_ws(const FwdParams& p, cudaStream_t stream, WsSchedule schedule = WsSchedule::kAuto) {
  using Traits = WsLoadTraits<Mainloop>;
  using Sched = attn::FwdLinearTiles<Mainloop::kBlockM>;
  const bool varlen = p.cu_seqlens_q != nullptr;
  LaunchInfo info{Mainloop::kBlockM, Mainloop::kBlockN, Mainloop::kThreads / 32, false, nullptr};
  const int64_t tiles = Sched::num_tiles(p);
  if (tiles == 0 || p.total_q == 0) return info;
  if (tiles > INT32_MAX) throw UnsupportedError("flashkv: sm90ws forward: more than 2^31 - 1 work tiles");
  require_smem(Mainloop::kSmemBytes, "forward (sm90ws)", Mainloop::kHeadDim);
  TmaWsParams mp;
  mp.p = p;
  mp.num_tiles = static_cast<int>(tiles);
  if constexpr (Traits::kTma) {
    const int64_t rows_q = varlen ? p.total_q : p.seqlen_q, rows_k = varlen ? p.total_k : p.seqlen_k;
    // One Q box per consumer warpgroup's 64 rows; K/V boxes of kBlockN rows. No maps for empty K/V (never loaded).
    mp.tma_q = ws_tensor_map<Traits>(p, p.q, rows_q, p.num_heads, p.q_s, 64);
    if (rows_k > 0) {
      mp.tma_k = ws_tensor_map<Traits>(p, p.k, rows_k, p.num_heads_kv, p.k_s, Mainloop::kBlockN);
      mp.tma_v = ws_tensor_map<Traits>(p, p.v, rows_k, p.num_heads_kv, p.v_s, Mainloop::kBlockN);
    }
  }
  auto kernel = fwd_ws_kernel<Mainloop, Sched>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Mainloop::kSmemBytes),
             "fwd sm90ws kernel attributes");
  const bool masked = p.window_left >= 0 || p.window_right >= 0;
  const bool persistent =
      schedule == WsSchedule::kPersistent || (schedule == WsSchedule::kAuto && !masked && !varlen);
  const int grid = persistent ? static_cast<int>(std::min<int64_t>(tiles, num_sms())) : mp.num_tiles;
  kernel<<<grid, Mainloop::kThreads, Mainloop::kSmemBytes, stream>>>(mp);
  check_cuda(cudaGetLastError(), "fwd sm90ws kernel launch");
  info.schedule = persistent ? "persistent" : nullptr;
  return info;
}

/// The library's mainloop of kHeadDim: the tile table's entry, default options.
template <int kHeadDim, class T, bool kSoftcap>
using FwdMainloopTmaWsFor =
    FwdMainloopTmaWs<kHeadDim, kSoftcap ? fwd_tile_sm90ws(kHeadDim).block_n_softcap : fwd_tile_sm90ws(kHeadDim).block_n,
                     fwd_tile_sm90ws(kHeadDim).stages, T, kSoftcap>;

/// The library's FP8 mainloop of kHeadDim (common/tile_size.hpp fwd_tile_sm90ws_fp8).
template <int kHeadDim, bool kSoftcap>
using FwdMainloopTmaWsFp8For =
    FwdMainloopTmaWsFp8<kHeadDim,
                        kSoftcap ? fwd_tile_sm90ws_fp8(kHeadDim).block_n_softcap : fwd_tile_sm90ws_fp8(kHeadDim).block_n,
                        fwd_tile_sm90ws_fp8(kHeadDim).stages, kSoftcap>;

}  // namespace sm90

/// Dynamic shared memory of the sm90ws forward for kHeadDim (the dispatcher's fit test).
template <int kHeadDim>
int fwd_smem_bytes_sm90ws() {
  return sm90::FwdMainloopTmaWsFor<kHeadDim, __nv_bfloat16, false>::kSmemBytes;
}
/// The same for the FP8 forward (the larger of the softcap / plain tiles).
template <int kHeadDim>
int fwd_smem_bytes_sm90ws_fp8() {
  const int a = sm90::FwdMainloopTmaWsFp8For<kHeadDim, false>::kSmemBytes;
  const int b = sm90::FwdMainloopTmaWsFp8For<kHeadDim, true>::kSmemBytes;
  return a > b ? a : b;
}

/// The sm90ws forward for kHeadDim (the dispatcher has checked device, build and shared memory); T = __nv_fp8_e4m3
/// runs the FP8 mainloop (float8_e4m3fn q/k/v, bfloat16 out).
template <int kHeadDim, class T>
LaunchInfo run_fwd_sm90ws(const FwdParams& p, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, __nv_fp8_e4m3>) {
    static_assert(fwd_tile_sm90ws_fp8(kHeadDim).available, "no FP8 sm90ws forward for this head dim");
    return p.softcap ? sm90::launch_fwd_tma_ws<sm90::FwdMainloopTmaWsFp8For<kHeadDim, true>>(p, stream)
                     : sm90::launch_fwd_tma_ws<sm90::FwdMainloopTmaWsFp8For<kHeadDim, false>>(p, stream);
  } else {
    static_assert(fwd_tile_sm90ws(kHeadDim).available, "no sm90ws forward for this head dim (see HEAD_DIMS in "
                                                        "generate_instantiations.py)");
    return p.softcap ? sm90::launch_fwd_tma_ws<sm90::FwdMainloopTmaWsFor<kHeadDim, T, true>>(p, stream)
                     : sm90::launch_fwd_tma_ws<sm90::FwdMainloopTmaWsFor<kHeadDim, T, false>>(p, stream);
  }
}

}  // namespace flashkv::cuda
