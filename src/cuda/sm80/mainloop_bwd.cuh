// FlashAttention-2 backward mainloop for sm_80+ (Dao, "FlashAttention-2", 2023, §3.1.2 Alg. 2 and §3.2); composed into a
// kernel by kernel/bwd_kernel.cuh, launched by the shared driver (common/bwd_driver.cuh).
//
// One CTA owns kBlockN keys of one (batch, query head) and walks the query blocks that can see them, recomputing
// P = exp2(S * scale_log2 - lse_log2) from the forward's lse:
//   phase 1  S^T = K Q^T, dP^T = V dO^T         warp tiles: (key rows) x (query columns)
//            P^T, dS^T = P^T o (dP^T - D) (x (1 - tanh^2) with softcap) -> shared memory (16-bit)
//   phase 2  dV += P^T dO, dK += dS^T Q         warp tiles: (key rows) x (head-dim columns), in registers
//   phase 3  dQ_partial = dS K                  warp tiles: (query rows) x (head-dim columns)
//            -> float32 dq_accum: red.global.add (default) or, in deterministic mode, plain adds taken in turn
//               (K/V block order) behind a per-(batch, head, query block) counter, so sums are bit-identical.
// Q/dO/lse/D of the next query block are prefetched (cp.async, double buffer) during the current one.
#pragma once

#include <cmath>
#include <type_traits>

#include "core/mask.hpp"
#include "cuda/common/block.cuh"
#include "cuda/common/bwd_common.cuh"
#include "cuda/common/frag.cuh"
#include "cuda/common/tile.cuh"
#include "cuda/params.hpp"
#include "cuda/sm80/mma.cuh"

