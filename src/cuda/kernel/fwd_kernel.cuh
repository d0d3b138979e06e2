// The forward kernel of every family: Kernel = Mainloop x Epilogue x TileScheduler (the shape of FA3's
// flash_fwd_kernel_sm90.h / _sm80.h and CUTLASS 88_hopper_fmha's kernel builder). The __global__ only composes:
// the scheduler names the (query block, head, batch) tile, common/block.cuh turns it into sequence bounds and the
// visible K/V range, the arch-specific mainloop (sm80/mainloop_fwd.cuh: mma.sync; sm90/mainloop_fwd.cuh: wgmma)
// loads and multiplies and keeps the online-softmax state (common/softmax.cuh), the epilogue (common/epilogue_fwd.cuh)
// normalizes and stores; rows that a non-finite input reached are recomputed exactly afterwards (rare path).
//
// Mainloop contract: kThreads, kBlockM, kBlockN, kExactNonFiniteRows (the rare path is compiled in), kCompiled (false
// where the translation unit's arch cannot run it: the body is then a trap that the host dispatch never reaches),
// shared_memory() -> char*, Accum (o() fragment view + softmax state), run(p, blk, smem, acc).
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/check.hpp"
#include "cuda/common/block.cuh"
#include "cuda/common/nonfinite_fixup.cuh"
#include "cuda/params.hpp"
#include "cuda/common/scheduler.cuh"
#include "cuda/util.hpp"

namespace flashkv::cuda {

/// Rare path (common/nonfinite.cuh): rows that a non-finite value reached, recomputed exactly. Out of line and with
/// everything rebuilt from the parameters, so that the fast kernel keeps its registers (the hot loops' SASS is that of
/// a kernel without this path; bench/gpu/tune/sass_compare.py).
template <class Mainloop, class Epilogue, class Scheduler>
__device__ __noinline__ void fwd_recompute_rows(const FwdParams p, const typename Epilogue::Flagged flagged) {
  attn::FwdBlock blk = attn::FwdBlock::make<Mainloop::kBlockM>(p, Scheduler::tile());
  blk.set_key_range<Mainloop::kBlockM, Mainloop::kBlockN>(p);
  Epilogue::recompute_flagged(p, blk, flagged);
}

template <class Mainloop, class Epilogue, class Scheduler>
__global__ void __launch_bounds__(Mainloop::kThreads, 1) fwd_kernel(const FwdParams p) {
  if constexpr (!Mainloop::kCompiled) {
    __trap();
  } else {
    char* smem = Mainloop::shared_memory();
    attn::FwdBlock blk = attn::FwdBlock::make<Mainloop::kBlockM>(p, Scheduler::tile());
    if (!blk.valid()) return;
    blk.set_key_range<Mainloop::kBlockM, Mainloop::kBlockN>(p);
    typename Mainloop::Accum acc;
    Mainloop::run(p, blk, smem, acc);
    const auto flagged = Epilogue::store(p, blk, smem, acc.o(), acc.softmax);
    if constexpr (Mainloop::kExactNonFiniteRows) {
      if (flagged.any) fwd_recompute_rows<Mainloop, Epilogue, Scheduler>(p, flagged);
    } else {
      // No in-kernel rare path: flag the call for the fix-up kernel that launch_fwd runs after this one.
      if (flagged.any && threadIdx.x % 32 == 0 && p.nonfinite_epoch != nullptr) {
        atomicMax(p.nonfinite_epoch, p.nonfinite_gen);
      }
    }
  }
}

/// Host side: launches fwd_kernel<Mainloop<kSoftcap>, ...> for p.softcap, with Config's shared memory and grid. A
/// mainloop without the in-kernel rare path (kExactNonFiniteRows false) gets the device's persistent epoch slot and a
/// fresh generation (util.hpp nonfinite_epoch: no allocation or memset per call) and the fix-up kernel after it
/// (common/nonfinite_fixup.cuh): one launch, dependent-launched on sm_90+, that returns at once while no row of the
/// call's out holds a non-finite value. While the stream is being captured into a graph, a zeroed stream-ordered flag
/// and generation 1 take the slot's place (a replay repeats its parameters).
template <class Config, class MainloopPlain, class MainloopSoftcap, class Scheduler>
void launch_fwd(const FwdParams& p, cudaStream_t stream, const char* family) {
  static_assert(MainloopPlain::kExactNonFiniteRows == MainloopSoftcap::kExactNonFiniteRows);
  require_smem(Config::kSmemBytes, "forward", Config::kHeadDim);
  auto kernel = p.softcap ? fwd_kernel<MainloopSoftcap, typename MainloopSoftcap::Epilogue, Scheduler>
                          : fwd_kernel<MainloopPlain, typename MainloopPlain::Epilogue, Scheduler>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Config::kSmemBytes), family);
  const dim3 grid = Scheduler::grid(p);
  if (grid.x == 0 || p.batch == 0 || p.num_heads == 0) return;
  if constexpr (MainloopPlain::kExactNonFiniteRows) {
    kernel<<<grid, Config::kThreads, Config::kSmemBytes, stream>>>(p);
    check_cuda(cudaGetLastError(), family);
  } else {
    const NonfiniteEpoch epoch = nonfinite_epoch(stream);
    DeviceBuffer flag(epoch.slot == nullptr ? sizeof(unsigned long long) : 0, stream);  // graph capture only
    FwdParams pf = p;
    if (epoch.slot != nullptr) {
      pf.nonfinite_epoch = epoch.slot, pf.nonfinite_gen = epoch.gen;
    } else {
      check_cuda(cudaMemsetAsync(flag.get(), 0, sizeof(unsigned long long), stream), "cudaMemsetAsync(non-finite flag)");
      pf.nonfinite_epoch = flag.as<unsigned long long>(), pf.nonfinite_gen = 1;
    }
    kernel<<<grid, Config::kThreads, Config::kSmemBytes, stream>>>(pf);
    check_cuda(cudaGetLastError(), family);
    attn::launch_fixup(attn::fwd_nonfinite_fixup_kernel<typename MainloopPlain::Element, Config::kHeadDim>,
                       attn::fixup_blocks(pf.total_q * pf.num_heads), pf, stream, "fwd non-finite fix-up launch");
  }
}

}  // namespace flashkv::cuda
