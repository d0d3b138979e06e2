// FlashAttention-2 backward main kernel for sm_80+ (Dao, "FlashAttention-2", 2023, §3.1.2 Alg. 2 and §3.2).
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
#include "cuda/params.hpp"
#include "cuda/sm80/bwd_common.cuh"
#include "cuda/sm80/common.cuh"
#include "cuda/sm80/ptx.cuh"
#include "cuda/sm80/tile.cuh"

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
  static constexpr int kSmemBytes = 4 * TileQ::kBytes + 2 * TileK::kBytes + 2 * TileP::kBytes + 4 * kBlockM * 4;
};

/// kSoftcap: scores pass through softcap * tanh(s / softcap); a template flag so the common path has no tanh code.
template <class Cfg, class T, bool kSoftcap>
__global__ void __launch_bounds__(Cfg::kThreads) bwd_kernel(const BwdParams p) {
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kHeadDim = Cfg::kHeadDim;
  constexpr int kThreads = Cfg::kThreads, kMC = Cfg::kMC, kDC = Cfg::kDC, kQC = Cfg::kQC;
  constexpr int kNT1 = Cfg::kNT1, kNT2 = Cfg::kNT2, kMT3 = Cfg::kMT3;
  using TileQ = typename Cfg::TileQ;
  using TileK = typename Cfg::TileK;
  using TileP = typename Cfg::TileP;

  extern __shared__ __align__(128) char smem[];
  const int n_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const SeqInfo si = seq_info(p, b);
  const int n0 = n_block * kBlockN;
  if (n0 >= si.seqlen_k) return;
  const int rows_k = min(kBlockN, si.seqlen_k - n0);
  const int group = p.num_heads / p.num_heads_kv;
  const int hk = h / group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int nw1 = warp % Cfg::kNW1, mg = warp / Cfg::kNW1;  // phase 1: key rows nw1*16*kNT1.., query cols mg*kMC..
  const int nw2 = warp % Cfg::kNW2, dg = warp / Cfg::kNW2;  // phase 2: key rows nw2*16*kNT2.., dims dg*kDC..
  const int mq = warp % Cfg::kMW3, qg = warp / Cfg::kMW3;   // phase 3: query rows mq*16*kMT3.., dims qg*kQC..

  const core::MaskRule rule{si.seqlen_q, si.seqlen_k, p.window_left, p.window_right};
  int64_t q_first, q_last;
  rule.block_query_range(n0, n0 + rows_k, &q_first, &q_last);
  const int m_min = static_cast<int>(q_first / kBlockM);
  const int m_max = q_last > q_first ? static_cast<int>((q_last + kBlockM - 1) / kBlockM) : m_min;

  const T* qg_ = static_cast<const T*>(p.q) + b * p.q_s.batch + si.q_row0 * p.q_s.row + h * p.q_s.head;
  const T* dog = static_cast<const T*>(p.dout) + b * p.dout_s.batch + si.q_row0 * p.dout_s.row + h * p.dout_s.head;
  const T* kg = static_cast<const T*>(p.k) + b * p.k_s.batch + (si.k_row0 + n0) * p.k_s.row + hk * p.k_s.head;
  const T* vg = static_cast<const T*>(p.v) + b * p.v_s.batch + (si.k_row0 + n0) * p.v_s.row + hk * p.v_s.head;
  const int64_t row_base = global_row(p, si, b, 0);  // packed row of query 0 of this sequence
  const float* lse2g = p.lse_log2 + static_cast<int64_t>(h) * p.total_q + row_base;
  const float* dsumg = p.dsum + static_cast<int64_t>(h) * p.total_q + row_base;

  const uint32_t sQ = smem_addr(smem);
  const uint32_t sdO = sQ + 2 * TileQ::kBytes;
  const uint32_t sK = sdO + 2 * TileQ::kBytes;
  const uint32_t sV = sK + TileK::kBytes;
  const uint32_t sP = sV + TileK::kBytes;
  const uint32_t sdS = sP + TileP::kBytes;
  float* sLse = reinterpret_cast<float*>(smem + 4 * TileQ::kBytes + 2 * TileK::kBytes + 2 * TileP::kBytes);
  float* sD = sLse + 2 * kBlockM;

  {
    const TileCopy<TileK, kThreads> k_copy(p.head_dim);
    k_copy.copy(sK, kg, p.k_s.row, rows_k);
    k_copy.copy(sV, vg, p.v_s.row, rows_k);
  }
  const TileCopy<TileQ, kThreads> q_copy(p.head_dim);
  auto load_q_block = [&](int m, int buf) {
    const int m0 = m * kBlockM;
    const int rows = si.seqlen_q - m0;
    q_copy.copy(sQ + buf * TileQ::kBytes, qg_ + m0 * p.q_s.row, p.q_s.row, rows);
    q_copy.copy(sdO + buf * TileQ::kBytes, dog + m0 * p.dout_s.row, p.dout_s.row, rows);
    static_assert(kThreads >= kBlockM, "one thread per query row loads lse and D");
    load_lse_dsum<kBlockM>(sLse + buf * kBlockM, sD + buf * kBlockM, lse2g, dsumg, m0, rows);
  };
  if (m_max > m_min) load_q_block(m_min, 0);
  cp_async_commit();

  float dk[kNT2][kDC / 8][4], dv[kNT2][kDC / 8][4];
#pragma unroll
  for (int a = 0; a < kNT2; ++a)
#pragma unroll
    for (int i = 0; i < kDC / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[a][i][e] = dv[a][i][e] = 0.f;

  // ldmatrix address tables, one per (tile, lane mapping); the warp's row offsets are folded into the row index and
  // the tile that shares a mapping is reached by a compile-time byte offset (V = K + TileK::kBytes, dO = Q +
  // 2 * TileQ::kBytes, dS = P + TileP::kBytes), which keeps the live address registers few.
  constexpr uint32_t kVOff = TileK::kBytes, kDoOff = 2 * TileQ::kBytes, kDsOff = TileP::kBytes;
  const LdsmAddr<TileK> kA(sK, lane % 16 + nw1 * kNT1 * 16, lane / 16);
  const LdsmAddr<TileQ> qB(sQ, (lane % 8) + (lane / 16) * 8 + mg * kMC, (lane / 8) % 2);
  const LdsmAddr<TileP> pA(sP, lane % 16 + nw2 * kNT2 * 16, lane / 16);
  // Warp-dependent column offsets are folded into the address tables (chunk base), see LdsmAddr.
  const LdsmAddr<TileQ> qT(sQ, (lane % 8) + ((lane / 8) % 2) * 8, lane / 16, dg * (kDC / 8));
  const LdsmAddr<TileP> dsT(sdS, (lane % 8) + (lane / 16) * 8, (lane / 8) % 2, mq * kMT3 * 2);
  const LdsmAddr<TileK> kT(sK, (lane % 8) + ((lane / 8) % 2) * 8, lane / 16, qg * (kQC / 8));
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
    if (m + 1 < m_max) load_q_block(m + 1, buf ^ 1);
    cp_async_commit();
    const int m0 = m * kBlockM;

    // ---- phase 1: S^T and dP^T --------------------------------------------------------------------------------
    float s[kNT1][kMC / 8][4], dp[kNT1][kMC / 8][4];
#pragma unroll
    for (int a = 0; a < kNT1; ++a)
#pragma unroll
      for (int i = 0; i < kMC / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[a][i][e] = dp[a][i][e] = 0.f;
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
    const float* lse_s = sLse + buf * kBlockM;
    const float* d_s = sD + buf * kBlockM;
#pragma unroll
    for (int nt = 0; nt < kMC / 8; ++nt) {
      // This thread's two query columns of the 8-column tile: lse*log2(e) and D, loaded once for all key rows.
      const int il0 = mg * kMC + nt * 8 + 2 * t;
      const float2 lse2 = *reinterpret_cast<const float2*>(lse_s + il0);
      const float2 d2 = *reinterpret_cast<const float2*>(d_s + il0);
#pragma unroll
      for (int a = 0; a < kNT1; ++a)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int jl = (nw1 * kNT1 + a) * 16 + g + 8 * hh;  // key row within the block
          float pv[2], dsv[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float sv = s[a][nt][2 * hh + e];
            if constexpr (kSoftcap) sv = tanh_approx(sv * p.score_scale);
            float pe = exp2_approx(fmaf(sv, scale_log2, -(e ? lse2.y : lse2.x)));
            if constexpr (kMask) {
              const int i = m0 + il0 + e, j = n0 + jl;
              if (i >= si.seqlen_q || j >= si.seqlen_k || !rule.visible(i, j)) pe = 0.f;
            }
            float de = pe * (dp[a][nt][2 * hh + e] - (e ? d2.y : d2.x));
            if constexpr (kSoftcap) de *= (1.f - sv * sv);
            pv[e] = pe;
            dsv[e] = de;
          }
          const uint32_t off =
              st_base + st_tab[nt] + static_cast<uint32_t>((a * 16 + 8 * hh) * TileP::kPitchChunks * 16);
          *reinterpret_cast<uint32_t*>(smem + (sP - sQ) + off) = pack2<T>(pv[0], pv[1]);
          *reinterpret_cast<uint32_t*>(smem + (sdS - sQ) + off) = pack2<T>(dsv[0], dsv[1]);
        }
    }
    __syncthreads();

    // ---- phase 2: dV += P^T dO, dK += dS^T Q --------------------------------------------------------------------
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
          mma_16816<T>(dv[a][2 * dt2], ap[a], bo[0], bo[1]);
          mma_16816<T>(dv[a][2 * dt2 + 1], ap[a], bo[2], bo[3]);
          mma_16816<T>(dk[a][2 * dt2], ads[a], bq[0], bq[1]);
          mma_16816<T>(dk[a][2 * dt2 + 1], ads[a], bq[2], bq[3]);
        }
      }
    }

    // ---- phase 3: dQ += dS K, in kDQChunks column chunks, each added to the float32 dq_accum ------------------
    float* dqa = p.dq_accum + ((row_base + m0) * p.num_heads + h) * static_cast<int64_t>(p.head_dim_rounded);
    const int64_t dq_row_stride = static_cast<int64_t>(p.num_heads) * p.head_dim_rounded;
    int* sem = nullptr;
    constexpr int kQCc = Cfg::kQCc;