namespace flashkv::cuda::sm80 {

/// kBlockM x kBlockN tile, kNWarps warps, and for each phase the warp grid: phase 1 (key rows x query cols) = kNW1 x
/// (kNWarps / kNW1), phase 2 (key rows x head-dim cols) = kNW2 x (kNWarps / kNW2), phase 3 (query rows x head-dim cols)
/// = kMW3 x (kNWarps / kMW3). Larger, squarer warp tiles cut the ldmatrix traffic per mma.
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, int kNW1_, int kNW2_, int kMW3_, int kDQChunks_ = 1>
struct BwdConfig {
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kBlockN = kBlockN_, kNWarps = kNWarps_;
  static constexpr int kThreads = kNWarps * 32;
  static constexpr int kNW1 = kNW1_, kMW1 = kNWarps / kNW1;
  static constexpr int kNT1 = kBlockN / (16 * kNW1);  // 16-row key tiles per warp, phase 1
  static constexpr int kMC = kBlockM / kMW1;           // query columns per warp, phase 1
  static constexpr int kNW2 = kNW2_, kDW2 = kNWarps / kNW2;
  static constexpr int kNT2 = kBlockN / (16 * kNW2);  // 16-row key tiles per warp, phase 2
  static constexpr int kDC = kHeadDim / kDW2;          // head-dim columns per warp, phase 2
  static constexpr int kMW3 = kMW3_, kDW3 = kNWarps / kMW3;
  static constexpr int kMT3 = kBlockM / (16 * kMW3);  // 16-row query tiles per warp, phase 3
  static constexpr int kQC = kHeadDim / kDW3;          // head-dim columns per warp, phase 3
  /// Phase 3 computes the warp's dQ columns in kDQChunks passes (fewer live accumulators: no spills at head_dim 256).
  static constexpr int kDQChunks = kDQChunks_;
  static constexpr int kQCc = kQC / kDQChunks;
  static_assert(kQCc * kDQChunks == kQC && kQCc % 16 == 0, "dQ chunks must be multiples of 16 columns");
  static_assert(kNT1 * 16 * kNW1 == kBlockN && kNT2 * 16 * kNW2 == kBlockN && kMT3 * 16 * kMW3 == kBlockM,
                "warp grids must tile the CTA");
  static_assert(kMC % 16 == 0 && kDC % 16 == 0 && kQC % 16 == 0, "warp tiles must be multiples of 16");
  using TileQ = SmemTile<kBlockM, kHeadDim>;
  using TileK = SmemTile<kBlockN, kHeadDim>;
  using TileP = SmemTile<kBlockN, kBlockM>;
  using Smem = BwdSmem<TileQ, TileK, TileP, kBlockM>;
  static constexpr int kSmemBytes = Smem::kBytes;
};

/// kSoftcap: scores pass through softcap * tanh(s / softcap); a template flag so the common path has no tanh code.
template <class Cfg, class T, bool kSoftcap>
struct BwdMainloop {
  static constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kHeadDim = Cfg::kHeadDim;
  static constexpr int kThreads = Cfg::kThreads, kMC = Cfg::kMC, kDC = Cfg::kDC, kQC = Cfg::kQC;
  static constexpr int kNT1 = Cfg::kNT1, kNT2 = Cfg::kNT2, kMT3 = Cfg::kMT3;
  static constexpr bool kCompiled = true;
  /// The dK/dV epilogue rebuilds its block info from an opaque copy of the key-block index instead of reusing the
  /// mainloop's (kernel/bwd_kernel.cuh). Which is better is a register-allocation outcome of these 255-register
  /// kernels, chosen per head dim from the SASS of the hot loop (nvcc 13.0, sm_90a; bench/gpu/tune/sass_compare.py,
  /// bench/results/sm80-speed-2026-12-01.md): hd256 loses every spill with it (its loop bodies 5 instructions and 3
  /// LDL shorter than the previous release's), the other head dims keep an equal or tighter loop without it.
#ifndef FLASHKV_TUNE_BWD_EPI
  static constexpr bool kEpilogueRebuildsBlock = kHeadDim == 256;
#else  // the tuning harness's override (bench/gpu/tune): a bit mask over head dims 64 / 128 / 256 (1 / 2 / 4)
  static constexpr bool kEpilogueRebuildsBlock =
      (FLASHKV_TUNE_BWD_EPI >> (kHeadDim == 64 ? 0 : kHeadDim == 128 ? 1 : 2)) & 1;
#endif
  /// Where in a query block's step the next block's Q + lse and dO + D are issued (cp.async, into the other buffer):
  /// 0 right after the step's opening barrier, 1 after phase 1's MMAs, 2 after the P/dS barrier, 3 before phase 3;
  /// as kQLoadAt * 10 + kDoLoadAt. A register-allocation and LSU-contention outcome of these 255-register kernels,
  /// measured per head dim on the H200 in the tuning harness against the previous release's kernel (16k tokens,
  /// seqlen 4096 / 16384, causal and not; bench/results/h200-2026-12-02-run8, calls 3-6): hd64 "23" 0.99-1.01x the
  /// previous release (both at 0: 0.94-0.98x), hd128 "01" 0.97-0.99x (0.93-0.95x); other head dims unchanged (0).
  /// Measured on sm_90 (H200) only: the family also serves A100-class GPUs, where these points are not measured.
#ifndef FLASHKV_TUNE_BWD_LOAD_AT
  static constexpr int kLoadAt = kHeadDim == 64 ? 23 : kHeadDim == 128 ? 1 : 0;
#else  // the harness's override: two decimal digits for head dim 64, then 128, then the other head dims (96/192/256);
       // write it without a leading zero (C reads 0... as octal): "230100", not "002301"
  static constexpr int kLoadAt = FLASHKV_TUNE_BWD_LOAD_AT / (kHeadDim == 64 ? 10000 : kHeadDim == 128 ? 100 : 1) % 100;
#endif
  static constexpr int kQLoadAt = kLoadAt / 10, kDoLoadAt = kLoadAt % 10;
  static_assert(kQLoadAt <= 3 && kDoLoadAt <= 3, "load points are 0..3: another digit would never issue the load");
  using TileQ = typename Cfg::TileQ;
  using TileK = typename Cfg::TileK;
  using TileP = typename Cfg::TileP;
  using Smem = typename Cfg::Smem;

