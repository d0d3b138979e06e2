// The TMA warp-specialized Hopper forward kernel: Kernel = Mainloop (mainloop_fwd_tma_ws.cuh) x Epilogue
// (EpilogueFwdWs below: normalize, lse, O staged through the warpgroup's own Q rows in shared memory, 16-byte
// stores) x TileScheduler (SingleTileSchedulerWs: one CTA per (query block, head, batch), heaviest causal blocks
// first). The roles: warpgroup 0 produces (setmaxnreg down), warpgroups 1-2 consume (setmaxnreg up); without warp
// specialization the two consumer warpgroups are the whole CTA.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/mask.hpp"
#include "cuda/sm90/mainloop_fwd_tma_ws.cuh"

namespace flashkv::cuda::sm90 {

/// One CTA per (query block, head, batch); blockIdx.x counts query blocks from the last (causal: longest first).
struct SingleTileSchedulerWs {
  template <int kBlockM>
  static dim3 grid(const FwdParams& p) {
    return dim3((p.seqlen_q + kBlockM - 1) / kBlockM, p.num_heads, p.batch);
  }
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ static WsBlock block(const FwdParams& p) {
    WsBlock blk;
    blk.m_block = static_cast<int>(gridDim.x - 1 - blockIdx.x);
    blk.h = blockIdx.y;
    blk.b = blockIdx.z;
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

/// Writes O / l (16-bit) and lse for one consumer warpgroup's 64 rows. The rows are staged in the warpgroup's own
/// rows of the Q tile (free once its last S GEMM completed), each warp its 16 rows, then stored 16 bytes per thread.
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
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = row0 + g + 8 * hh;
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j) {
        const uint32_t v = pack_x2<T>(o[j * 4 + 2 * hh] * inv[hh], o[j * 4 + 2 * hh + 1] * inv[hh]);
        *reinterpret_cast<uint32_t*>(smem_q + TileQ::offset_elem(r, j * 8 + 2 * t)) = v;
      }
      if (p.lse != nullptr && t == 0 && blk.m0 + r < p.seqlen_q)
        p.lse[blk.b * p.lse_batch + blk.h * p.lse_head + int64_t(blk.m0 + r) * p.lse_row] = lse[hh];
    }
    __syncwarp();
    T* og = static_cast<T*>(p.out) + blk.b * p.out_s.batch + int64_t(blk.m0) * p.out_s.row + blk.h * p.out_s.head;
    constexpr int kChunks = kHeadDim / 8;
#pragma unroll 4
    for (int i = lane; i < 16 * kChunks; i += 32) {
      const int r = row0 + i / kChunks, c = i % kChunks;
      if (blk.m0 + r < p.seqlen_q && c * 8 < p.head_dim) {
        const uint4 val = *reinterpret_cast<const uint4*>(smem_q + TileQ::offset(r, c));
        *reinterpret_cast<uint4*>(og + int64_t(r) * p.out_s.row + c * 8) = val;
      }
    }
  }
};

template <class Mainloop>
__global__ void __launch_bounds__(Mainloop::kThreads, 1) fwd_tma_ws_kernel(const __grid_constant__ TmaWsParams tp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  char* smem = smem_raw + (base - raw);
  const Mainloop ml(base);
  const WsBlock blk = SingleTileSchedulerWs::block<Mainloop::kBlockM, Mainloop::kBlockN>(tp.p);
  if (threadIdx.x == 0) ml.init_barriers(tp);
  __syncthreads();

  auto consume = [&](int ctid) {
    float o[Mainloop::kHeadDim / 2];
    typename Mainloop::Softmax sm;
    ml.mma(tp, blk, ctid, o, sm);
    EpilogueFwdWs<Mainloop>::store(tp.p, blk, smem + Mainloop::kOffQ, ctid, o, sm);
  };
  if constexpr (Mainloop::kWS) {
    if (threadIdx.x < Mainloop::kProducerThreads) {
      setmaxnreg_dec<Mainloop::kProducerRegs>();
      ml.produce(tp, blk);
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
