// FlashAttention-2 backward mainloop on Hopper warpgroup MMA (sm_90a): the work split and math of the sm80 mainloop
// (Dao, "FlashAttention-2", 2023, §3.1.2 Alg. 2; dQ by float32 atomics, FlashAttention-3 §3.3 uses the same split),
// with every GEMM issued as wgmma from shared memory (Shah et al., "FlashAttention-3", 2024, §3) instead of
// ldmatrix + mma.sync, which on Hopper is bound by instruction issue and shared-memory reads into registers.
//
// Composed into a kernel by kernel/bwd_kernel.cuh and launched by the shared driver (common/bwd_driver.cuh).
// One CTA (two warpgroups) owns kBlockN keys of one (batch, query head) and walks the query blocks that see them:
//   phase 1  S^T = K Q^T, dP^T = V dO^T      per warpgroup 64 keys x kN1 queries (wgmma m64 n=kN1, K-major A and B)
//            P^T, dS^T = P^T o (dP^T - D) (x (1 - tanh^2) with softcap) -> shared memory (16-bit, panel layout)
//   phase 2  dV += P^T dO, dK += dS^T Q      per warpgroup 64 keys x kN2 head-dim columns (B MN-major)
//   phase 3  dQ_partial = dS K               per warpgroup 64 queries x kN3 columns (A and B MN-major), issued
//            before phase 2 and added to the float32 dq_accum (red.global.add, or in deterministic mode in K/V-block
//            order behind a per-(batch, head, query block) counter) while phase 2's wgmmas still run.
// Q/dO/lse/D of the next query block are prefetched (cp.async, double buffer) while the current one is processed.
#pragma once

#include <cmath>
#include <type_traits>

#include "core/mask.hpp"
#include "cuda/common/block.cuh"
#include "cuda/common/bwd_common.cuh"
#include "cuda/common/frag.cuh"
#include "cuda/common/tile.cuh"
#include "cuda/params.hpp"
#include "cuda/sm90/wgmma.cuh"

namespace flashkv::cuda::sm90 {

/// kBlockM queries x kBlockN keys per step, two warpgroups. Phase 1 splits the S^T tile over the warpgroups along keys
/// when kBlockN = 128 (each 64 keys x kBlockM queries) and along queries when kBlockN = 64; phase 2 along keys or
/// head-dim columns; phase 3 along queries (kBlockM = 128) or head-dim columns.
template <int kHeadDim_, int kBlockM_, int kBlockN_, bool kOverlapDQ_ = true>
struct BwdConfig {
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kBlockN = kBlockN_;
  /// dQ's GEMM is committed before dV/dK's, so its float32 reductions run while the tensor cores still work on dV/dK.
  static constexpr bool kOverlapDQ = kOverlapDQ_;
  static constexpr int kThreads = 256;
  static constexpr int kP1KeyWG = kBlockN / 64, kN1 = kBlockM * kP1KeyWG / 2;
  static constexpr int kP2KeyWG = kBlockN / 64, kN2 = kHeadDim * kP2KeyWG / 2;
  static constexpr int kP3QWG = kBlockM / 64, kN3 = kHeadDim * kP3QWG / 2;
  static_assert((kBlockN == 64 || kBlockN == 128) && (kBlockM == 64 || kBlockM == 128), "tiles are 64 or 128");
  static_assert(kHeadDim % 64 == 0, "head dims are whole 64-column panels");
  using TileQ = PanelTile<kBlockM, kHeadDim>;
  using TileK = PanelTile<kBlockN, kHeadDim>;
  using TileP = PanelTile<kBlockN, kBlockM>;
  using Smem = BwdSmem<TileQ, TileK, TileP, kBlockM, 1024>;  // + base alignment
  static constexpr int kSmemBytes = Smem::kBytes;
};

template <class Cfg, class T, bool kSoftcap>
struct BwdMainloop {
  static constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kHeadDim = Cfg::kHeadDim;
  static constexpr int kThreads = Cfg::kThreads, kN1 = Cfg::kN1, kN2 = Cfg::kN2, kN3 = Cfg::kN3;
  static constexpr bool kCompiled = kSm90aDevice;
  using TileQ = typename Cfg::TileQ;
  using TileK = typename Cfg::TileK;
  using TileP = typename Cfg::TileP;
  using Smem = typename Cfg::Smem;
  using Mma1 = WgmmaTag<kN1, T>;
  using Mma2 = WgmmaTag<kN2, T>;
  using Mma3 = WgmmaTag<kN3, T>;

