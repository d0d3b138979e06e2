// Pieces shared by the sm80 (mma.sync) and sm90 (wgmma) backward mainloops, which differ only in how they compute their
// GEMMs (FA2 Alg. 2, Dao 2023 §3.1.2): the shared-memory layout and the loads of a key block and of a query block
// (Q, dO, lse, D), the elementwise P^T / dS^T of phase 1 (mask, softcap), the per-warp dQ partial -> float32 dq_accum
// (atomic reductions or the deterministic turn order) and the dK/dV epilogue. Fragments are common/frag.cuh views.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/mask.hpp"
#include "cuda/params.hpp"
#include "cuda/common/block.cuh"
#include "cuda/common/frag.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/seqlen.cuh"
#include "cuda/common/tile.cuh"

namespace flashkv::cuda::attn {

/// Thread i < kBlockM loads lse*log2(e) and D of query row m0 + i into sLse[i] / sD[i] (cp.async); rows past
/// seqlen_q (i >= rows) get lse = +inf (P = 0) and D = 0.
template <int kBlockM>
__device__ __forceinline__ void load_lse_dsum(float* sLse, float* sD, const float* lse2g, const float* dsumg, int m0,
                                              int rows) {
  if (const int i = static_cast<int>(threadIdx.x); i < kBlockM) {
    if (i < rows) {
      cp_async_4(smem_addr(sLse + i), lse2g + m0 + i);
      cp_async_4(smem_addr(sD + i), dsumg + m0 + i);
    } else {
      sLse[i] = INFINITY;
      sD[i] = 0.f;
    }
  }
}

/// One of the two: thread i < kBlockM loads row value m0 + i of `g` (lse*log2(e) or D) into s[i] (cp.async); rows
/// past seqlen_q (i >= rows) get `fill` (lse: +inf, so P = 0; D: 0).
template <int kBlockM>
__device__ __forceinline__ void load_row_values(float* s, const float* g, int m0, int rows, float fill) {
  if (const int i = static_cast<int>(threadIdx.x); i < kBlockM) {
    if (i < rows) {
      cp_async_4(smem_addr(s + i), g + m0 + i);
    } else {
      s[i] = fill;
    }
  }
}

/// Deterministic mode: waits (CTA-wide) until the K/V blocks before this one that see query block m have added their
/// dQ, and returns the block's counter for bwd_dq_turn_done.
template <int kBlockM, int kBlockN>
__device__ __forceinline__ int* bwd_dq_turn_wait(const BwdParams& p, const core::MaskRule& rule, const SeqInfo& si,
                                                 int b, int h, int m, int n_block) {
  const int m0 = m * kBlockM;
  int64_t k_first, k_last;
  rule.block_key_range(m0, min(m0 + kBlockM, si.seqlen_q), &k_first, &k_last);
  const int turn = n_block - static_cast<int>(k_first / kBlockN);
  int* sem = p.dq_semaphore + (static_cast<int64_t>(b) * p.num_heads + h) * p.num_m_blocks + m;
  if (threadIdx.x == 0) {
    while (ld_acquire(sem) != turn) {
    }
  }
  __syncthreads();
  return sem;
}
__device__ __forceinline__ void bwd_dq_turn_done(int* sem) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(sem, 1);
}

/// Adds one thread's dQ fragment to dq_accum: kRowTiles 16-row tiles x kColTiles 8-column tiles, element
/// val(a, j, hh, e) at row il0 + 16a + 8hh (block-relative; the query is m0 + that) and column col0 + 8j + e.
/// dq_thread points at (il0, col0). full_block: every row and column exists (no tests).
template <int kRowTiles, int kColTiles, class Val>
__device__ __forceinline__ void bwd_add_dq(const BwdParams& p, float* dq_thread, int64_t dq_row_stride, int il0, int m0,
                                           int seqlen_q, int col0, bool full_block, Val val) {
  if (!p.deterministic && full_block) {
#pragma unroll
    for (int a = 0; a < kRowTiles; ++a)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float* row = dq_thread + (a * 16 + 8 * hh) * dq_row_stride;
#pragma unroll
        for (int j = 0; j < kColTiles; ++j) red_add_f32x2(row + j * 8, val(a, j, hh, 0), val(a, j, hh, 1));
      }
    return;
  }
#pragma unroll
  for (int a = 0; a < kRowTiles; ++a)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      if (m0 + il0 + a * 16 + 8 * hh >= seqlen_q) continue;
      float* row = dq_thread + (a * 16 + 8 * hh) * dq_row_stride;
