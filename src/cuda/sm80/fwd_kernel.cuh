// FlashAttention-2 forward kernel for sm_80+ (mma.sync m16n8k16, ldmatrix, cp.async).
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
#include "cuda/params.hpp"
#include "cuda/sm80/common.cuh"
#include "cuda/sm80/ptx.cuh"
#include "cuda/sm80/tile.cuh"

namespace flashkv::cuda::sm80 {

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, bool kRescaleSkip_ = true>
struct FwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  /// Conditional rescaling (FlashAttention-4's idea, exact): a row's running max m is raised only when the new tile
  /// max exceeds it by more than kRescaleThreshold (log2 units), so P = exp2(s - m) stays <= 2^threshold; O and l are
  /// rescaled only then, and a warp skips the O rescale entirely when none of its rows moved. Numerator and
  /// denominator use the same m, so the result is unchanged.
  static constexpr bool kRescaleSkip = kRescaleSkip_;
  static constexpr float kRescaleThreshold = 8.f;
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
__global__ void __launch_bounds__(Cfg::kThreads) fwd_kernel(const FwdParams p) {
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kHeadDim = Cfg::kHeadDim;
  constexpr int kThreads = Cfg::kThreads, kMT = Cfg::kMTiles;
  constexpr int kNT = kBlockN / 8;   // 8-column tiles of S
  constexpr int kDT = kHeadDim / 8;  // 8-column tiles of O
  using TileQ = typename Cfg::TileQ;
  using TileKV = typename Cfg::TileKV;

  extern __shared__ __align__(128) char smem[];
  const int m_block = static_cast<int>(gridDim.x - 1 - blockIdx.x);  // heaviest (causal) blocks first
  const int h = blockIdx.y, b = blockIdx.z;
  const SeqInfo si = seq_info(p, b);
  const int m0 = m_block * kBlockM;
  if (m0 >= si.seqlen_q) return;
  const int rows_q = min(kBlockM, si.seqlen_q - m0);
  const int hk = h / (p.num_heads / p.num_heads_kv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int warp_row0 = warp * 16 * kMT;

  const T* qg = static_cast<const T*>(p.q) + b * p.q_s.batch + (si.q_row0 + m0) * p.q_s.row + h * p.q_s.head;
  const T* kg = static_cast<const T*>(p.k) + b * p.k_s.batch + si.k_row0 * p.k_s.row + hk * p.k_s.head;
  const T* vg = static_cast<const T*>(p.v) + b * p.v_s.batch + si.k_row0 * p.v_s.row + hk * p.v_s.head;

  const core::MaskRule rule{si.seqlen_q, si.seqlen_k, p.window_left, p.window_right};
  int64_t key_first, key_last;
  rule.block_key_range(m0, m0 + rows_q, &key_first, &key_last);
  const int n_min = static_cast<int>(key_first / kBlockN);
  const int n_max = key_last > key_first ? static_cast<int>((key_last + kBlockN - 1) / kBlockN) : n_min;

  const uint32_t sQ = smem_addr(smem);
  const uint32_t sK = sQ + TileQ::kBytes;
  const uint32_t sV = sK + TileKV::kBytes;

  const TileCopy<TileKV, kThreads> kv_copy(p.head_dim);
  auto load_kv = [&](uint32_t dst, const T* base, int64_t row_stride, int n) {
    const int r0 = n * kBlockN;
    kv_copy.copy(dst, base + r0 * row_stride, row_stride, si.seqlen_k - r0);
  };
  TileCopy<TileQ, kThreads>(p.head_dim).copy(sQ, qg, p.q_s.row, rows_q);
  if (n_max > n_min) load_kv(sK, kg, p.k_s.row, n_max - 1);
  cp_async_commit();

  float o[kMT][kDT][4];
  float row_max[kMT][2], row_sum[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0.f;
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }
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

    // ---- S = Q K^T -------------------------------------------------------------------------------------------------
    float s[kMT][kNT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
        ldmatrix_x4(a[mt], q_addr(warp_row0 + mt * 16, kk * 2));
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

    // ---- softcap, mask (boundary tiles only), online softmax ------------------------------------------------------
    if constexpr (kSoftcap) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][nt][e] = tanh_approx(s[mt][nt][e] * p.score_scale);
    }
    if constexpr (kMask) {
      const int n0 = n * kBlockN;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          // Row i sees keys [row_first(i), row_last(i)) (already clipped to [0, seqlen_k]).
          const int i = m0 + warp_row0 + mt * 16 + g + 8 * hh;
          const int lo = static_cast<int>(rule.row_first(i)) - n0 - 2 * t;
          const int hi = static_cast<int>(rule.row_last(i)) - n0 - 2 * t;
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int jj = nt * 8 + e;  // key offset relative to n0 + 2t
              if (jj < lo || jj >= hi) s[mt][nt][2 * hh + e] = -INFINITY;
            }
        }
    }
    float corr[kMT][2];
    bool any_rescale = false;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hh], s[mt][nt][2 * hh + 1]));
        mx = quad_max(mx);
        const float m_old = row_max[mt][hh];
        // Raise m only when the tile max exceeds it (by more than the threshold with conditional rescaling; the
        // first finite max always raises it since m_old = -inf).
        const bool raise = Cfg::kRescaleSkip ? (mx - m_old) * scale_log2 > Cfg::kRescaleThreshold : mx > m_old;
        corr[mt][hh] = 1.f;
        if (raise) {
          corr[mt][hh] = exp2_approx((m_old - mx) * scale_log2);  // 0 when m_old = -inf
          row_max[mt][hh] = mx;
          row_sum[mt][hh] *= corr[mt][hh];
          any_rescale = true;
        }
        const float m_scaled = row_max[mt][hh] == -INFINITY ? 0.f : row_max[mt][hh] * scale_log2;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pv = exp2_approx(fmaf(s[mt][nt][2 * hh + e], scale_log2, -m_scaled));
            s[mt][nt][2 * hh + e] = pv;
            sum += pv;
          }
        row_sum[mt][hh] += sum;
      }
    // O rescale; skipped by the whole warp when no row of it raised its max (warp-uniform branch).
    if (!Cfg::kRescaleSkip || __any_sync(0xffffffffu, any_rescale)) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt) {
          o[mt][dt][0] *= corr[mt][0];
          o[mt][dt][1] *= corr[mt][0];
          o[mt][dt][2] *= corr[mt][1];
          o[mt][dt][3] *= corr[mt][1];
        }
    }

    cp_async_wait<0>();
    __syncthreads();  // V(n) landed; every warp is done with K(n)
    if (n > n_min) load_kv(sK, kg, p.k_s.row, n - 1);
    cp_async_commit();

    // ---- O += P V ----------------------------------------------------------------------------------------------------
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
          mma_16816<T>(o[mt][2 * dt2], a[mt], bv[0], bv[1]);
          mma_16816<T>(o[mt][2 * dt2 + 1], a[mt], bv[2], bv[3]);
        }
      }
    }
  };

  // Walk the visible tiles from the last to the first: the boundary tiles at the top (diagonal / past seqlen_k) with
  // masks, then the fully visible ones without, then (sliding window) the masked ones at the left edge.
  auto needs_mask = [&](int n) {
    const int n0 = n * kBlockN;
    return n0 + kBlockN > si.seqlen_k || !rule.tile_fully_visible(m0, m0 + rows_q, n0, n0 + kBlockN);
  };
  for (int n = n_max - 1; n >= n_min; --n) {
    if (needs_mask(n)) {
      step(n, std::true_type{});
    } else {
      step(n, std::false_type{});
    }
  }

  // ---- epilogue: one division, lse, coalesced 16-byte stores through the warp's own Q rows in shared memory -----
  cp_async_wait<0>();
  __syncthreads();
  T* og = static_cast<T*>(p.out) + b * p.out_s.batch + (si.q_row0 + m0) * p.out_s.row + h * p.out_s.head;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float l = quad_sum(row_sum[mt][hh]);
      const float inv = (l > 0.f) ? 1.f / l : 0.f;
      const int r = warp_row0 + mt * 16 + g + 8 * hh;
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) {
        const uint32_t packed = pack2<T>(o[mt][dt][2 * hh] * inv, o[mt][dt][2 * hh + 1] * inv);
        *reinterpret_cast<uint32_t*>(smem + TileQ::offset_elem(r, dt * 8 + 2 * t)) = packed;
      }
      if (p.lse != nullptr && t == 0 && m0 + r < si.seqlen_q) {
        const float m_scaled = row_max[mt][hh] * scale_log2;
        const float lse = l > 0.f ? (m_scaled + log2f(l)) * 0.69314718055994531f : -INFINITY;
        const int64_t row = (p.cu_seqlens_q != nullptr ? si.q_row0 : 0) + m0 + r;
        p.lse[b * p.lse_batch + h * p.lse_head + row * p.lse_row] = lse;
      }
    }
  __syncwarp();
  constexpr int kChunks = TileQ::kChunks;
  for (int i = lane; i < 16 * kMT * kChunks; i += 32) {
    const int r = warp_row0 + i / kChunks, c = i % kChunks;
    if (m0 + r < si.seqlen_q && c * 8 < p.head_dim) {
      const uint4 val = *reinterpret_cast<const uint4*>(smem + TileQ::offset(r, c));
      *reinterpret_cast<uint4*>(og + r * p.out_s.row + c * 8) = val;
    }
  }
}

}  // namespace flashkv::cuda::sm80
