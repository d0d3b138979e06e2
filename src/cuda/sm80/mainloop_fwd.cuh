// FlashAttention-2 forward mainloop for sm_80+ (mma.sync m16n8k16, ldmatrix, cp.async); composed into a kernel by
// kernel/fwd_kernel.cuh with common/epilogue_fwd.cuh and common/scheduler.cuh.
//
// Source: Dao, "FlashAttention-2", 2023, §3.1 (online softmax with an unnormalized accumulator and one final division,
// exp2 with log2(e) folded into the scale), §3.2 (sequence-parallel grid over (query block, head, batch); split-Q across
// warps that share the K/V tiles in shared memory), and the causal block skipping with element masks on boundary
// tiles only.
//
// One CTA owns kBlockM query rows of one (batch, head); warp w owns rows [w*16*kMTiles, (w+1)*16*kMTiles). The CTA
// walks the visible K/V blocks from the last to the first (the masked diagonal block comes first). Loads overlap
// compute the FA2 way: V(n) is fetched while S = Q K(n)^T is computed, K(n-1) while O += P V(n) is computed.
// Head dims smaller than kHeadDim are zero-padded in shared memory (cp.async zero-fill), so one instantiation serves
// every head_dim <= kHeadDim (multiple of 8).
#pragma once

#include <cfloat>
#include <cmath>
#include <type_traits>

#include "core/mask.hpp"
#include "cuda/common/block.cuh"
#include "cuda/common/epilogue_fwd.cuh"
#include "cuda/common/frag.cuh"
#include "cuda/common/mask.cuh"
#include "cuda/common/softmax.cuh"
#include "cuda/common/tile.cuh"
#include "cuda/params.hpp"
#include "cuda/sm80/mma.cuh"

namespace flashkv::cuda::sm80 {

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, bool kRescaleSkip_ = true>
struct FwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  /// Conditional rescaling (FlashAttention-4, exact; common/softmax.cuh).
  static constexpr bool kRescaleSkip = kRescaleSkip_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kThreads = kNWarps * 32;
  static constexpr int kMTiles = kBlockM / (16 * kNWarps);  ///< 16-row mma tiles per warp
  static_assert(kMTiles >= 1 && kBlockM == kMTiles * 16 * kNWarps, "kBlockM must be 16 * kNWarps * kMTiles");
  using TileQ = SmemTile<kBlockM, kHeadDim>;
  using TileKV = SmemTile<kBlockN, kHeadDim>;
  static constexpr int kSmemBytes = TileQ::kBytes + 2 * TileKV::kBytes;
};

/// kSoftcap: scores pass through softcap * tanh(s / softcap) (Gemma 2); a template flag so that the common path carries
/// no tanh code at all.
template <class Cfg, class T, bool kSoftcap>
struct FwdMainloop {
  static constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kHeadDim = Cfg::kHeadDim;
  static constexpr int kThreads = Cfg::kThreads, kMT = Cfg::kMTiles;
  static constexpr int kNT = kBlockN / 8;   // 8-column tiles of S
  static constexpr int kDT = kHeadDim / 8;  // 8-column tiles of O
  static constexpr bool kCompiled = true;
  /// Whether the kernel carries the exact rare path for rows that a non-finite input reaches (common/nonfinite.cuh).
  /// Off for every sm80 configuration: the mere presence of that out-of-line call changes the register allocation of
  /// these 255-register mainloops (hd64 / hd96: spills in the hot loop; hd128 / hd256: with it, small epilogue changes
  /// moved up to 14 spill loads per K/V block into the hot loop), so the sm80 kernels only flag a call whose out holds
  /// a non-finite row and launch_fwd's fix-up kernel recomputes such rows exactly (common/nonfinite_fixup.cuh). Their
  /// hot loops' SASS is then that of the previous release's kernels (bench/results/sm80-speed-2026-12-01.md).
  static constexpr bool kExactNonFiniteRows = false;
  using Element = T;
  using TileQ = typename Cfg::TileQ;
  using TileKV = typename Cfg::TileKV;
  using Softmax = OnlineSoftmax<kMT, Cfg::kRescaleSkip>;
  using Epilogue = EpilogueFwd<TileQ, kMT, kDT, T>;

  struct Accum {
    float o_[kMT][kDT][4];
    Softmax softmax;
    __device__ __forceinline__ Frag<kMT, kDT> o() { return frag(o_); }
  };

