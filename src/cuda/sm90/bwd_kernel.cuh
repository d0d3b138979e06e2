// FlashAttention-2 backward algorithm on Hopper warpgroup MMA (sm_90a): the work split and math of the sm80 kernel
// (Dao, "FlashAttention-2", 2023, §3.1.2 Alg. 2; dQ by float32 atomics, FlashAttention-3 §3.3 uses the same split),
// with every GEMM issued as wgmma from shared memory (Shah et al., "FlashAttention-3", 2024, §3) instead of
// ldmatrix + mma.sync, which on Hopper is bound by instruction issue and shared-memory reads into registers.
//
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
#include "cuda/params.hpp"
#include "cuda/sm80/bwd_common.cuh"
#include "cuda/sm80/common.cuh"
#include "cuda/sm80/ptx.cuh"
#include "cuda/sm80/tile.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace flashkv::cuda::sm90 {

using sm80::cp_async_commit;
using sm80::cp_async_wait;
using sm80::exp2_approx;
using sm80::pack2;
using sm80::SeqInfo;
using sm80::smem_addr;
using sm80::tanh_approx;

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
  static constexpr int kSmemBytes =
      4 * TileQ::kBytes + 2 * TileK::kBytes + 2 * TileP::kBytes + 4 * kBlockM * 4 + 1024;  // + base alignment
};

