// The backward main kernel of every family: Kernel = Mainloop x Epilogue x TileScheduler, as kernel/fwd_kernel.cuh.
// The scheduler names the (key block, query head, batch) tile, common/block.cuh the sequence bounds and the query
// blocks that see it, the arch-specific mainloop (sm80/mainloop_bwd.cuh, sm90/mainloop_bwd.cuh) accumulates dK and dV
// and adds dQ partials, and the shared epilogue (common/bwd_common.cuh) stores dK/dV. The preprocess, dq conversion
// and GQA reduction around it are the shared driver (common/bwd_driver.cuh).
//
// Mainloop contract: kThreads, kBlockM, kBlockN, kCompiled, shared_memory(), Accum (dk()/dv() fragment views),
// dkdv_key_row0(tid) / dkdv_col0(tid) (where thread tid's fragments sit in the block), kEpilogueRebuildsBlock,
// run(p, blk, smem, acc).
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/common/block.cuh"
#include "cuda/common/bwd_common.cuh"
#include "cuda/common/bwd_driver.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/scheduler.cuh"
#include "cuda/params.hpp"

namespace flashkv::cuda {

template <class Mainloop, class T, class Scheduler>
__global__ void __launch_bounds__(Mainloop::kThreads, 1) bwd_kernel(const BwdParams p) {
  if constexpr (!Mainloop::kCompiled) {
    __trap();
  } else {
    char* smem = Mainloop::shared_memory();
    attn::BwdBlock blk = attn::BwdBlock::make<Mainloop::kBlockN>(p, Scheduler::tile());
    if (!blk.valid()) return;
    blk.set_query_range<Mainloop::kBlockM, Mainloop::kBlockN>(p);
    typename Mainloop::Accum acc;
    Mainloop::run(p, blk, smem, acc);
    attn::cp_async_wait<0>();
    const int tid = static_cast<int>(threadIdx.x), lane = tid % 32;
    if constexpr (Mainloop::kEpilogueRebuildsBlock) {
      // The epilogue's block info re-derived from an opaque copy of the key-block index, so that none of its address
      // arithmetic is merged with (and kept live through) the mainloop's (see the mainloop's kEpilogueRebuildsBlock).
      attn::TileCoord c = Scheduler::tile();
      asm volatile("" : "+r"(c.block));
      attn::BwdBlock eb = attn::BwdBlock::make<Mainloop::kBlockN>(p, c);  // the epilogue reads b, h, hk, n0, rows_k, si
      eb.rows_k = min(Mainloop::kBlockN, eb.si.seqlen_k - eb.n0);
      eb.hk = eb.h;  // read only where num_heads == num_heads_kv (bwd_store_dkdv_frags), i.e. hk == h
      attn::bwd_store_dkdv_frags<T>(p, eb, acc.dk(), acc.dv(), Mainloop::dkdv_key_row0(tid),
                                    Mainloop::dkdv_col0(tid), lane / 4, lane % 4);
    } else {
      attn::bwd_store_dkdv_frags<T>(p, blk, acc.dk(), acc.dv(), Mainloop::dkdv_key_row0(tid),
                                    Mainloop::dkdv_col0(tid), lane / 4, lane % 4);
    }
  }
}

/// Host side: the shared driver (preprocess, this family's main kernel, dq conversion, GQA reduction) for Config.
template <class Config, class T, template <class, class, bool> class Mainloop>
void launch_bwd(const BwdParams& p, cudaStream_t stream) {
  using Sched = attn::BwdSingleTile<Config::kBlockN>;
  run_bwd_with<Config, T>(p, stream, bwd_kernel<Mainloop<Config, T, false>, T, Sched>,
                          bwd_kernel<Mainloop<Config, T, true>, T, Sched>);
}

}  // namespace flashkv::cuda