  struct Accum {
    float dk_[kNT2][kDC / 8][4], dv_[kNT2][kDC / 8][4];
    __device__ __forceinline__ Frag<kNT2, kDC / 8> dk() { return frag(dk_); }
    __device__ __forceinline__ Frag<kNT2, kDC / 8> dv() { return frag(dv_); }
  };

  __device__ __forceinline__ static char* shared_memory() {
    extern __shared__ __align__(128) char smem[];
    return smem;
  }
  /// The epilogue's view of thread tid's dK/dV: phase-2 warp tiles (key rows x head-dim columns).
  __device__ __forceinline__ static int dkdv_key_row0(int tid) { return (tid / 32 % Cfg::kNW2) * kNT2 * 16; }
  __device__ __forceinline__ static int dkdv_col0(int tid) { return (tid / 32 / Cfg::kNW2) * kDC; }

  __device__ __forceinline__ static void run(const BwdParams& p, const BwdBlock& blk, char* smem, Accum& acc) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int nw1 = warp % Cfg::kNW1, mg = warp / Cfg::kNW1;  // phase 1: key rows nw1*16*kNT1.., query cols mg*kMC..
    const int nw2 = warp % Cfg::kNW2, dg = warp / Cfg::kNW2;  // phase 2: key rows nw2*16*kNT2.., dims dg*kDC..
    const int mq = warp % Cfg::kMW3, qg = warp / Cfg::kMW3;   // phase 3: query rows mq*16*kMT3.., dims qg*kQC..
    const int m_min = blk.m_min, m_max = blk.m_max;
    const BwdLoads<T, TileQ, TileK, kBlockM, kThreads> io(p, blk);

    const BwdSmemView<Smem> sm(smem);
    io.prologue(p, blk, sm, acc.dk(), acc.dv());

    // ldmatrix address tables, one per (tile, lane mapping); the warp's row offsets are folded into the row index and
    // the tile that shares a mapping is reached by a compile-time byte offset (V = K + TileK::kBytes, dO = Q +
    // 2 * TileQ::kBytes, dS = P + TileP::kBytes), which keeps the live address registers few.
    constexpr uint32_t kVOff = TileK::kBytes, kDoOff = 2 * TileQ::kBytes, kDsOff = TileP::kBytes;
    const LdsmAddr<TileK> kA(sm.k, lane % 16 + nw1 * kNT1 * 16, lane / 16);
    const LdsmAddr<TileQ> qB(sm.q, (lane % 8) + (lane / 16) * 8 + mg * kMC, (lane / 8) % 2);
    const LdsmAddr<TileP> pA(sm.p, lane % 16 + nw2 * kNT2 * 16, lane / 16);
    // Warp-dependent column offsets are folded into the address tables (chunk base), see LdsmAddr.
    const LdsmAddr<TileQ> qT(sm.q, (lane % 8) + ((lane / 8) % 2) * 8, lane / 16, dg * (kDC / 8));
    const LdsmAddr<TileP> dsT(sm.ds, (lane % 8) + (lane / 16) * 8, (lane / 8) % 2, mq * kMT3 * 2);
    const LdsmAddr<TileK> kT(sm.k, (lane % 8) + ((lane / 8) % 2) * 8, lane / 16, qg * (kQC / 8));
    const float scale_log2 = p.softmax_scale_log2;
    // Phase-1 fragment stores of P^T / dS^T: row jl = (nw1*kNT1 + a)*16 + 8*hh + g, column il0 = mg*kMC + nt*8 + 2t.
    // Since jl & 7 == g, the swizzled byte offset is st_base + st_tab[nt] + (a*16 + 8*hh) * pitch (compile time).
    uint32_t st_tab[kMC / 8];
    const uint32_t st_base = static_cast<uint32_t>(((nw1 * kNT1 * 16 + g) * TileP::kPitchChunks) * 16 + 4 * t);
#pragma unroll
    for (int nt = 0; nt < kMC / 8; ++nt) {
      const int v = mg * (kMC / 8) + nt;
      st_tab[nt] = static_cast<uint32_t>(((v & ~7) + ((v & 7) ^ g)) * 16);
    }

