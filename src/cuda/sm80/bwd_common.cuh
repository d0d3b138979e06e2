// Pieces shared by the sm80 (mma.sync) and sm90 (wgmma) backward main kernels, which differ only in how they compute
// their GEMMs: the lse/D loads of a query block, the per-warp dQ partial -> float32 dq_accum (atomic reductions or the
// deterministic turn order), the dK/dV stores, and the boundary-block test (FA2 Alg. 2, Dao 2023 §3.1.2).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/mask.hpp"
#include "cuda/params.hpp"
#include "cuda/sm80/common.cuh"
#include "cuda/sm80/ptx.cuh"

namespace flashkv::cuda::sm80 {

__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

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

/// True when the (query block m, key block at n0) tile needs element masks: it crosses seqlen_q/seqlen_k or the
/// causal/window boundary. The fully visible blocks in between carry no mask code.
template <int kBlockM, int kBlockN>
__device__ __forceinline__ bool bwd_needs_mask(const core::MaskRule& rule, const SeqInfo& si, int m, int n0) {
  const int m0 = m * kBlockM;
  return n0 + kBlockN > si.seqlen_k || m0 + kBlockM > si.seqlen_q ||
         !rule.tile_fully_visible(m0, m0 + kBlockM, n0, n0 + kBlockN);
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

/// Stores dK (already scaled) and dV for key row jl (block-relative, < rows) and columns c, c + 1 (c < head_dim): in the
/// output dtype when every query head has its own K/V head, else in float32 per query head for the GQA reduction.
template <class T>
__device__ __forceinline__ void bwd_store_dkdv(const BwdParams& p, const SeqInfo& si, int b, int h, int hk, int n0,
                                               int jl, int c, float k0, float k1, float v0, float v1) {
  if (p.num_heads == p.num_heads_kv) {
    T* dkg = static_cast<T*>(p.dk) + b * p.dk_s.batch + (si.k_row0 + n0 + jl) * p.dk_s.row + hk * p.dk_s.head;
    T* dvg = static_cast<T*>(p.dv) + b * p.dv_s.batch + (si.k_row0 + n0 + jl) * p.dv_s.row + hk * p.dv_s.head;
    *reinterpret_cast<uint32_t*>(dkg + c) = pack2<T>(k0, k1);
    *reinterpret_cast<uint32_t*>(dvg + c) = pack2<T>(v0, v1);
  } else {
    const int64_t off = (global_row_k(p, si, b, n0 + jl) * p.num_heads + h) * p.head_dim_rounded + c;
    *reinterpret_cast<float2*>(p.dk_accum + off) = make_float2(k0, k1);
    *reinterpret_cast<float2*>(p.dv_accum + off) = make_float2(v0, v1);
  }
}

}  // namespace flashkv::cuda::sm80