#pragma unroll
      for (int j = 0; j < kColTiles; ++j) {
        if (col0 + j * 8 >= p.head_dim) continue;
        float* dst = row + j * 8;
        if (p.deterministic) {
          float2 cur = __ldcg(reinterpret_cast<const float2*>(dst));
          cur.x += val(a, j, hh, 0);
          cur.y += val(a, j, hh, 1);
          __stcg(reinterpret_cast<float2*>(dst), cur);
        } else {
          red_add_f32x2(dst, val(a, j, hh, 0), val(a, j, hh, 1));
        }
      }
    }
}

/// Shared memory of a backward CTA: Q and dO of two query blocks (double buffer), the key block's K and V, P^T and
/// dS^T (16-bit) and lse*log2(e) / D of two query blocks. `kAlign` extra bytes for a base that must be realigned.
template <class TileQ, class TileK, class TileP, int kBlockM, int kAlign = 0>
struct BwdSmem {
  static constexpr int kQ = 0, kdO = 2 * TileQ::kBytes, kK = 4 * TileQ::kBytes, kV = kK + TileK::kBytes;
  static constexpr int kP = kV + TileK::kBytes, kdS = kP + TileP::kBytes, kLse = kdS + TileP::kBytes;
  static constexpr int kD = kLse + 2 * kBlockM * 4;
  static constexpr int kBytes = kD + 2 * kBlockM * 4 + kAlign;
};

/// Addresses of a BwdSmem layout at a (suitably aligned) shared-memory base.
template <class Smem>
struct BwdSmemView {
  uint32_t q, dO, k, v, p, ds;  ///< shared-state-space addresses
  float* lse;
  float* d;
  __device__ __forceinline__ explicit BwdSmemView(char* smem)
      : q(smem_addr(smem)), dO(q + Smem::kdO), k(q + Smem::kK), v(q + Smem::kV), p(q + Smem::kP), ds(q + Smem::kdS),
        lse(reinterpret_cast<float*>(smem + Smem::kLse)), d(reinterpret_cast<float*>(smem + Smem::kD)) {}
};

/// The backward CTA's global operands and loads: K and V of the key block once, then per query block Q, dO, lse and D
/// into buffer `buf` (TileCopy plans, cp.async).
template <class T, class TileQ, class TileK, int kBlockM, int kThreads>
struct BwdLoads {
  const T* q;
  const T* dout;
  const T* k;
  const T* v;
  int64_t row_base;  ///< packed row of query 0 of this sequence
  const float* lse2;
  const float* dsum;
  TileCopy<TileQ, kThreads> q_copy;

  __device__ __forceinline__ BwdLoads(const BwdParams& p, const BwdBlock& blk)
      : q(static_cast<const T*>(p.q) + blk.b * p.q_s.batch + blk.si.q_row0 * p.q_s.row + blk.h * p.q_s.head),
        dout(static_cast<const T*>(p.dout) + blk.b * p.dout_s.batch + blk.si.q_row0 * p.dout_s.row +
             blk.h * p.dout_s.head),
        k(static_cast<const T*>(p.k) + blk.b * p.k_s.batch + (blk.si.k_row0 + blk.n0) * p.k_s.row +
          blk.hk * p.k_s.head),
        v(static_cast<const T*>(p.v) + blk.b * p.v_s.batch + (blk.si.k_row0 + blk.n0) * p.v_s.row +
          blk.hk * p.v_s.head),
        row_base(global_row(p, blk.si, blk.b, 0)),
        lse2(p.lse_log2 + static_cast<int64_t>(blk.h) * p.total_q + row_base),
        dsum(p.dsum + static_cast<int64_t>(blk.h) * p.total_q + row_base),
        q_copy(p.head_dim) {}