  struct Accum {
    float dk_[kN2 / 2], dv_[kN2 / 2];
    __device__ __forceinline__ Frag<1, kN2 / 8> dk() { return frag(dk_); }
    __device__ __forceinline__ Frag<1, kN2 / 8> dv() { return frag(dv_); }
  };

  /// Dynamic shared memory, aligned to 1024 bytes (swizzle atoms of the wgmma descriptors).
  __device__ __forceinline__ static char* shared_memory() {
    extern __shared__ __align__(1024) char smem_raw[];
    const uint32_t raw = smem_addr(smem_raw);
    return smem_raw + (((raw + 1023u) & ~1023u) - raw);
  }
  static constexpr bool kEpilogueRebuildsBlock = false;  ///< see sm80/mainloop_bwd.cuh
  /// The epilogue's view of thread tid's dK/dV: rows k2 + wrow + g + 8*hh, columns d2 + 8*j + 2t.
  __device__ __forceinline__ static int dkdv_key_row0(int tid) {
    const int warp = tid / 32, wg = warp / 4;
    return 64 * (wg % Cfg::kP2KeyWG) + (warp % 4) * 16;
  }
  __device__ __forceinline__ static int dkdv_col0(int tid) { return kN2 * (tid / 128 / Cfg::kP2KeyWG); }

  __device__ __forceinline__ static void run(const BwdParams& p, const BwdBlock& blk, char* smem, Accum& acc) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wg = warp / 4, wrow = (warp % 4) * 16;  // warpgroup; first of the warp's 16 rows in a wgmma tile
    const int g = lane / 4, t = lane % 4;
    // Warpgroup tiles: phase 1 keys k1.. x queries q1..; phase 2 keys k2.. x columns d2..; phase 3 queries q3.. x d3..
    const int k1 = 64 * (wg % Cfg::kP1KeyWG), q1 = kN1 * (wg / Cfg::kP1KeyWG);
    const int k2 = 64 * (wg % Cfg::kP2KeyWG), d2 = kN2 * (wg / Cfg::kP2KeyWG);
    const int q3 = 64 * (wg % Cfg::kP3QWG), d3 = kN3 * (wg / Cfg::kP3QWG);
    const int m_min = blk.m_min, m_max = blk.m_max;
    const BwdLoads<T, TileQ, TileK, kBlockM, kThreads> io(p, blk);

    const BwdSmemView<Smem> sm(smem);
    io.prologue(p, blk, sm, acc.dk(), acc.dv());

    // Descriptors of the warpgroup's operand tiles at k-step 0; a k-step adds a compile-time byte offset (>> 4).
    // Phase 1: A = K / V rows k1.. (K-major), B = Q / dO rows q1.. (K-major); K steps of 16 columns = 32 bytes inside a
    // 64-column panel, then the next panel.
    const uint64_t dK1 = desc_kmajor(sm.k + k1 * 128);
    const uint64_t dQ1 = desc_kmajor(sm.q + q1 * 128);
    // Phase 2: A = P^T / dS^T rows k2.. (K-major, K = queries), B = dO / Q columns d2.. (MN-major, K = query rows).
    const uint64_t dP2 = desc_kmajor(sm.p + k2 * 128);
    // A warpgroup tile that starts inside a panel (32 columns) starts its rows (d % 64) * 2 bytes in.
    const uint64_t dO2 = desc_mnmajor(sm.dO + (d2 / 64) * TileQ::kPanelBytes + (d2 % 64) * 2, TileQ::kPanelBytes);
    const uint64_t dQ2 = desc_mnmajor(sm.q + (d2 / 64) * TileQ::kPanelBytes + (d2 % 64) * 2, TileQ::kPanelBytes);
    // Phase 3: A = dS (queries q3.. contiguous in dS^T's rows: MN-major, K = key rows), B = K columns d3.. (MN-major).
    const uint64_t dS3 = desc_mnmajor(sm.ds + (q3 / 64) * TileP::kPanelBytes, TileP::kPanelBytes);
    const uint64_t dK3 = desc_mnmajor(sm.k + (d3 / 64) * TileK::kPanelBytes + (d3 % 64) * 2, TileK::kPanelBytes);
    constexpr uint64_t kVOff = TileK::kBytes >> 4, kDoOff = (2 * TileQ::kBytes) >> 4, kDsOff = TileP::kBytes >> 4;
    constexpr uint64_t kBufOff = TileQ::kBytes >> 4;
    const float scale_log2 = p.softmax_scale_log2;

