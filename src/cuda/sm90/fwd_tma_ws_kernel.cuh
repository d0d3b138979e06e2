// The TMA warp-specialized Hopper forward kernel: Kernel = Mainloop (mainloop_fwd_tma_ws.cuh) x Epilogue
// (EpilogueFwdWs: normalize, lse, O stored from registers or staged through the Q tile) x TileScheduler
// (TileSchedulerWs: CTAs stride over (query block, head, batch) tiles, query blocks fastest and the last block first,
// so causal grids start with their longest tiles; grid = #tiles is one tile per CTA, grid = #SMs is persistent).
// The roles: warpgroup 0 produces (setmaxnreg down), warpgroups 1-2 consume (setmaxnreg up); without warp
// specialization the two consumer warpgroups are the whole CTA. Persistent CTAs keep their rings across tiles, so
// the next tile's Q/K/V loads run under this tile's last P V GEMM and epilogue.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/mask.hpp"
#include "cuda/sm90/mainloop_fwd_tma_ws.cuh"

namespace flashkv::cuda::sm90 {

struct TileSchedulerWs {
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ static WsBlock block(const TmaWsParams& tp, int tile) {
    const FwdParams& p = tp.p;
    WsBlock blk;
    const int hb = tile / tp.num_m_blocks;
    blk.m_block = tp.num_m_blocks - 1 - (tile - hb * tp.num_m_blocks);
    blk.h = hb % p.num_heads;
    blk.b = hb / p.num_heads;
    blk.hk = blk.h / (p.num_heads / p.num_heads_kv);
    blk.m0 = blk.m_block * kBlockM;
    blk.rule = core::MaskRule{p.seqlen_q, p.seqlen_k, p.window_left, p.window_right};
    const int rows_q = min(kBlockM, p.seqlen_q - blk.m0);
    int64_t key_first, key_last;
    blk.rule.block_key_range(blk.m0, blk.m0 + rows_q, &key_first, &key_last);
    blk.n_min = static_cast<int>(key_first / kBlockN);
    blk.n_max = key_last > key_first ? static_cast<int>((key_last + kBlockN - 1) / kBlockN) : blk.n_min;
    return blk;
  }
};

/// Writes O / l (16-bit) and lse for one consumer warpgroup's 64 rows of a work tile.
template <class Mainloop>
struct EpilogueFwdWs {
  using T = typename Mainloop::T;
  static constexpr int kHeadDim = Mainloop::kHeadDim;
  using TileQ = typename Mainloop::TileQ;

  __device__ __forceinline__ static void store(const FwdParams& p, const WsBlock& blk, char* smem_q, int ctid,
                                               const float (&o)[kHeadDim / 2],
                                               const typename Mainloop::Softmax& sm) {
    const int wg = ctid / 128, warp = (ctid / 32) % 4, lane = ctid % 32;
    const int g = lane / 4, t = lane % 4;
    const int row0 = 64 * wg + 16 * warp;
    float inv[2], lse[2];
    sm.finalize(p.softmax_scale_log2, inv, lse);
    T* og = static_cast<T*>(p.out) + blk.b * p.out_s.batch + int64_t(blk.m0) * p.out_s.row + blk.h * p.out_s.head;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = row0 + g + 8 * hh;
      const bool row_ok = blk.m0 + r < p.seqlen_q;
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j) {
        const uint32_t v = pack_x2<T>(o[j * 4 + 2 * hh] * inv[hh], o[j * 4 + 2 * hh + 1] * inv[hh]);
        if constexpr (Mainloop::kOpt.smem_epilogue) {
          *reinterpret_cast<uint32_t*>(smem_q + TileQ::offset_elem(r, j * 8 + 2 * t)) = v;
        } else if (row_ok && j * 8 < p.head_dim) {
          // A quad writes 16 contiguous bytes of a row; the L2 merges the sectors before they reach memory.
          *reinterpret_cast<uint32_t*>(og + int64_t(r) * p.out_s.row + j * 8 + 2 * t) = v;
        }
      }
      if (p.lse != nullptr && t == 0 && row_ok)
        p.lse[blk.b * p.lse_batch + blk.h * p.lse_head + int64_t(blk.m0 + r) * p.lse_row] = lse[hh];
    }
    if constexpr (Mainloop::kOpt.smem_epilogue) {
      __syncwarp();
      constexpr int kChunks = kHeadDim / 8;
#pragma unroll 4
      for (int i = lane; i < 16 * kChunks; i += 32) {
        const int r = row0 + i / kChunks, c = i % kChunks;
        if (blk.m0 + r < p.seqlen_q && c * 8 < p.head_dim) {
          const uint4 val = *reinterpret_cast<const uint4*>(smem_q + TileQ::offset(r, c));
          *reinterpret_cast<uint4*>(og + int64_t(r) * p.out_s.row + c * 8) = val;
        }
      }
      __syncwarp();
    }
  }
};

template <class Mainloop>
__global__ void __launch_bounds__(Mainloop::kThreads, 1) fwd_tma_ws_kernel(const __grid_constant__ TmaWsParams tp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Sched = TileSchedulerWs;
  constexpr int kM = Mainloop::kBlockM, kN = Mainloop::kBlockN;
  extern __shared__ __align__(1024) char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  char* smem = smem_raw + (base - raw);
  const Mainloop ml(base);
  if (threadIdx.x == 0) ml.init_barriers(tp);
  __syncthreads();

  auto consume = [&](int ctid) {
    typename Mainloop::Pipes pipes;
    typename Mainloop::Producer pr(ml, tp);  // issues the copies when not warp-specialized
    Mainloop::pingpong_begin(ctid);
    for (int tile = blockIdx.x; tile < tp.num_tiles; tile += gridDim.x) {
      const WsBlock blk = Sched::block<kM, kN>(tp, tile);
      float o[Mainloop::kHeadDim / 2];
      typename Mainloop::Softmax sm;
      ml.mma(tp, blk, ctid, o, sm, pipes, pr);
      EpilogueFwdWs<Mainloop>::store(tp.p, blk, smem + Mainloop::kOffQ, ctid, o, sm);
      if (Mainloop::kOpt.smem_epilogue && blk.num_kv() > 0) ml.release_q(pipes, ctid);
    }
    Mainloop::pingpong_end(ctid);
  };
  if constexpr (Mainloop::kWS) {
    if (threadIdx.x < Mainloop::kProducerThreads) {
      setmaxnreg_dec<Mainloop::kProducerRegs>();
      if (Mainloop::kOpt.tma && threadIdx.x != 0) return;
      typename Mainloop::Producer pr(ml, tp);
      for (int tile = blockIdx.x; tile < tp.num_tiles; tile += gridDim.x) {
        const WsBlock blk = Sched::block<kM, kN>(tp, tile);
        ml.produce(pr, blk);
      }
    } else {
      setmaxnreg_inc<Mainloop::kConsumerRegs>();
      consume(static_cast<int>(threadIdx.x) - Mainloop::kProducerThreads);
    }
  } else {
    consume(static_cast<int>(threadIdx.x));
  }
#else
  __trap();  // built without sm_90a code
#endif
}

}  // namespace flashkv::cuda::sm90
