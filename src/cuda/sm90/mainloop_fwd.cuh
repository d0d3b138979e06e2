// FlashAttention forward mainloop on Hopper warpgroup MMA (sm_90a), cp.async loads; composed into a kernel by
// kernel/fwd_kernel.cuh with common/epilogue_fwd.cuh and common/scheduler.cuh (the same softmax, masks and epilogue as
// the sm80 mainloop: the wgmma accumulator has the mma.sync fragment's layout, common/frag.cuh).
//
// Source: Shah et al., "FlashAttention-3", 2024, §3.1 (wgmma with Q/K from shared memory and P from registers as the
// A operand of P V, no round trip through shared memory) on the FlashAttention-2 algorithm (Dao 2023, §3.1: online
// softmax with an unnormalized accumulator and one final division, exp2 with log2(e) folded into the scale; §3.2:
// sequence-parallel grid, warps split Q and share K/V), with FlashAttention-4's conditional rescaling (exact).
//
// One CTA owns kBlockM = 64 * kWarpGroups query rows of one (batch, head); warpgroup w owns rows [64w, 64w + 64) and
// all warpgroups share the K/V tiles, which are double-buffered in shared memory (cp.async; tile n - 1 loads while
// tile n is used). The CTA walks the visible K/V tiles from the last to the first (masked diagonal first); element
// masks are applied on boundary tiles only. Warpgroups run independently between the per-tile barriers, so one's
// softmax overlaps another's GEMMs.
#pragma once

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
#include "cuda/sm90/wgmma.cuh"

namespace flashkv::cuda::sm90 {

template <int kHeadDim_, int kBlockM_, int kBlockN_>
struct FwdConfig {
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kBlockN = kBlockN_;
  static constexpr int kWarpGroups = kBlockM / 64, kThreads = kWarpGroups * 128;
  /// O is accumulated in column chunks of at most 128 (one wgmma each).
  static constexpr int kOChunk = kHeadDim < 128 ? kHeadDim : 128, kOChunks = kHeadDim / kOChunk;
  static_assert(kBlockM % 64 == 0 && kBlockN % 64 == 0 && kHeadDim % 64 == 0, "whole panels and warpgroups");
  using TileQ = PanelTile<kBlockM, kHeadDim>;
  using TileKV = PanelTile<kBlockN, kHeadDim>;
  static constexpr int kSmemBytes = TileQ::kBytes + 4 * TileKV::kBytes + 1024;  // + base alignment
};

template <class Cfg, class T, bool kSoftcap>
struct FwdMainloop {
  static constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kHeadDim = Cfg::kHeadDim;
  static constexpr int kThreads = Cfg::kThreads, kOChunk = Cfg::kOChunk, kOChunks = Cfg::kOChunks;
  static constexpr int kNT = kBlockN / 8, kDT = kHeadDim / 8;
  static constexpr bool kCompiled = kSm90aDevice;
  static constexpr bool kExactNonFiniteRows = true;
  using TileQ = typename Cfg::TileQ;
  using TileKV = typename Cfg::TileKV;
  using MmaS = WgmmaTag<kBlockN, T>;
  using MmaO = WgmmaTag<kOChunk, T>;
  using Softmax = OnlineSoftmax<1, true>;
  using Epilogue = EpilogueFwd<TileQ, 1, kDT, T>;

  struct Accum {
    float o_[kOChunks][kOChunk / 2];
    Softmax softmax;
    __device__ __forceinline__ Frag<1, kDT> o() { return frag(o_); }
  };

  /// Dynamic shared memory, aligned to 1024 bytes (the 128-byte swizzle atoms of the wgmma descriptors).
  __device__ __forceinline__ static char* shared_memory() {
    extern __shared__ __align__(1024) char smem_raw[];
    const uint32_t raw = smem_addr(smem_raw);
    return smem_raw + (((raw + 1023u) & ~1023u) - raw);
  }

  __device__ __forceinline__ static void run(const FwdParams& p, const FwdBlock& blk, char* smem, Accum& acc) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wg = warp / 4;
    const int g = lane / 4, t = lane % 4;
    const int row0 = 64 * wg + 16 * (warp % 4);  // the warp's first row in the CTA's block
    const int n_min = blk.n_min, n_max = blk.n_max;
    const T* kg = blk.k<T>(p);
    const T* vg = blk.v<T>(p);