    auto step = [&](const int m, auto mask_tag) {
      constexpr bool kMask = decltype(mask_tag)::value;
      const int buf = (m - m_min) & 1;
      cp_async_wait<0>();
      fence_proxy_async();
      __syncthreads();
      if (m + 1 < m_max) io.load_q_block(p, blk, m + 1, buf ^ 1, sm.q, sm.dO, sm.lse, sm.d);
      cp_async_commit();
      const int m0 = m * kBlockM;
      const uint64_t bo = buf * kBufOff;

      // ---- phase 1: S^T and dP^T ----------------------------------------------------------------------------------
      float s[kN1 / 2], dp[kN1 / 2];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        const uint64_t ko = ((kk / 4) * TileK::kPanelBytes + (kk % 4) * 32) >> 4;
        const uint64_t qo = ((kk / 4) * TileQ::kPanelBytes + (kk % 4) * 32) >> 4;
        wgmma_ss<0, 0>(Mma1{}, s, dK1 + ko, dQ1 + bo + qo, kk > 0);
        wgmma_ss<0, 0>(Mma1{}, dp, dK1 + kVOff + ko, dQ1 + bo + kDoOff + qo, kk > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(s);
      fence_operands(dp);

      bwd_p_ds<T, kSoftcap, kMask>(frag(s), frag(dp), sm.lse + buf * kBlockM, sm.d + buf * kBlockM, k1 + wrow, q1, m0, blk,
                                   p.score_scale, scale_log2, g, t,
                                   [&](int, int, int, int jl, int il0, uint32_t pk, uint32_t dk) {
                                     const uint32_t off = TileP::offset_elem(jl, il0);
                                     *reinterpret_cast<uint32_t*>(smem + (sm.p - sm.q) + off) = pk;
                                     *reinterpret_cast<uint32_t*>(smem + (sm.ds - sm.q) + off) = dk;
                                   });
      fence_proxy_async();
      __syncthreads();

      // ---- phase 3: dQ = dS K, then phase 2: dV += P^T dO, dK += dS^T Q (two commit groups) --------------------
      float dq[kN3 / 2];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        const uint64_t ro = (kk * 16 * 128) >> 4;  // 16 key rows
        wgmma_ss<1, 1>(Mma3{}, dq, dS3 + ro, dK3 + ro, kk > 0);
      }
      wgmma_commit();
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        const uint64_t po = ((kk / 4) * TileP::kPanelBytes + (kk % 4) * 32) >> 4;
        const uint64_t ro = (kk * 16 * 128) >> 4;  // 16 query rows
        wgmma_ss<0, 1>(Mma2{}, acc.dv_, dP2 + po, dO2 + bo + ro, 1);
        wgmma_ss<0, 1>(Mma2{}, acc.dk_, dP2 + kDsOff + po, dQ2 + bo + ro, 1);
      }
      wgmma_commit();
      if constexpr (Cfg::kOverlapDQ) {
        wgmma_wait<1>();  // dQ done; dV/dK may still run
      } else {
        wgmma_wait<0>();
      }
      fence_operands(dq);

      // ---- dQ partial -> float32 dq_accum --------------------------------------------------------------------------
      float* dqa = p.dq_accum + ((io.row_base + m0) * p.num_heads + blk.h) * static_cast<int64_t>(p.head_dim_rounded);
      const int64_t dq_row_stride = static_cast<int64_t>(p.num_heads) * p.head_dim_rounded;
      int* sem = nullptr;
      if (p.deterministic) sem = bwd_dq_turn_wait<kBlockM, kBlockN>(p, blk.rule, blk.si, blk.b, blk.h, m, blk.n_block);
      // This thread's dQ fragment: rows q3 + wrow + g + 8*hh, columns d3 + 8*j + 2t.
      const int col0 = d3 + 2 * t;
      const int il0 = q3 + wrow + g;
      const Frag<1, kN3 / 8> dqf = frag(dq);
      bwd_add_dq<1, kN3 / 8>(p, dqa + il0 * dq_row_stride + col0, dq_row_stride, il0, m0, blk.si.seqlen_q, col0,
                             !kMask && p.head_dim == kHeadDim,
                             [&](int, int j, int hh, int e) { return dqf(0, j, hh, e); });
      if (p.deterministic) bwd_dq_turn_done(sem);
      wgmma_wait<0>();
      fence_operands(acc.dv_);
      fence_operands(acc.dk_);
    };
    blk.for_each_q_block<kBlockM, kBlockN>(step);
  }
};

}  // namespace flashkv::cuda::sm90
