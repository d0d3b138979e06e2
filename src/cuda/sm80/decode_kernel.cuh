// Split-KV decode (flash-decoding) over a paged 16-bit KV cache, sm_80+.
//
// Source: Dao, Haziza, Massa, Sizov, "Flash-Decoding for long-context inference" (2023) and the FlashAttention-3
// code's split-KV + combine + PackGQA (notes §4.5): the key range of each sequence is cut into num_splits chunks, one
// CTA per (split, kv head x 16-row query tile, batch); the query rows of all query heads that share one kv head are
// packed into the 16-row mma tile (PackGQA), so each K/V byte is read once per kv head. Inside a CTA the 4 warps
// split every 64-token K/V tile 4 ways (16 tokens each, own running max/sum/accumulator) and are merged at the end;
// K/V tiles stream through a 3-stage cp.async ring. Each split writes a normalized partial output and its lse
// (float32); decode_combine_kernel merges them. With num_splits == 1 the CTA writes the final output directly.
#pragma once

#include <cmath>

#include "cuda/params.hpp"
#include "cuda/common/ptx.cuh"
#include "cuda/sm80/mma.cuh"
#include "cuda/common/tile.cuh"

namespace flashkv::cuda::sm80 {

template <int kHeadDim_>
struct DecodeConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = 64;  // tokens per pipeline stage (16 per warp)
  static constexpr int kNWarps = 4;
  static constexpr int kThreads = kNWarps * 32;
  static constexpr int kStages = 3;
  using TileQ = SmemTile<16, kHeadDim>;
  using TileKV = SmemTile<kBlockN, kHeadDim>;
  static constexpr int kStageBytes = 2 * TileKV::kBytes;
  static constexpr int kCombineBytes = kNWarps * 16 * (kHeadDim + 2) * 4;
  static constexpr int kLoopBytes = kStages * kStageBytes;
  static constexpr int kSmemBytes = TileQ::kBytes + (kLoopBytes > kCombineBytes ? kLoopBytes : kCombineBytes);
};

