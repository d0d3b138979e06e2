// The warp-specialized forward kernel: Kernel = Mainloop x Epilogue x TileScheduler with a producer role (FA3's
// flash_fwd_kernel_sm90.h shape). kernel/fwd_kernel.cuh's one-role run() does not fit a producer/consumer split, so
// this kernel composes the roles instead: the producer warpgroup (register budget lowered) walks the scheduler's tiles
// and issues the mainloop's loads; the consumer warpgroups (budget raised) walk the same tiles, run the mainloop's
// GEMMs and online softmax, store through the shared epilogue (common/epilogue_fwd.cuh, each warp its own rows) and
// hand the Q buffer back; rows that a non-finite input reached are recomputed exactly (rare path, as in fwd_kernel).
// Tiles are visited in the scheduler's linear order, CTA c taking tiles c, c + gridDim.x, ... (one per CTA or
// persistent, common/scheduler.cuh FwdLinearTiles).
//
// Mainloop contract (sm90/mainloop_fwd_tma_ws.cuh): Params (.p: FwdParams, .num_tiles), kThreads, kBlockM, kBlockN,
// kWS, kProducerThreads, kCompiled, kExactNonFiniteRows, Epilogue, Accum, Pipes, Producer; shared_memory(), a
// constructor from the aligned shared-memory address, init(params) (one thread), producer_enter() / consumer_enter()
// (register reallocation), producer_issues(), produce(producer, blk), consumers_begin/end(ctid), mma(params, blk,
// ctid, acc, pipes, producer), q_tile(smem), release_q(pipes, ctid).
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/common/block.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/params.hpp"

namespace flashkv::cuda {

/// Rare path of one consumer warp (common/nonfinite.cuh), out of line and rebuilt from the parameters so that the
/// mainloop keeps its registers.
template <class Mainloop, class Scheduler>
__device__ __noinline__ void fwd_ws_recompute_rows(const FwdParams& p, int tile,
                                                   const typename Mainloop::Epilogue::Flagged flagged, int warp) {
  attn::FwdBlock blk = attn::FwdBlock::make<Mainloop::kBlockM>(p, Scheduler::tile(p, tile));
  blk.set_key_range<Mainloop::kBlockM, Mainloop::kBlockN>(p);
  Mainloop::Epilogue::recompute_flagged(p, blk, flagged, warp);
}

template <class Mainloop, class Scheduler>
__global__ void __launch_bounds__(Mainloop::kThreads, 1)
    fwd_ws_kernel(const __grid_constant__ typename Mainloop::Params mp) {
  if constexpr (!Mainloop::kCompiled) {
    __trap();
  } else {
    constexpr int kM = Mainloop::kBlockM, kN = Mainloop::kBlockN;
    const FwdParams& p = mp.p;
    char* smem = Mainloop::shared_memory();
    const Mainloop ml(attn::smem_addr(smem));
    if (threadIdx.x == 0) ml.init(mp);
    __syncthreads();

    auto consume = [&](int ctid) {
      typename Mainloop::Pipes pipes;
      typename Mainloop::Producer pr(ml, mp);  // issues the copies when not warp-specialized
      Mainloop::consumers_begin(ctid);
      for (int tile = blockIdx.x; tile < mp.num_tiles; tile += gridDim.x) {
        attn::FwdBlock blk = attn::FwdBlock::make<kM>(p, Scheduler::tile(p, tile));
        if (!blk.valid()) continue;  // varlen: past this sequence's end (the producer skips it too)
        blk.set_key_range<kM, kN>(p);
        typename Mainloop::Accum acc;
        ml.mma(mp, blk, ctid, acc, pipes, pr);
        const auto flagged = Mainloop::Epilogue::store_warp(p, blk, Mainloop::q_tile(smem), acc.o(), acc.softmax,
                                                            ctid / 32);
        __syncwarp();
        ml.release_q(pipes, ctid);
        if constexpr (Mainloop::kExactNonFiniteRows) {
          if (flagged.any) fwd_ws_recompute_rows<Mainloop, Scheduler>(p, tile, flagged, ctid / 32);
        }
      }
      Mainloop::consumers_end(ctid);
    };
    if constexpr (Mainloop::kWS) {
      if (threadIdx.x < Mainloop::kProducerThreads) {
        Mainloop::producer_enter();
        if (!Mainloop::producer_issues()) return;
        typename Mainloop::Producer pr(ml, mp);
        for (int tile = blockIdx.x; tile < mp.num_tiles; tile += gridDim.x) {
          attn::FwdBlock blk = attn::FwdBlock::make<kM>(p, Scheduler::tile(p, tile));
          if (!blk.valid()) continue;
          blk.set_key_range<kM, kN>(p);
          ml.produce(pr, blk);
        }
      } else {
        Mainloop::consumer_enter();
        consume(static_cast<int>(threadIdx.x) - Mainloop::kProducerThreads);
      }
    } else {
      consume(static_cast<int>(threadIdx.x));
    }
  }
}

}  // namespace flashkv::cuda
