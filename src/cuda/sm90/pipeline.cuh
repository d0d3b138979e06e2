// Hopper (sm_90) asynchronous-pipeline plumbing for the warp-specialized kernels: mbarriers (init, arrive,
// arrive.expect_tx, parity wait), bulk tensor copies (TMA, `cp.async.bulk.tensor`) that complete on an mbarrier,
// named barriers, and register reallocation (`setmaxnreg`). (cp.async itself is common/ptx.cuh's.)
//
// Source: PTX ISA 8.x, "Parallel Synchronization and Communication Instructions: mbarrier" (phases, pending
// arrivals and transaction counts; try_wait.parity), "Data Movement: cp.async.bulk.tensor" (tensor-map-described
// tiles, mbarrier::complete_tx::bytes), "setmaxnreg"; FlashAttention-3 (Shah et al. 2024) §3.1 (producer/consumer
// warp specialization over a circular shared-memory buffer tracked by full/empty barriers).
//
// Why our own and not CuTe's `PipelineTmaAsync`/`SM90_TMA_LOAD`: the kernels need a dozen PTX instructions, the
// sm90 tiles already have their own panel layout (`PanelTile`, the TMA SWIZZLE_128B box layout), and a CuTe TU costs
// minutes of compile time on the 2-core CI (docs/design.md).
#pragma once

#include <cstdint>

namespace flashkv::cuda::sm90 {

// ---- mbarriers -----------------------------------------------------------------------------------------------

/// Initializes the mbarrier at shared address `bar` to expect `count` arrivals per phase (phase 0 pending).
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/// Makes initialized mbarriers visible to the async proxy (TMA) and the other threads (after a CTA barrier).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
/// One arrival, and `bytes` more transaction bytes expected in the current phase (the TMA copies complete them).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}
/// Waits until the phase with parity `parity` of the mbarrier has completed. (No in-kernel watchdog: a trap in
/// this loop costs the consumers ~1.5 KB of spills; the GPU harness times kernels out from the host instead.)
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

/// Position in a ring of kStages mbarrier-guarded buffers: stage index and the parity of its current use.
template <int kStages>
struct PipeState {
  int index = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++index == kStages) {
      index = 0;
      phase ^= 1u;
    }
  }
};

// ---- bulk tensor copies (TMA) --------------------------------------------------------------------------------

/// Loads the box at coordinates (c0 innermost .. c3) of the tensor map at generic address `map` (a __grid_constant__
/// kernel parameter) into shared memory at `dst`, completing `bytes` of transactions on mbarrier `bar`.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void* map, uint32_t bar, int c0, int c1, int c2,
                                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void prefetch_tensormap(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// ---- named barriers and register reallocation ----------------------------------------------------------------

/// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads: sync waits, arrive does not.
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/// Raise / lower this warpgroup's per-thread register budget (sm_90a; all warps of the warpgroup execute it).
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

}  // namespace flashkv::cuda::sm90