#pragma unroll
    for (int chunk = 0; chunk < Cfg::kDQChunks; ++chunk) {
      float dq[kMT3][kQCc / 8][4];
#pragma unroll
      for (int a = 0; a < kMT3; ++a)
#pragma unroll
        for (int i = 0; i < kQCc / 8; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) dq[a][i][e] = 0.f;
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
      if (p.deterministic && chunk == 0) sem = bwd_dq_turn_wait<kBlockM, kBlockN>(p, rule, si, b, h, m, n_block);
      // This thread's dQ fragment: rows (mq*kMT3 + a)*16 + g + 8*hh, columns qg*kQC + chunk*kQCc + dt*8 + 2t.
      const int col0 = qg * kQC + chunk * kQCc + 2 * t;
      const int il0 = (mq * kMT3) * 16 + g;
      bwd_add_dq<kMT3, kQCc / 8>(p, dqa + il0 * dq_row_stride + col0, dq_row_stride, il0, m0, si.seqlen_q, col0,
                                 !kMask && p.head_dim == kHeadDim,
                                 [&](int a, int j, int hh, int e) { return dq[a][j][2 * hh + e]; });
    }
    if (p.deterministic) bwd_dq_turn_done(sem);
  };

  for (int m = m_min; m < m_max; ++m) {
    if (bwd_needs_mask<kBlockM, kBlockN>(rule, si, m, n0)) {
      step(m, std::true_type{});
    } else {
      step(m, std::false_type{});
    }
  }

  cp_async_wait<0>();
  // ---- epilogue: dK (scaled), dV ------------------------------------------------------------------------------------
#pragma unroll
  for (int a = 0; a < kNT2; ++a)
#pragma unroll
    for (int dt = 0; dt < kDC / 8; ++dt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int jl = (nw2 * kNT2 + a) * 16 + g + 8 * hh;
        const int c = dg * kDC + dt * 8 + 2 * t;
        if (jl >= rows_k || c >= p.head_dim) continue;
        const float k0v = dk[a][dt][2 * hh] * p.softmax_scale, k1v = dk[a][dt][2 * hh + 1] * p.softmax_scale;
        bwd_store_dkdv<T>(p, si, b, h, hk, n0, jl, c, k0v, k1v, dv[a][dt][2 * hh], dv[a][dt][2 * hh + 1]);
      }
}

}  // namespace flashkv::cuda::sm80
