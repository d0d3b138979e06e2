// FlashAttention forward on Hopper warpgroup MMA (sm_90a).
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
#include "cuda/params.hpp"
#include "cuda/sm80/common.cuh"
#include "cuda/sm80/ptx.cuh"
#include "cuda/sm80/tile.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace flashkv::cuda::sm90 {

template <int kHeadDim_, int kBlockM_, int kBlockN_>
struct FwdConfig {
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kBlockN = kBlockN_;
  static constexpr int kWarpGroups = kBlockM / 64, kThreads = kWarpGroups * 128;
  static constexpr float kRescaleThreshold = 8.f;  ///< log2 units, as the sm80 forward (FwdConfig::kRescaleSkip)
  /// O is accumulated in column chunks of at most 128 (one wgmma each).
  static constexpr int kOChunk = kHeadDim < 128 ? kHeadDim : 128, kOChunks = kHeadDim / kOChunk;
  static_assert(kBlockM % 64 == 0 && kBlockN % 64 == 0 && kHeadDim % 64 == 0, "whole panels and warpgroups");
  using TileQ = PanelTile<kBlockM, kHeadDim>;
  using TileKV = PanelTile<kBlockN, kHeadDim>;
  static constexpr int kSmemBytes = TileQ::kBytes + 4 * TileKV::kBytes + 1024;  // + base alignment
};

template <class Cfg, class T, bool kSoftcap>
__global__ void __launch_bounds__(Cfg::kThreads, 1) fwd_kernel(const FwdParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using sm80::exp2_approx;
  using sm80::pack2;
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kHeadDim = Cfg::kHeadDim;
  constexpr int kThreads = Cfg::kThreads, kOChunk = Cfg::kOChunk, kOChunks = Cfg::kOChunks;
  using TileQ = typename Cfg::TileQ;
  using TileKV = typename Cfg::TileKV;
  using MmaS = WgmmaTag<kBlockN, T>;
  using MmaO = WgmmaTag<kOChunk, T>;

  extern __shared__ __align__(1024) char smem_raw[];
  const uint32_t raw = sm80::smem_addr(smem_raw);
  const uint32_t sQ = (raw + 1023u) & ~1023u;
  char* smem = smem_raw + (sQ - raw);
  const int m_block = static_cast<int>(gridDim.x - 1 - blockIdx.x);  // heaviest (causal) blocks first
  const int h = blockIdx.y, b = blockIdx.z;
  const sm80::SeqInfo si = sm80::seq_info(p, b);
  const int m0 = m_block * kBlockM;
  if (m0 >= si.seqlen_q) return;
  const int rows_q = min(kBlockM, si.seqlen_q - m0);
  const int hk = h / (p.num_heads / p.num_heads_kv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wg = warp / 4;
  const int g = lane / 4, t = lane % 4;
  const int row0 = 64 * wg + 16 * (warp % 4);  // the warp's first row in the CTA's block

  const T* qg = static_cast<const T*>(p.q) + b * p.q_s.batch + (si.q_row0 + m0) * p.q_s.row + h * p.q_s.head;
  const T* kg = static_cast<const T*>(p.k) + b * p.k_s.batch + si.k_row0 * p.k_s.row + hk * p.k_s.head;
  const T* vg = static_cast<const T*>(p.v) + b * p.v_s.batch + si.k_row0 * p.v_s.row + hk * p.v_s.head;

  const core::MaskRule rule{si.seqlen_q, si.seqlen_k, p.window_left, p.window_right};
  int64_t key_first, key_last;
  rule.block_key_range(m0, m0 + rows_q, &key_first, &key_last);
  const int n_min = static_cast<int>(key_first / kBlockN);
  const int n_max = key_last > key_first ? static_cast<int>((key_last + kBlockN - 1) / kBlockN) : n_min;

  const uint32_t sK = sQ + TileQ::kBytes;  // stages: K0, K1, V0, V1
  const uint32_t sV = sK + 2 * TileKV::kBytes;
  const sm80::TileCopy<TileKV, kThreads> kv_copy(p.head_dim);
  auto load_kv = [&](int n, int stage) {
    const int r0 = n * kBlockN;
    kv_copy.copy(sK + stage * TileKV::kBytes, kg + r0 * p.k_s.row, p.k_s.row, si.seqlen_k - r0);
    kv_copy.copy(sV + stage * TileKV::kBytes, vg + r0 * p.v_s.row, p.v_s.row, si.seqlen_k - r0);
  };
  sm80::TileCopy<TileQ, kThreads>(p.head_dim).copy(sQ, qg, p.q_s.row, rows_q);
  if (n_max > n_min) load_kv(n_max - 1, 0);
  sm80::cp_async_commit();

  float o[kOChunks][kOChunk / 2];
#pragma unroll
  for (int c = 0; c < kOChunks; ++c)
#pragma unroll
    for (int i = 0; i < kOChunk / 2; ++i) o[c][i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
  const float scale_log2 = p.softmax_scale_log2;

  const uint64_t dQ = desc_kmajor(sQ + 64 * wg * 128);                   // A of S: the warpgroup's 64 rows
  const uint64_t dK = desc_kmajor(sK);                                    // B of S: K-major keys
  const uint64_t dV = desc_mnmajor(sV, TileKV::kPanelBytes);              // B of O: MN-major (head dim along rows)
  constexpr uint64_t kStage = TileKV::kBytes >> 4;

  auto step = [&](const int n, auto mask_tag) {
    constexpr bool kMask = decltype(mask_tag)::value;
    const int stage = (n_max - 1 - n) & 1;
    sm80::cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();  // K/V(n) landed; every warpgroup is done with the other stage
    if (n > n_min) load_kv(n - 1, stage ^ 1);
    sm80::cp_async_commit();

    // ---- S = Q K^T ---------------------------------------------------------------------------------------------
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

    // ---- softcap, mask (boundary tiles only), online softmax ---------------------------------------------------
    // Element s[j*4 + 2*hh + e]: row row0 + g + 8*hh, key n*kBlockN + 8*j + 2*t + e.
    if constexpr (kSoftcap) {
#pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i) s[i] = sm80::tanh_approx(s[i] * p.score_scale);
    }
    if constexpr (kMask) {
      const int n0 = n * kBlockN;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int i = m0 + row0 + g + 8 * hh;
        const int lo = static_cast<int>(rule.row_first(i)) - n0 - 2 * t;
        const int hi = static_cast<int>(rule.row_last(i)) - n0 - 2 * t;
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int jj = j * 8 + e;
            if (jj < lo || jj >= hi) s[j * 4 + 2 * hh + e] = -INFINITY;
          }
      }
    }
    float corr[2];
    bool any_rescale = false;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) mx = fmaxf(mx, fmaxf(s[j * 4 + 2 * hh], s[j * 4 + 2 * hh + 1]));
      mx = sm80::quad_max(mx);
      const float m_old = row_max[hh];
      const bool raise = (mx - m_old) * scale_log2 > Cfg::kRescaleThreshold;  // always true while m_old = -inf
      corr[hh] = 1.f;
      if (raise) {
        corr[hh] = exp2_approx((m_old - mx) * scale_log2);
        row_max[hh] = mx;
        row_sum[hh] *= corr[hh];
        any_rescale = true;
      }
      const float m_scaled = row_max[hh] == -INFINITY ? 0.f : row_max[hh] * scale_log2;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pv = exp2_approx(fmaf(s[j * 4 + 2 * hh + e], scale_log2, -m_scaled));
          s[j * 4 + 2 * hh + e] = pv;
          sum += pv;
        }
      row_sum[hh] += sum;
    }
    if (__any_sync(0xffffffffu, any_rescale)) {
#pragma unroll
      for (int c = 0; c < kOChunks; ++c)
#pragma unroll
        for (int i = 0; i < kOChunk / 2; ++i) o[c][i] *= corr[(i / 2) % 2];
    }

    // ---- O += P V, P from registers ---------------------------------------------------------------------------