  __device__ __forceinline__ void load_kv(const BwdParams& p, const BwdBlock& blk, uint32_t sK, uint32_t sV) const {
    const TileCopy<TileK, kThreads> k_copy(p.head_dim);
    k_copy.copy(sK, k, p.k_s.row, blk.rows_k);
    k_copy.copy(sV, v, p.v_s.row, blk.rows_k);
  }
  /// The key block's K and V and the first query block (one cp.async group); dK = dV = 0.
  template <class View, class F>
  __device__ __forceinline__ void prologue(const BwdParams& p, const BwdBlock& blk, const View& sm, F dk, F dv) const {
    load_kv(p, blk, sm.k, sm.v);
    if (blk.m_max > blk.m_min) load_q_block(p, blk, blk.m_min, 0, sm.q, sm.dO, sm.lse, sm.d);
    cp_async_commit();
    zero(dk);
    zero(dv);
  }
  /// Query block m's Q and lse*log2(e) into buffer `buf` (no commit).
  __device__ __forceinline__ void load_q_part(const BwdParams& p, const BwdBlock& blk, int m, int buf, uint32_t sQ,
                                              float* sLse) const {
    const int m0 = m * kBlockM;
    const int rows = blk.si.seqlen_q - m0;
    q_copy.copy(sQ + buf * TileQ::kBytes, q + m0 * p.q_s.row, p.q_s.row, rows);
    static_assert(kThreads >= kBlockM, "one thread per query row loads lse and D");
    load_row_values<kBlockM>(sLse + buf * kBlockM, lse2, m0, rows, INFINITY);
  }
  /// Query block m's dO and D into buffer `buf` (no commit).
  __device__ __forceinline__ void load_do_part(const BwdParams& p, const BwdBlock& blk, int m, int buf, uint32_t sdO,
                                               float* sD) const {
    const int m0 = m * kBlockM;
    const int rows = blk.si.seqlen_q - m0;
    q_copy.copy(sdO + buf * TileQ::kBytes, dout + m0 * p.dout_s.row, p.dout_s.row, rows);
    load_row_values<kBlockM>(sD + buf * kBlockM, dsum, m0, rows, 0.f);
  }
  /// Query block m's Q, dO, lse and D into buffer `buf` (no commit). Not written as load_q_part + load_do_part: this
  /// order (Q, dO, then lse and D under one test) is the one the sm90 backward and the prologue were measured with;
  /// the split order compiles to different code (SASS of the sm80 hd128 loop: +13 instructions).
  __device__ __forceinline__ void load_q_block(const BwdParams& p, const BwdBlock& blk, int m, int buf, uint32_t sQ,
                                               uint32_t sdO, float* sLse, float* sD) const {
    const int m0 = m * kBlockM;
    const int rows = blk.si.seqlen_q - m0;
    q_copy.copy(sQ + buf * TileQ::kBytes, q + m0 * p.q_s.row, p.q_s.row, rows);
    q_copy.copy(sdO + buf * TileQ::kBytes, dout + m0 * p.dout_s.row, p.dout_s.row, rows);
    static_assert(kThreads >= kBlockM, "one thread per query row loads lse and D");
    load_lse_dsum<kBlockM>(sLse + buf * kBlockM, sD + buf * kBlockM, lse2, dsum, m0, rows);
  }
};

/// Phase 1 elementwise: from S^T and dP^T fragments (key rows x query columns: element (a, nt, hh, e) is key row
/// key_row0 + 16a + 8hh + g, query column q_col0 + 8nt + 2t + e of the block) to P^T = exp2(S * scale_log2 - lse2)
/// and dS^T = P^T (dP^T - D) (x (1 - tanh^2) with softcap), handed to store(a, nt, hh, key_row, q_col, packed P^T,
/// packed dS^T). kMask: boundary tile; a masked entry is a select to 0 for both P and dS, never arithmetic on it.
template <class T, bool kSoftcap, bool kMask, int kRT, int kCT, class Store>
__device__ __forceinline__ void bwd_p_ds(Frag<kRT, kCT> s, Frag<kRT, kCT> dp, const float* lse_s, const float* d_s,
                                         int key_row0, int q_col0, int m0, const BwdBlock& blk, float score_scale,
                                         float scale_log2, int g, int t, Store&& store) {
#pragma unroll
  for (int nt = 0; nt < kCT; ++nt) {
    // This thread's two query columns of the 8-column tile: lse*log2(e) and D, loaded once for all key rows.
    const int il0 = q_col0 + nt * 8 + 2 * t;
    const float2 lse2 = *reinterpret_cast<const float2*>(lse_s + il0);
    const float2 d2 = *reinterpret_cast<const float2*>(d_s + il0);
#pragma unroll
    for (int a = 0; a < kRT; ++a)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int jl = key_row0 + a * 16 + g + 8 * hh;  // key row within the block
        float pv[2], dsv[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float sv = s(a, nt, hh, e);
          if constexpr (kSoftcap) sv = tanh_approx(sv * score_scale);
          float pe = exp2_approx(fmaf(sv, scale_log2, -(e ? lse2.y : lse2.x)));
          bool masked = false;
          if constexpr (kMask) {
            const int i = m0 + il0 + e, j = blk.n0 + jl;
            masked = i >= blk.si.seqlen_q || j >= blk.si.seqlen_k || !blk.rule.visible(i, j);
            if (masked) pe = 0.f;
          }
          float de = pe * (dp(a, nt, hh, e) - (e ? d2.y : d2.x));
          if constexpr (kSoftcap) de *= (1.f - sv * sv);
          if constexpr (kMask) {
            if (masked) de = 0.f;  // 0 * (dP - D) would be NaN for a non-finite V or dO of a masked entry
          }
          pv[e] = pe;
          dsv[e] = de;
        }
        store(a, nt, hh, jl, il0, pack2<T>(pv[0], pv[1]), pack2<T>(dsv[0], dsv[1]));
      }
  }
}

