// Verbatim copy of src/cuda/sm80/fwd_kernel.cuh at commit edcd204 (the first release), namespace renamed to sm80_prev:
// the "own previous version" anchor of the tuning runs. Regenerate with
//   git show edcd204:src/cuda/sm80/fwd_kernel.cuh | sed 's/namespace flashkv::cuda::sm80 {/namespace flashkv::cuda::sm80_prev {\nusing namespace flashkv::cuda::sm80;/; s#}  // namespace flashkv::cuda::sm80#}  // namespace flashkv::cuda::sm80_prev#'
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

#include "core/mask.hpp"
#include "cuda/params.hpp"
#include "cuda/sm80/common.cuh"
#include "cuda/sm80/ptx.cuh"
#include "cuda/sm80/tile.cuh"

namespace flashkv::cuda::sm80_prev {
using namespace flashkv::cuda::sm80;

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_>
struct FwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
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

template <class Cfg, class T>
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

  auto load_kv = [&](uint32_t dst, const T* base, int64_t row_stride, int n) {
    const int r0 = n * kBlockN;
    load_tile_async<TileKV, kThreads>(
        dst, [&](int r) { return base + (r0 + r) * row_stride; }, si.seqlen_k - r0, p.head_dim, base);
  };
  load_tile_async<TileQ, kThreads>(sQ, [&](int r) { return qg + r * p.q_s.row; }, rows_q, p.head_dim, qg);
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

  for (int n = n_max - 1; n >= n_min; --n) {
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
    if (p.softcap) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][nt][e] = tanh_approx(s[mt][nt][e] * p.score_scale);
    }
    const int n0 = n * kBlockN;
    const bool need_mask =
        n0 + kBlockN > si.seqlen_k || !rule.tile_fully_visible(m0, m0 + rows_q, n0, n0 + kBlockN);
    if (need_mask) {
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
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float mx = row_max[mt][hh];
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hh], s[mt][nt][2 * hh + 1]));
        mx = quad_max(mx);
        const float m_scaled = mx == -INFINITY ? 0.f : mx * scale_log2;
        const float corr = exp2_approx(row_max[mt][hh] * scale_log2 - m_scaled);
        row_max[mt][hh] = mx;
        row_sum[mt][hh] *= corr;
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt) {
          o[mt][dt][2 * hh] *= corr;
          o[mt][dt][2 * hh + 1] *= corr;
        }
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

}  // namespace flashkv::cuda::sm80_prev