    const uint32_t sQ = smem_addr(smem);
    const uint32_t sK = sQ + TileQ::kBytes;  // stages: K0, K1, V0, V1
    const uint32_t sV = sK + 2 * TileKV::kBytes;
    const TileCopy<TileKV, kThreads> kv_copy(p.head_dim);
    auto load_kv = [&](int n, int stage) {
      const int r0 = n * kBlockN;
      kv_copy.copy(sK + stage * TileKV::kBytes, kg + r0 * p.k_s.row, p.k_s.row, blk.si.seqlen_k - r0);
      kv_copy.copy(sV + stage * TileKV::kBytes, vg + r0 * p.v_s.row, p.v_s.row, blk.si.seqlen_k - r0);
    };
    TileCopy<TileQ, kThreads>(p.head_dim).copy(sQ, blk.q<T>(p), p.q_s.row, blk.rows_q);
    if (n_max > n_min) load_kv(n_max - 1, 0);
    cp_async_commit();

    zero(acc.o());
    acc.softmax.init();
    const float scale_log2 = p.softmax_scale_log2;

    const uint64_t dQ = desc_kmajor(sQ + 64 * wg * 128);        // A of S: the warpgroup's 64 rows
    const uint64_t dK = desc_kmajor(sK);                         // B of S: K-major keys
    const uint64_t dV = desc_mnmajor(sV, TileKV::kPanelBytes);   // B of O: MN-major (head dim along rows)
    constexpr uint64_t kStage = TileKV::kBytes >> 4;

    auto step = [&](const int n, auto mask_tag) {
      constexpr bool kMask = decltype(mask_tag)::value;
      const int stage = (n_max - 1 - n) & 1;
      cp_async_wait<0>();
      fence_proxy_async();
      // K/V(n) landed; every warpgroup is done with the other stage
      __syncthreads();
      if (n > n_min) load_kv(n - 1, stage ^ 1);
      cp_async_commit();

      // ---- S = Q K^T -------------------------------------------------------------------------------------------
      float s[kBlockN / 2];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        const uint64_t qo = ((kk / 4) * TileQ::kPanelBytes + (kk % 4) * 32) >> 4;
        const uint64_t ko = ((kk / 4) * TileKV::kPanelBytes + (kk % 4) * 32) >> 4;
        wgmma_ss<0, 0>(MmaS{}, s, dQ + qo, dK + stage * kStage + ko, kk > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(s);

      // ---- softcap, mask (boundary tiles only), online softmax -------------------------------------------------
      if constexpr (kSoftcap) apply_softcap(frag(s), p.score_scale);
      if constexpr (kMask) apply_mask(frag(s), blk.rule, blk.m0 + row0, n * kBlockN, g, t);
      float corr[1][2];
      const bool any_rescale = acc.softmax.update(frag(s), scale_log2, corr);
      acc.softmax.rescale(acc.o(), corr, any_rescale);

      // ---- O += P V, P from registers -------------------------------------------------------------------------
#pragma unroll
      for (int c = 0; c < kOChunks; ++c) fence_operands(acc.o_[c]);  // the rescale happens before the wgmmas read O
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        uint32_t a[4];
        a[0] = pack2<T>(s[(2 * kk) * 4 + 0], s[(2 * kk) * 4 + 1]);
        a[1] = pack2<T>(s[(2 * kk) * 4 + 2], s[(2 * kk) * 4 + 3]);
        a[2] = pack2<T>(s[(2 * kk + 1) * 4 + 0], s[(2 * kk + 1) * 4 + 1]);
        a[3] = pack2<T>(s[(2 * kk + 1) * 4 + 2], s[(2 * kk + 1) * 4 + 3]);
        const uint64_t vo = (kk * 16 * 128) >> 4;  // 16 key rows
#pragma unroll
        for (int c = 0; c < kOChunks; ++c) {
          const uint64_t co = (c * (kOChunk / 64) * TileKV::kPanelBytes) >> 4;
          wgmma_rs<1>(MmaO{}, acc.o_[c], a, dV + stage * kStage + vo + co, 1);
        }
      }
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int c = 0; c < kOChunks; ++c) fence_operands(acc.o_[c]);
    };
    blk.for_each_kv_block<kBlockN>(step);
  }
};

}  // namespace flashkv::cuda::sm90