#pragma unroll
    for (int c = 0; c < kOChunks; ++c) fence_operands(o[c]);  // the rescale above happens before the wgmmas read O
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
        wgmma_rs<1>(MmaO{}, o[c], a, dV + stage * kStage + vo + co, 1);
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int c = 0; c < kOChunks; ++c) fence_operands(o[c]);
  };

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

  // ---- epilogue: one division, lse, 16-byte stores through the warpgroup's own Q rows in shared memory -----------
  // The barrier matters when no K/V tile was visible: other threads' cp.async writes of Q may still be in flight.
  sm80::cp_async_wait<0>();
  __syncthreads();
  T* og = static_cast<T*>(p.out) + b * p.out_s.batch + (si.q_row0 + m0) * p.out_s.row + h * p.out_s.head;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const float l = sm80::quad_sum(row_sum[hh]);
    const float inv = (l > 0.f) ? 1.f / l : 0.f;
    const int r = row0 + g + 8 * hh;
#pragma unroll
    for (int c = 0; c < kOChunks; ++c)
#pragma unroll
      for (int j = 0; j < kOChunk / 8; ++j) {
        const uint32_t packed = pack2<T>(o[c][j * 4 + 2 * hh] * inv, o[c][j * 4 + 2 * hh + 1] * inv);
        *reinterpret_cast<uint32_t*>(smem + TileQ::offset_elem(r, c * kOChunk + j * 8 + 2 * t)) = packed;
      }
    if (p.lse != nullptr && t == 0 && m0 + r < si.seqlen_q) {
      const float m_scaled = row_max[hh] * scale_log2;
      const float lse = l > 0.f ? (m_scaled + log2f(l)) * 0.69314718055994531f : -INFINITY;
      const int64_t row = (p.cu_seqlens_q != nullptr ? si.q_row0 : 0) + m0 + r;
      p.lse[b * p.lse_batch + h * p.lse_head + row * p.lse_row] = lse;
    }
  }
  __syncwarp();
  constexpr int kChunks = TileQ::kChunks;
  for (int i = lane; i < 16 * kChunks; i += 32) {
    const int r = row0 + i / kChunks, c = i % kChunks;
    if (m0 + r < si.seqlen_q && c * 8 < p.head_dim) {
      const uint4 val = *reinterpret_cast<const uint4*>(smem + TileQ::offset(r, c));
      *reinterpret_cast<uint4*>(og + r * p.out_s.row + c * 8) = val;
    }
  }
#else
  __trap();  // built without sm_90a code: the launcher checks the binary before choosing this kernel
#endif
}

}  // namespace flashkv::cuda::sm90