  __device__ __forceinline__ static char* shared_memory() {
    extern __shared__ __align__(128) char smem[];
    return smem;
  }

  __device__ __forceinline__ static void run(const FwdParams& p, const FwdBlock& blk, char* smem, Accum& acc) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int warp_row0 = warp * 16 * kMT;
    const int n_min = blk.n_min, n_max = blk.n_max;
    const T* kg = blk.k<T>(p);
    const T* vg = blk.v<T>(p);

    const uint32_t sQ = smem_addr(smem);
    const uint32_t sK = sQ + TileQ::kBytes;
    const uint32_t sV = sK + TileKV::kBytes;

    const TileCopy<TileKV, kThreads> kv_copy(p.head_dim);
    auto load_kv = [&](uint32_t dst, const T* base, int64_t row_stride, int n) {
      const int r0 = n * kBlockN;
      kv_copy.copy(dst, base + r0 * row_stride, row_stride, blk.si.seqlen_k - r0);
    };
    TileCopy<TileQ, kThreads>(p.head_dim).copy(sQ, blk.q<T>(p), p.q_s.row, blk.rows_q);
    if (n_max > n_min) load_kv(sK, kg, p.k_s.row, n_max - 1);
    cp_async_commit();

    zero(acc.o());
    acc.softmax.init();
    const float scale_log2 = p.softmax_scale_log2;

    const LdsmAddr<TileQ> q_addr(sQ, lane % 16, lane / 16);
    const LdsmAddr<TileKV> k_addr(sK, (lane % 8) + (lane / 16) * 8, (lane / 8) % 2);
    const LdsmAddr<TileKV> v_addr(sV, (lane % 8) + ((lane / 8) % 2) * 8, lane / 16);

    // One K/V step. kMask: boundary tile (diagonal, window edge or past seqlen_k) with element-wise masking; the
    // unmasked steps in between carry no mask code at all (FA2's split of masked and unmasked iterations).
    auto step = [&](const int n, auto mask_tag) {
      constexpr bool kMask = decltype(mask_tag)::value;
      cp_async_wait<0>();
      __syncthreads();  // K(n) landed; every warp is done with V(n+1)
      load_kv(sV, vg, p.v_s.row, n);
      cp_async_commit();

      // ---- S = Q K^T -----------------------------------------------------------------------------------------------
      float s[kMT][kNT][4];
      zero(frag(s));
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        uint32_t a[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) ldmatrix_x4(a[mt], q_addr(warp_row0 + mt * 16, kk * 2));
#pragma unroll
        for (int nt2 = 0; nt2 < kNT / 2; ++nt2) {
          uint32_t bk[4];
          ldmatrix_x4(bk, k_addr(nt2 * 16, kk * 2));
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma_16816<T>(s[mt][2 * nt2], a[mt], bk[0], bk[1]);
            mma_16816<T>(s[mt][2 * nt2 + 1], a[mt], bk[2], bk[3]);
          }
        }
      }

      // ---- softcap, mask (boundary tiles only), online softmax ----------------------------------------------------
      if constexpr (kSoftcap) apply_softcap(frag(s), p.score_scale);
      if constexpr (kMask) apply_mask(frag(s), blk.rule, blk.m0 + warp_row0, n * kBlockN, g, t);
      float corr[kMT][2];
      const bool any_rescale = acc.softmax.update(frag(s), scale_log2, corr);
      acc.softmax.rescale(acc.o(), corr, any_rescale);

      cp_async_wait<0>();
      // V(n) landed; every warp is done with K(n)
      __syncthreads();
      if (n > n_min) load_kv(sK, kg, p.k_s.row, n - 1);
      cp_async_commit();

      // ---- O += P V --------------------------------------------------------------------------------------------------
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        uint32_t a[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          a[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          a[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          a[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          a[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dt2 = 0; dt2 < kDT / 2; ++dt2) {
          uint32_t bv[4];
          ldmatrix_x4_trans(bv, v_addr(kk * 16, dt2 * 2));
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma_16816<T>(acc.o_[mt][2 * dt2], a[mt], bv[0], bv[1]);
            mma_16816<T>(acc.o_[mt][2 * dt2 + 1], a[mt], bv[2], bv[3]);
          }
        }
      }
    };
    blk.for_each_kv_block<kBlockN>(step);
  }
};

}  // namespace flashkv::cuda::sm80