/// Epilogue: dK (scaled by softmax_scale) and dV of this thread, fragments (a, dt, hh, e) at key row
/// key_row0 + 16a + 8hh + g and column col0 + 8dt + 2t + e of the block; rows past rows_k and columns past head_dim
/// are not stored. In the output dtype when every query head has its own K/V head, else in float32 per query head
/// (dk_accum / dv_accum) for the GQA reduction. Addresses: one 64-bit row offset per (a, hh), constant column offsets;
/// no per-element tests when the thread's rows and columns all exist. A non-finite value stored (a boundary tile's
/// masked 0 x inf leaks only as one; or a legitimate one) sets the fix-up's flag (common/nonfinite_fixup.cuh): one
/// FSETP per stored element.
template <class T, int kRT, int kCT>
__device__ __forceinline__ void bwd_store_dkdv_frags(const BwdParams& p, const BwdBlock& blk, Frag<kRT, kCT> dk,
                                                     Frag<kRT, kCT> dv, int key_row0, int col0, int g, int t) {
  const float scale = p.softmax_scale;
  const int c0 = col0 + 2 * t;
  const bool all_rows = key_row0 + 16 * kRT <= blk.rows_k;
  const bool all_cols = col0 + 8 * kCT <= p.head_dim;
  bool bad = false;
  // pass(store_pair, row_ptrs): row_ptrs(jl) -> the row's addresses at column c0; store_pair(rows, column offset,
  // dk pair, dv pair).
  auto pass = [&](auto store_pair, auto row_ptrs) {
#pragma unroll
    for (int a = 0; a < kRT; ++a)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int jl = key_row0 + a * 16 + g + 8 * hh;
        if (!all_rows && jl >= blk.rows_k) continue;
        const auto rows = row_ptrs(jl);
#pragma unroll
        for (int dt = 0; dt < kCT; ++dt) {
          if (!all_cols && c0 + dt * 8 >= p.head_dim) continue;
          const float k0 = dk(a, dt, hh, 0) * scale, k1 = dk(a, dt, hh, 1) * scale;
          const float v0 = dv(a, dt, hh, 0), v1 = dv(a, dt, hh, 1);
          bad |= !(fabsf(k0) < INFINITY) || !(fabsf(k1) < INFINITY) || !(fabsf(v0) < INFINITY) ||
                 !(fabsf(v1) < INFINITY);
          store_pair(rows, dt * 8, k0, k1, v0, v1);
        }
      }
  };
  const int64_t krow0 = blk.si.k_row0 + blk.n0;  // first key row of the block in the (packed) k tensor
  if (p.num_heads == p.num_heads_kv) {
    T* dk0 = static_cast<T*>(p.dk) + blk.b * p.dk_s.batch + krow0 * p.dk_s.row + blk.hk * p.dk_s.head + c0;
    T* dv0 = static_cast<T*>(p.dv) + blk.b * p.dv_s.batch + krow0 * p.dv_s.row + blk.hk * p.dv_s.head + c0;
    struct Rows {
      T* k;
      T* v;
    };
    pass([&](Rows rows, int off, float k0, float k1, float v0, float v1) {
           *reinterpret_cast<uint32_t*>(rows.k + off) = pack2<T>(k0, k1);
           *reinterpret_cast<uint32_t*>(rows.v + off) = pack2<T>(v0, v1);
         },
         [&](int jl) { return Rows{dk0 + jl * p.dk_s.row, dv0 + jl * p.dv_s.row}; });
  } else {
    const int64_t stride = static_cast<int64_t>(p.num_heads) * p.head_dim_rounded;  // per key row
    const int64_t off0 = (global_row_k(p, blk.si, blk.b, blk.n0) * p.num_heads + blk.h) * p.head_dim_rounded + c0;
    pass([&](int64_t row, int off, float k0, float k1, float v0, float v1) {
           *reinterpret_cast<float2*>(p.dk_accum + row + off) = make_float2(k0, k1);
           *reinterpret_cast<float2*>(p.dv_accum + row + off) = make_float2(v0, v1);
         },
         [&](int jl) { return off0 + jl * stride; });
  }
  if (bad && p.nonfinite_flag != nullptr) *p.nonfinite_flag = 1;
}

}  // namespace flashkv::cuda::attn