template <class Cfg, class T, bool kSoftcap>
__global__ void __launch_bounds__(Cfg::kThreads, 1) bwd_kernel(const BwdParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kHeadDim = Cfg::kHeadDim;
  constexpr int kThreads = Cfg::kThreads, kN1 = Cfg::kN1, kN2 = Cfg::kN2, kN3 = Cfg::kN3;
  using TileQ = typename Cfg::TileQ;
  using TileK = typename Cfg::TileK;
  using TileP = typename Cfg::TileP;
  using Mma1 = WgmmaTag<kN1, T>;
  using Mma2 = WgmmaTag<kN2, T>;
  using Mma3 = WgmmaTag<kN3, T>;

  extern __shared__ __align__(1024) char smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t sQ = (raw + 1023u) & ~1023u;  // swizzle atoms need 1024-byte alignment
  char* smem = smem_raw + (sQ - raw);

  const int n_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const SeqInfo si = sm80::seq_info(p, b);
  const int n0 = n_block * kBlockN;
  if (n0 >= si.seqlen_k) return;
  const int rows_k = min(kBlockN, si.seqlen_k - n0);
  const int group = p.num_heads / p.num_heads_kv;
  const int hk = h / group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wg = warp / 4, wrow = (warp % 4) * 16;  // warpgroup; first of the warp's 16 rows in a wgmma tile
  const int g = lane / 4, t = lane % 4;
  // Warpgroup tiles: phase 1 keys k1.. x queries q1..; phase 2 keys k2.. x columns d2..; phase 3 queries q3.. x d3..
  const int k1 = 64 * (wg % Cfg::kP1KeyWG), q1 = kN1 * (wg / Cfg::kP1KeyWG);
  const int k2 = 64 * (wg % Cfg::kP2KeyWG), d2 = kN2 * (wg / Cfg::kP2KeyWG);
  const int q3 = 64 * (wg % Cfg::kP3QWG), d3 = kN3 * (wg / Cfg::kP3QWG);

  const core::MaskRule rule{si.seqlen_q, si.seqlen_k, p.window_left, p.window_right};
  int64_t q_first, q_last;
  rule.block_query_range(n0, n0 + rows_k, &q_first, &q_last);
  const int m_min = static_cast<int>(q_first / kBlockM);
  const int m_max = q_last > q_first ? static_cast<int>((q_last + kBlockM - 1) / kBlockM) : m_min;

  const T* qg_ = static_cast<const T*>(p.q) + b * p.q_s.batch + si.q_row0 * p.q_s.row + h * p.q_s.head;
  const T* dog = static_cast<const T*>(p.dout) + b * p.dout_s.batch + si.q_row0 * p.dout_s.row + h * p.dout_s.head;
  const T* kg = static_cast<const T*>(p.k) + b * p.k_s.batch + (si.k_row0 + n0) * p.k_s.row + hk * p.k_s.head;
  const T* vg = static_cast<const T*>(p.v) + b * p.v_s.batch + (si.k_row0 + n0) * p.v_s.row + hk * p.v_s.head;
  const int64_t row_base = sm80::global_row(p, si, b, 0);
  const float* lse2g = p.lse_log2 + static_cast<int64_t>(h) * p.total_q + row_base;
  const float* dsumg = p.dsum + static_cast<int64_t>(h) * p.total_q + row_base;

  const uint32_t sdO = sQ + 2 * TileQ::kBytes;
  const uint32_t sK = sdO + 2 * TileQ::kBytes;
  const uint32_t sV = sK + TileK::kBytes;
  const uint32_t sP = sV + TileK::kBytes;
  const uint32_t sdS = sP + TileP::kBytes;
  float* sLse = reinterpret_cast<float*>(smem + 4 * TileQ::kBytes + 2 * TileK::kBytes + 2 * TileP::kBytes);
  float* sD = sLse + 2 * kBlockM;

  {
    const sm80::TileCopy<TileK, kThreads> k_copy(p.head_dim);
    k_copy.copy(sK, kg, p.k_s.row, rows_k);
    k_copy.copy(sV, vg, p.v_s.row, rows_k);
  }
  const sm80::TileCopy<TileQ, kThreads> q_copy(p.head_dim);
  auto load_q_block = [&](int m, int buf) {
    const int m0 = m * kBlockM;
    const int rows = si.seqlen_q - m0;
    q_copy.copy(sQ + buf * TileQ::kBytes, qg_ + m0 * p.q_s.row, p.q_s.row, rows);
    q_copy.copy(sdO + buf * TileQ::kBytes, dog + m0 * p.dout_s.row, p.dout_s.row, rows);
    sm80::load_lse_dsum<kBlockM>(sLse + buf * kBlockM, sD + buf * kBlockM, lse2g, dsumg, m0, rows);
  };
  if (m_max > m_min) load_q_block(m_min, 0);
  cp_async_commit();

  float dk[kN2 / 2], dv[kN2 / 2];
#pragma unroll
  for (int i = 0; i < kN2 / 2; ++i) dk[i] = dv[i] = 0.f;

  // Descriptors of the warpgroup's operand tiles at k-step 0; a k-step adds a compile-time byte offset (>> 4).
  // Phase 1: A = K / V rows k1.. (K-major), B = Q / dO rows q1.. (K-major); K steps of 16 columns = 32 bytes inside a
  // 64-column panel, then the next panel.
  const uint64_t dK1 = desc_kmajor(sK + k1 * 128);
  const uint64_t dQ1 = desc_kmajor(sQ + q1 * 128);
  // Phase 2: A = P^T / dS^T rows k2.. (K-major, K = queries), B = dO / Q columns d2.. (MN-major, K = query rows).
  const uint64_t dP2 = desc_kmajor(sP + k2 * 128);
  // A warpgroup tile that starts inside a panel (32 columns) starts its rows (d % 64) * 2 bytes in.
  const uint64_t dO2 = desc_mnmajor(sdO + (d2 / 64) * TileQ::kPanelBytes + (d2 % 64) * 2, TileQ::kPanelBytes);
  const uint64_t dQ2 = desc_mnmajor(sQ + (d2 / 64) * TileQ::kPanelBytes + (d2 % 64) * 2, TileQ::kPanelBytes);
  // Phase 3: A = dS (queries q3.. contiguous in dS^T's rows: MN-major, K = key rows), B = K columns d3.. (MN-major).
  const uint64_t dS3 = desc_mnmajor(sdS + (q3 / 64) * TileP::kPanelBytes, TileP::kPanelBytes);
  const uint64_t dK3 = desc_mnmajor(sK + (d3 / 64) * TileK::kPanelBytes + (d3 % 64) * 2, TileK::kPanelBytes);
  constexpr uint64_t kVOff = TileK::kBytes >> 4, kDoOff = (2 * TileQ::kBytes) >> 4, kDsOff = TileP::kBytes >> 4;
  constexpr uint64_t kBufOff = TileQ::kBytes >> 4;
  const float scale_log2 = p.softmax_scale_log2;

  auto step = [&](const int m, auto mask_tag) {
    constexpr bool kMask = decltype(mask_tag)::value;
    const int buf = (m - m_min) & 1;
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    if (m + 1 < m_max) load_q_block(m + 1, buf ^ 1);
    cp_async_commit();
    const int m0 = m * kBlockM;
    const uint64_t bo = buf * kBufOff;

    // ---- phase 1: S^T and dP^T ------------------------------------------------------------------------------------
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

    const float* lse_s = sLse + buf * kBlockM;
    const float* d_s = sD + buf * kBlockM;
#pragma unroll
    for (int j = 0; j < kN1 / 8; ++j) {
      const int il0 = q1 + j * 8 + 2 * t;  // this thread's two query columns
      const float2 lse2 = *reinterpret_cast<const float2*>(lse_s + il0);
      const float2 d2v = *reinterpret_cast<const float2*>(d_s + il0);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int jl = k1 + wrow + g + 8 * hh;  // key row within the block
        float pv[2], dsv[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float sv = s[j * 4 + 2 * hh + e];
          if constexpr (kSoftcap) sv = tanh_approx(sv * p.score_scale);
          float pe = exp2_approx(fmaf(sv, scale_log2, -(e ? lse2.y : lse2.x)));
          if constexpr (kMask) {
            const int i = m0 + il0 + e, jj = n0 + jl;
            if (i >= si.seqlen_q || jj >= si.seqlen_k || !rule.visible(i, jj)) pe = 0.f;
          }
          float de = pe * (dp[j * 4 + 2 * hh + e] - (e ? d2v.y : d2v.x));
          if constexpr (kSoftcap) de *= (1.f - sv * sv);
          pv[e] = pe;
          dsv[e] = de;
        }
        const uint32_t off = TileP::offset_elem(jl, il0);
        *reinterpret_cast<uint32_t*>(smem + (sP - sQ) + off) = pack2<T>(pv[0], pv[1]);
        *reinterpret_cast<uint32_t*>(smem + (sdS - sQ) + off) = pack2<T>(dsv[0], dsv[1]);
      }
    }
    fence_proxy_async();
    __syncthreads();

    // ---- phase 3: dQ = dS K, then phase 2: dV += P^T dO, dK += dS^T Q (two commit groups) ----------------------
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
      wgmma_ss<0, 1>(Mma2{}, dv, dP2 + po, dO2 + bo + ro, 1);
      wgmma_ss<0, 1>(Mma2{}, dk, dP2 + kDsOff + po, dQ2 + bo + ro, 1);
    }
    wgmma_commit();
    if constexpr (Cfg::kOverlapDQ) {
      wgmma_wait<1>();  // dQ done; dV/dK may still run
    } else {
      wgmma_wait<0>();
    }
    fence_operands(dq);

    // ---- dQ partial -> float32 dq_accum ----------------------------------------------------------------------------
    float* dqa = p.dq_accum + ((row_base + m0) * p.num_heads + h) * static_cast<int64_t>(p.head_dim_rounded);
    const int64_t dq_row_stride = static_cast<int64_t>(p.num_heads) * p.head_dim_rounded;
    int* sem = nullptr;
    if (p.deterministic) sem = sm80::bwd_dq_turn_wait<kBlockM, kBlockN>(p, rule, si, b, h, m, n_block);
    // This thread's dQ fragment: rows q3 + wrow + g + 8*hh, columns d3 + 8*j + 2t.
    const int col0 = d3 + 2 * t;
    const int il0 = q3 + wrow + g;
    sm80::bwd_add_dq<1, kN3 / 8>(p, dqa + il0 * dq_row_stride + col0, dq_row_stride, il0, m0, si.seqlen_q, col0,
                                 !kMask && p.head_dim == kHeadDim,
                                 [&](int, int j, int hh, int e) { return dq[j * 4 + 2 * hh + e]; });
    if (p.deterministic) sm80::bwd_dq_turn_done(sem);
    wgmma_wait<0>();
    fence_operands(dv);
    fence_operands(dk);
  };

  for (int m = m_min; m < m_max; ++m) {
    if (sm80::bwd_needs_mask<kBlockM, kBlockN>(rule, si, m, n0)) {
      step(m, std::true_type{});
    } else {
      step(m, std::false_type{});
    }
  }
  cp_async_wait<0>();

  // ---- epilogue: dK (scaled), dV: rows k2 + wrow + g + 8*hh, columns d2 + 8*j + 2t ------------------------------------
#pragma unroll
  for (int j = 0; j < kN2 / 8; ++j)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int jl = k2 + wrow + g + 8 * hh;
      const int c = d2 + j * 8 + 2 * t;
      if (jl >= rows_k || c >= p.head_dim) continue;
      const float k0v = dk[j * 4 + 2 * hh] * p.softmax_scale, k1v = dk[j * 4 + 2 * hh + 1] * p.softmax_scale;
      sm80::bwd_store_dkdv<T>(p, si, b, h, hk, n0, jl, c, k0v, k1v, dv[j * 4 + 2 * hh], dv[j * 4 + 2 * hh + 1]);
    }
#else
  __trap();  // built without sm_90a code: the launcher checks the binary before choosing this kernel
#endif
}

}  // namespace flashkv::cuda::sm90