template <class Cfg, class T>
__global__ void __launch_bounds__(Cfg::kThreads) decode_kernel(const DecodeParams p) {
  constexpr int kHeadDim = Cfg::kHeadDim, kBlockN = Cfg::kBlockN, kThreads = Cfg::kThreads;
  constexpr int kStages = Cfg::kStages, kDT = kHeadDim / 8;
  using TileQ = typename Cfg::TileQ;
  using TileKV = typename Cfg::TileKV;
  extern __shared__ __align__(128) char smem[];

  const int split = blockIdx.x;
  const int row_tiles = (p.rows_per_kv_head + 15) / 16;
  const int hk = blockIdx.y / row_tiles, rt = blockIdx.y % row_tiles;
  const int b = blockIdx.z;
  const int group = p.num_heads / p.num_heads_kv;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int capacity = p.max_seqlen_k;  // tokens the cache (page table) can hold: never read past it
  int seqlen_k = p.seqlens_k[b];
  if (capacity > 0 && seqlen_k > capacity) seqlen_k = capacity;
  const int n_blocks = (seqlen_k + kBlockN - 1) / kBlockN;
  const int per_split = (n_blocks + p.num_splits - 1) / p.num_splits;
  const int nb_begin = split * per_split;
  const int nb_end = min(n_blocks, nb_begin + per_split);
  const int row0 = rt * 16;
  const int rows = min(16, p.rows_per_kv_head - row0);
  const int shift = seqlen_k - p.seqlen_q;  // bottom-right causal alignment of the seqlen_q new tokens

  const uint32_t sQ = smem_addr(smem);
  const uint32_t sKV = sQ + TileQ::kBytes;
  const T* qbase = static_cast<const T*>(p.q) + b * p.q_s.batch;
  load_tile_async<TileQ, kThreads>(
      sQ,
      [&](int r) {
        const int pr = row0 + r, qi = pr / group, h = hk * group + pr % group;
        return qbase + qi * p.q_s.row + h * p.q_s.head;
      },
      rows, p.head_dim, qbase);
  cp_async_commit();

  const T* kc = static_cast<const T*>(p.k_cache) + hk * p.k_head;
  const T* vc = static_cast<const T*>(p.v_cache) + hk * p.v_head;
  const int page_mask = (1 << p.page_size_log2) - 1;
  const int32_t* pt = p.page_table != nullptr ? p.page_table + b * p.page_table_batch : nullptr;
  auto token_offset = [&](int j, int64_t page_stride, int64_t row_stride) -> int64_t {
    if (pt == nullptr) return b * page_stride + j * row_stride;
    return static_cast<int64_t>(pt[j >> p.page_size_log2]) * page_stride + (j & page_mask) * row_stride;
  };
  auto load_stage = [&](int nb, int stage) {
    const int j0 = nb * kBlockN;
    const uint32_t dst = sKV + stage * Cfg::kStageBytes;
    load_tile_async<TileKV, kThreads>(
        dst, [&](int r) { return kc + token_offset(j0 + r, p.k_page, p.k_row); }, seqlen_k - j0, p.head_dim, kc);
    load_tile_async<TileKV, kThreads>(
        dst + TileKV::kBytes, [&](int r) { return vc + token_offset(j0 + r, p.v_page, p.v_row); }, seqlen_k - j0,
        p.head_dim, vc);
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (nb_begin + s < nb_end) load_stage(nb_begin + s, s);
    cp_async_commit();
  }

  cp_async_wait<kStages - 1>();  // Q landed (the oldest group)
  __syncthreads();
  uint32_t qa[kHeadDim / 16][4];
  {
    const LdsmAddr<TileQ> q_addr(sQ, lane % 16, lane / 16);
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) ldmatrix_x4(qa[kk], q_addr(0, kk * 2));
  }
  const LdsmAddr<TileKV> k_addr(sKV, (lane % 8) + (lane / 16) * 8, (lane / 8) % 2);
  const LdsmAddr<TileKV> v_addr(sKV + TileKV::kBytes, (lane % 8) + ((lane / 8) % 2) * 8, lane / 16);

  float o[kDT][4];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
  const float scale_log2 = p.softmax_scale_log2;

  for (int it = 0; nb_begin + it < nb_end; ++it) {
    const int nb = nb_begin + it;
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage `it` landed; every warp is done with the stage refilled below
    if (nb + kStages - 1 < nb_end) load_stage(nb + kStages - 1, (it + kStages - 1) % kStages);
    cp_async_commit();
    const uint32_t soff = (it % kStages) * Cfg::kStageBytes;

    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t bk[4];
      ldmatrix_x4(bk, k_addr(warp * 16, kk * 2) + soff);
      mma_16816<T>(s[0], qa[kk], bk[0], bk[1]);
      mma_16816<T>(s[1], qa[kk], bk[2], bk[3]);
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[nt][e];
        if (p.softcap) x = tanh_approx(x * p.score_scale);
        const int j = nb * kBlockN + warp * 16 + nt * 8 + 2 * t + (e & 1);
        const int qi = (row0 + g + (e >= 2 ? 8 : 0)) / group;
        if (j >= seqlen_k || (p.causal && j > qi + shift)) x = -INFINITY;
        s[nt][e] = x;
      }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float mx = fmaxf(row_max[hh], fmaxf(fmaxf(s[0][2 * hh], s[0][2 * hh + 1]), fmaxf(s[1][2 * hh], s[1][2 * hh + 1])));
      mx = quad_max(mx);
      const float m_scaled = mx == -INFINITY ? 0.f : mx * scale_log2;
      const float corr = exp2_approx(row_max[hh] * scale_log2 - m_scaled);
      row_max[hh] = mx;
      row_sum[hh] *= corr;
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) o[dt][2 * hh] *= corr, o[dt][2 * hh + 1] *= corr;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pv = exp2_approx(fmaf(s[nt][2 * hh + e], scale_log2, -m_scaled));
          s[nt][2 * hh + e] = pv;
          row_sum[hh] += pv;
        }
    }
    uint32_t a[4];
    a[0] = pack2<T>(s[0][0], s[0][1]);
    a[1] = pack2<T>(s[0][2], s[0][3]);
    a[2] = pack2<T>(s[1][0], s[1][1]);
    a[3] = pack2<T>(s[1][2], s[1][3]);