    // One query block. kMask: boundary tile (diagonal, window edge, past seqlen_q/seqlen_k) with element-wise masks;
    // the fully visible blocks in between carry no mask code (FA2's split of masked and unmasked iterations).
    auto step = [&](const int m, auto mask_tag) {
      constexpr bool kMask = decltype(mask_tag)::value;
      const int buf = (m - m_min) & 1;
      // This block's Q/dO buffer: the buffer offset goes into the table bases once per block.
      LdsmAddr<TileQ> qBi = qB, qTi = qT;
      qBi.base += buf * TileQ::kBytes;
      qTi.base += buf * TileQ::kBytes;
      cp_async_wait<0>();
      __syncthreads();
      // The next query block's loads issued at point kAt (see kQLoadAt), one cp.async group per point.
      auto issue_next = [&](auto at) {
        constexpr int kAt = decltype(at)::value;
        if constexpr (kQLoadAt == kAt || kDoLoadAt == kAt) {
          if (m + 1 < m_max) {
            if constexpr (kQLoadAt == kAt) io.load_q_part(p, blk, m + 1, buf ^ 1, sm.q, sm.lse);
            if constexpr (kDoLoadAt == kAt) io.load_do_part(p, blk, m + 1, buf ^ 1, sm.dO, sm.d);
          }
          cp_async_commit();
        }
      };
      issue_next(std::integral_constant<int, 0>{});
      const int m0 = m * kBlockM;

      // ---- phase 1: S^T and dP^T --------------------------------------------------------------------------------
      float s[kNT1][kMC / 8][4], dp[kNT1][kMC / 8][4];
      zero(frag(s));
      zero(frag(dp));
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        uint32_t ak[kNT1][4], av[kNT1][4];
#pragma unroll
        for (int a = 0; a < kNT1; ++a) {
          ldmatrix_x4(ak[a], kA(a * 16, kk * 2));
          ldmatrix_x4(av[a], kA(a * 16, kk * 2) + kVOff);
        }
#pragma unroll
        for (int nt2 = 0; nt2 < kMC / 16; ++nt2) {
          uint32_t bq[4], bo[4];
          ldmatrix_x4(bq, qBi(nt2 * 16, kk * 2));
          ldmatrix_x4(bo, qBi(nt2 * 16, kk * 2) + kDoOff);
#pragma unroll
          for (int a = 0; a < kNT1; ++a) {
            mma_16816<T>(s[a][2 * nt2], ak[a], bq[0], bq[1]);
            mma_16816<T>(s[a][2 * nt2 + 1], ak[a], bq[2], bq[3]);
            mma_16816<T>(dp[a][2 * nt2], av[a], bo[0], bo[1]);
            mma_16816<T>(dp[a][2 * nt2 + 1], av[a], bo[2], bo[3]);
          }
        }
      }
      issue_next(std::integral_constant<int, 1>{});
      bwd_p_ds<T, kSoftcap, kMask>(frag(s), frag(dp), sm.lse + buf * kBlockM, sm.d + buf * kBlockM, nw1 * kNT1 * 16,
                                   mg * kMC, m0, blk, p.score_scale, scale_log2, g, t,
                                   [&](int a, int nt, int hh, int, int, uint32_t pk, uint32_t dk) {
                                     const uint32_t off = st_base + st_tab[nt] +
                                                          static_cast<uint32_t>((a * 16 + 8 * hh) * TileP::kPitchChunks * 16);
                                     *reinterpret_cast<uint32_t*>(smem + (sm.p - sm.q) + off) = pk;
                                     *reinterpret_cast<uint32_t*>(smem + (sm.ds - sm.q) + off) = dk;
                                   });
      __syncthreads();
      issue_next(std::integral_constant<int, 2>{});

