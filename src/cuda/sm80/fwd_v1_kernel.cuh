// FlashAttention-1 loop order (Dao et al., "FlashAttention", NeurIPS 2022, §3.1 Alg. 1), kept only for the
// progression benchmark (naive -> v1 -> v2): one CTA per (head, batch) — FA1 parallelizes over batch x heads only —
// with the K/V blocks in the OUTER loop and the query blocks inside; the running output O (float32, unnormalized),
// max m and sum l of every query row are re-read from and re-written to global memory at every K/V step. The tile
// math (mma.sync, online-softmax update, masks) is the same as the FA2 kernel's; a final pass divides by l.
#pragma once

#include <cmath>

#include "core/mask.hpp"
#include "cuda/common/block.cuh"
#include "cuda/common/nonfinite.cuh"
#include "cuda/common/seqlen.cuh"
#include "cuda/common/tile.cuh"
#include "cuda/common/tile_size.hpp"
#include "cuda/params.hpp"
#include "cuda/sm80/mma.cuh"

namespace flashkv::cuda::sm80 {

template <int kHeadDim_>
struct FwdV1Config {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = fwd_v1_tile().block_m, kBlockN = fwd_v1_tile().block_n;
  static constexpr int kNWarps = fwd_v1_tile().warps, kThreads = kNWarps * 32;
  static_assert(kBlockM == 16 * kNWarps, "one 16-row mma tile per warp");
  using TileQ = SmemTile<kBlockM, kHeadDim>;
  using TileKV = SmemTile<kBlockN, kHeadDim>;
  static constexpr int kSmemBytes = TileQ::kBytes + 2 * TileKV::kBytes;
};

template <class Cfg, class T>
__global__ void __launch_bounds__(Cfg::kThreads) fwd_v1_kernel(const FwdParams p) {
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kHeadDim = Cfg::kHeadDim, kThreads = Cfg::kThreads;
  constexpr int kNT = kBlockN / 8, kDT = kHeadDim / 8;
  using TileQ = typename Cfg::TileQ;
  using TileKV = typename Cfg::TileKV;
  extern __shared__ __align__(128) char smem[];
  const int h = blockIdx.x, b = blockIdx.y;
  const SeqInfo si = seq_info(p, b);
  const int hk = h / (p.num_heads / p.num_heads_kv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const T* qg = static_cast<const T*>(p.q) + b * p.q_s.batch + si.q_row0 * p.q_s.row + h * p.q_s.head;
  const T* kg = static_cast<const T*>(p.k) + b * p.k_s.batch + si.k_row0 * p.k_s.row + hk * p.k_s.head;
  const T* vg = static_cast<const T*>(p.v) + b * p.v_s.batch + si.k_row0 * p.v_s.row + hk * p.v_s.head;
  const int64_t ws_row0 = (static_cast<int64_t>(b) * p.num_heads + h) * p.v1_rows;
  float* Og = p.v1_o + ws_row0 * kHeadDim;
  float* MLg = p.v1_ml + ws_row0 * 2;
  const core::MaskRule rule{si.seqlen_q, si.seqlen_k, p.window_left, p.window_right};
  const uint32_t sQ = smem_addr(smem), sK = sQ + TileQ::kBytes, sV = sK + TileKV::kBytes;
  const LdsmAddr<TileQ> q_addr(sQ, lane % 16, lane / 16);
  const LdsmAddr<TileKV> k_addr(sK, (lane % 8) + (lane / 16) * 8, (lane / 8) % 2);
  const LdsmAddr<TileKV> v_addr(sV, (lane % 8) + ((lane / 8) % 2) * 8, lane / 16);
  const float scale_log2 = p.softmax_scale_log2;
  const int m_blocks = (si.seqlen_q + kBlockM - 1) / kBlockM;
  const int n_blocks = (si.seqlen_k + kBlockN - 1) / kBlockN;

  // Initialize O = 0, m = -inf, l = 0 in global memory.
  for (int i = threadIdx.x; i < m_blocks * kBlockM; i += kThreads) {
    MLg[2 * i] = -INFINITY;
    MLg[2 * i + 1] = 0.f;
    for (int c = 0; c < kHeadDim; ++c) Og[static_cast<int64_t>(i) * kHeadDim + c] = 0.f;
  }
  __syncthreads();

  for (int n = 0; n < n_blocks; ++n) {  // K/V outer
    const int n0 = n * kBlockN;
    cp_async_wait<0>();
    __syncthreads();
    load_tile_async<TileKV, kThreads>(sK, [&](int r) { return kg + (n0 + r) * p.k_s.row; }, si.seqlen_k - n0,
                                      p.head_dim, kg);
    load_tile_async<TileKV, kThreads>(sV, [&](int r) { return vg + (n0 + r) * p.v_s.row; }, si.seqlen_k - n0,
                                      p.head_dim, vg);
    cp_async_commit();
    for (int mb = 0; mb < m_blocks; ++mb) {  // Q inner
      const int m0 = mb * kBlockM;
      const int rows_q = min(kBlockM, si.seqlen_q - m0);
      int64_t kf, kl;
      rule.block_key_range(m0, m0 + rows_q, &kf, &kl);
      if (kl <= kf || n0 >= kl || n0 + kBlockN <= kf) continue;  // block skipped (uniform across the CTA)
      __syncthreads();
      load_tile_async<TileQ, kThreads>(sQ, [&](int r) { return qg + (m0 + r) * p.q_s.row; }, rows_q, p.head_dim, qg);
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();
      float s[kNT][4] = {};
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4(a, q_addr(warp * 16, kk * 2));
#pragma unroll
        for (int nt2 = 0; nt2 < kNT / 2; ++nt2) {
          uint32_t bk[4];
          ldmatrix_x4(bk, k_addr(nt2 * 16, kk * 2));
          mma_16816<T>(s[2 * nt2], a, bk[0], bk[1]);
          mma_16816<T>(s[2 * nt2 + 1], a, bk[2], bk[3]);
        }
      }
      // Read O, m, l of this query block from global memory (the FA1 traffic).
      float o[kDT][4], mx_old[2], l_old[2];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = m0 + warp * 16 + g + 8 * hh;
        mx_old[hh] = MLg[2 * r];
        l_old[hh] = MLg[2 * r + 1];
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt) {
          const float2 v2 = *reinterpret_cast<const float2*>(&Og[static_cast<int64_t>(r) * kHeadDim + dt * 8 + 2 * t]);
          o[dt][2 * hh] = v2.x, o[dt][2 * hh + 1] = v2.y;
        }
      }
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int i = m0 + warp * 16 + g + 8 * hh;
        const int lo = static_cast<int>(rule.row_first(i)) - n0 - 2 * t;
        const int hi = static_cast<int>(rule.row_last(i)) - n0 - 2 * t;
        float mx = mx_old[hh];
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float x = s[nt][2 * hh + e];
            if (p.softcap) x = tanh_approx(x * p.score_scale);
            const int jj = nt * 8 + e;
            if (jj < lo || jj >= hi || i >= si.seqlen_q) x = -INFINITY;
            s[nt][2 * hh + e] = x;
            mx = fmaxf(mx, x);
          }
        mx = quad_max(mx);
        const float m_scaled = mx == -INFINITY ? 0.f : mx * scale_log2;
        const float corr = exp2_approx(mx_old[hh] * scale_log2 - m_scaled);
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pv = exp2_approx(fmaf(s[nt][2 * hh + e], scale_log2, -m_scaled));
            s[nt][2 * hh + e] = pv;
            sum += pv;
          }
        sum = quad_sum(sum);
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt) o[dt][2 * hh] *= corr, o[dt][2 * hh + 1] *= corr;
        mx_old[hh] = mx;
        l_old[hh] = l_old[hh] * corr + sum;
      }
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        uint32_t a[4];
        a[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
        a[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
        a[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        a[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
        for (int dt2 = 0; dt2 < kDT / 2; ++dt2) {
          uint32_t bv[4];
          ldmatrix_x4_trans(bv, v_addr(kk * 16, dt2 * 2));
          mma_16816<T>(o[2 * dt2], a, bv[0], bv[1]);
          mma_16816<T>(o[2 * dt2 + 1], a, bv[2], bv[3]);
        }
      }
      // Write O, m, l back.
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = m0 + warp * 16 + g + 8 * hh;
        if (t == 0) MLg[2 * r] = mx_old[hh], MLg[2 * r + 1] = l_old[hh];
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt)
          *reinterpret_cast<float2*>(&Og[static_cast<int64_t>(r) * kHeadDim + dt * 8 + 2 * t]) =
              make_float2(o[dt][2 * hh], o[dt][2 * hh + 1]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();
  // Final pass: out = O / l, lse = m * scale + log(l); a row with no visible key gets 0 / -inf, every other row is
  // IEEE (common/softmax.cuh, OnlineSoftmax::finalize).
  T* og = static_cast<T*>(p.out) + b * p.out_s.batch + si.q_row0 * p.out_s.row + h * p.out_s.head;
  for (int idx = threadIdx.x; idx < si.seqlen_q * (p.head_dim / 2); idx += kThreads) {
    const int i = idx / (p.head_dim / 2), c = (idx % (p.head_dim / 2)) * 2;
    const float l = MLg[2 * i + 1], m = MLg[2 * i];
    const bool empty = rule.row_first(i) >= rule.row_last(i);
    const float inv = empty ? 0.f : 1.f / l;
    const float2 v2 = *reinterpret_cast<const float2*>(&Og[static_cast<int64_t>(i) * kHeadDim + c]);
    *reinterpret_cast<uint32_t*>(og + static_cast<int64_t>(i) * p.out_s.row + c) =
        empty ? 0u : pack2<T>(v2.x * inv, v2.y * inv);
    if (c == 0 && p.lse != nullptr) {
      const int64_t row = (p.cu_seqlens_q != nullptr ? si.q_row0 : 0) + i;
      p.lse[b * p.lse_batch + h * p.lse_head + row * p.lse_row] =
          empty ? -INFINITY : (m == -INFINITY ? NAN : (m * scale_log2 + log2f(l)) * 0.69314718055994531f);
    }
  }
  // Rows whose O holds a non-finite element (legitimate, or 0 * inf from a masked key in P V) are recomputed exactly
  // (common/nonfinite.cuh); one warp per row, rare.
  __syncthreads();
  attn::FwdBlock blk;
  blk.si = si, blk.rule = rule, blk.m0 = 0, blk.rows_q = si.seqlen_q, blk.h = h, blk.hk = hk, blk.b = b;
  for (int i = warp; i < si.seqlen_q; i += Cfg::kNWarps) {
    bool bad = false;
    for (int c = lane; c < p.head_dim; c += 32) {
      bad |= (__float_as_uint(Og[static_cast<int64_t>(i) * kHeadDim + c]) & 0x7F800000u) == 0x7F800000u;
    }
    if (__any_sync(0xffffffffu, bad)) attn::recompute_row_exact<T, kHeadDim>(p, blk, i, lane);
  }
}

}  // namespace flashkv::cuda::sm80