#pragma unroll
    for (int dt2 = 0; dt2 < kDT / 2; ++dt2) {
      uint32_t bv[4];
      ldmatrix_x4_trans(bv, v_addr(warp * 16, dt2 * 2) + soff);
      mma_16816<T>(o[2 * dt2], a, bv[0], bv[1]);
      mma_16816<T>(o[2 * dt2 + 1], a, bv[2], bv[3]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();

  // ---- merge the 4 warps' partial softmax states (scratch reuses the K/V ring) ------------------------------------
  float* sO = reinterpret_cast<float*>(smem + TileQ::kBytes);  // [warp][16][kHeadDim]
  float* sM = sO + Cfg::kNWarps * 16 * kHeadDim;               // [warp][16] scaled row max (log2 units)
  float* sL = sM + Cfg::kNWarps * 16;                          // [warp][16] row sum
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = g + 8 * hh;
    const float l = quad_sum(row_sum[hh]);
    if (t == 0) {
      sM[warp * 16 + r] = row_max[hh] * scale_log2;  // -inf stays -inf
      sL[warp * 16 + r] = l;
    }
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
      *reinterpret_cast<float2*>(&sO[(warp * 16 + r) * kHeadDim + dt * 8 + 2 * t]) =
          make_float2(o[dt][2 * hh], o[dt][2 * hh + 1]);
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < 16 * (kHeadDim / 2); idx += kThreads) {
    const int r = idx / (kHeadDim / 2), c = (idx % (kHeadDim / 2)) * 2;
    if (r >= rows || c >= p.head_dim) continue;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < Cfg::kNWarps; ++w) M = fmaxf(M, sM[w * 16 + r]);
    float L = 0.f, ox = 0.f, oy = 0.f;
    if (M != -INFINITY) {
#pragma unroll
      for (int w = 0; w < Cfg::kNWarps; ++w) {
        const float wt = exp2_approx(sM[w * 16 + r] - M);
        L += wt * sL[w * 16 + r];
        const float2 v = *reinterpret_cast<const float2*>(&sO[(w * 16 + r) * kHeadDim + c]);
        ox += wt * v.x, oy += wt * v.y;
      }
    }
    const float inv = L > 0.f ? 1.f / L : 0.f;
    const float lse = L > 0.f ? (M + log2f(L)) * 0.69314718055994531f : -INFINITY;
    const int pr = row0 + r, qi = pr / group, h = hk * group + pr % group;
    if (p.num_splits == 1) {
      T* og = static_cast<T*>(p.out) + b * p.out_s.batch + qi * p.out_s.row + h * p.out_s.head + c;
      *reinterpret_cast<uint32_t*>(og) = pack2<T>(ox * inv, oy * inv);
      if (p.lse != nullptr && c == 0) p.lse[b * p.lse_batch + h * p.lse_head + qi * p.lse_row] = lse;
    } else {
      const int64_t row = ((static_cast<int64_t>(split) * p.batch + b) * p.num_heads + h) * p.seqlen_q + qi;
      *reinterpret_cast<float2*>(p.o_accum + row * kHeadDim + c) = make_float2(ox * inv, oy * inv);
      if (c == 0) p.lse_accum[row] = lse;
    }
  }
}

/// Merges the num_splits partial outputs: one warp per (batch, head, query row).
template <int kHeadDim, class T>
__global__ void decode_combine_kernel(const DecodeParams p) {
  const int64_t warp_id = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  const int64_t rows = static_cast<int64_t>(p.batch) * p.num_heads * p.seqlen_q;
  if (warp_id >= rows) return;
  const int qi = static_cast<int>(warp_id % p.seqlen_q);
  const int h = static_cast<int>((warp_id / p.seqlen_q) % p.num_heads);
  const int b = static_cast<int>(warp_id / (static_cast<int64_t>(p.seqlen_q) * p.num_heads));
  float M = -INFINITY;
  for (int s = 0; s < p.num_splits; ++s) M = fmaxf(M, p.lse_accum[s * rows + warp_id]);
  constexpr int kPer = kHeadDim / 32;
  float acc[kPer] = {};
  float L = 0.f;
  if (M != -INFINITY) {
    for (int s = 0; s < p.num_splits; ++s) {
      const float w = __expf(p.lse_accum[s * rows + warp_id] - M);
      L += w;
      const float* src = p.o_accum + (s * rows + warp_id) * kHeadDim;
#pragma unroll
      for (int i = 0; i < kPer; ++i) acc[i] += w * src[lane + 32 * i];
    }
  }
  const float inv = L > 0.f ? 1.f / L : 0.f;
  T* og = static_cast<T*>(p.out) + b * p.out_s.batch + qi * p.out_s.row + h * p.out_s.head;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int c = lane + 32 * i;
    if (c < p.head_dim) og[c] = static_cast<T>(acc[i] * inv);
  }
  if (p.lse != nullptr && lane == 0) p.lse[b * p.lse_batch + h * p.lse_head + qi * p.lse_row] = L > 0.f ? M + logf(L) : -INFINITY;
}

}  // namespace flashkv::cuda::sm80