      // ---- phase 2: dV += P^T dO, dK += dS^T Q ------------------------------------------------------------------
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        uint32_t ap[kNT2][4], ads[kNT2][4];
#pragma unroll
        for (int a = 0; a < kNT2; ++a) {
          ldmatrix_x4(ap[a], pA(a * 16, kk * 2));
          ldmatrix_x4(ads[a], pA(a * 16, kk * 2) + kDsOff);
        }
#pragma unroll
        for (int dt2 = 0; dt2 < kDC / 16; ++dt2) {
          uint32_t bo[4], bq[4];
          ldmatrix_x4_trans(bo, qTi(kk * 16, dt2 * 2) + kDoOff);
          ldmatrix_x4_trans(bq, qTi(kk * 16, dt2 * 2));
#pragma unroll
          for (int a = 0; a < kNT2; ++a) {
            mma_16816<T>(acc.dv_[a][2 * dt2], ap[a], bo[0], bo[1]);
            mma_16816<T>(acc.dv_[a][2 * dt2 + 1], ap[a], bo[2], bo[3]);
            mma_16816<T>(acc.dk_[a][2 * dt2], ads[a], bq[0], bq[1]);
            mma_16816<T>(acc.dk_[a][2 * dt2 + 1], ads[a], bq[2], bq[3]);
          }
        }
      }

      issue_next(std::integral_constant<int, 3>{});
      // ---- phase 3: dQ += dS K, in kDQChunks column chunks, each added to the float32 dq_accum ----------------
      float* dqa = p.dq_accum + ((io.row_base + m0) * p.num_heads + blk.h) * static_cast<int64_t>(p.head_dim_rounded);
      const int64_t dq_row_stride = static_cast<int64_t>(p.num_heads) * p.head_dim_rounded;
      int* sem = nullptr;
      constexpr int kQCc = Cfg::kQCc;
#pragma unroll
      for (int chunk = 0; chunk < Cfg::kDQChunks; ++chunk) {
        float dq[kMT3][kQCc / 8][4];
        zero(frag(dq));
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) {
          uint32_t am[kMT3][4];
#pragma unroll
          for (int a = 0; a < kMT3; ++a) ldmatrix_x4_trans(am[a], dsT(kk * 16, a * 2));
#pragma unroll
          for (int dt2 = 0; dt2 < kQCc / 16; ++dt2) {
            uint32_t bk[4];
            ldmatrix_x4_trans(bk, kT(kk * 16, chunk * (kQCc / 8) + dt2 * 2));
#pragma unroll
            for (int a = 0; a < kMT3; ++a) {
              mma_16816<T>(dq[a][2 * dt2], am[a], bk[0], bk[1]);
              mma_16816<T>(dq[a][2 * dt2 + 1], am[a], bk[2], bk[3]);
            }
          }
        }
        if (p.deterministic && chunk == 0) {
          sem = bwd_dq_turn_wait<kBlockM, kBlockN>(p, blk.rule, blk.si, blk.b, blk.h, m, blk.n_block);
        }
        // This thread's dQ fragment: rows (mq*kMT3 + a)*16 + g + 8*hh, columns qg*kQC + chunk*kQCc + dt*8 + 2t.
        const int col0 = qg * kQC + chunk * kQCc + 2 * t;
        const int il0 = (mq * kMT3) * 16 + g;
        const Frag<kMT3, kQCc / 8> dqf = frag(dq);
        bwd_add_dq<kMT3, kQCc / 8>(p, dqa + il0 * dq_row_stride + col0, dq_row_stride, il0, m0, blk.si.seqlen_q, col0,
                                   !kMask && p.head_dim == kHeadDim,
                                   [&](int a, int j, int hh, int e) { return dqf(a, j, hh, e); });
      }
      if (p.deterministic) bwd_dq_turn_done(sem);
    };
    blk.for_each_q_block<kBlockM, kBlockN>(step);
  }
};

}  // namespace flashkv::cuda::sm80
