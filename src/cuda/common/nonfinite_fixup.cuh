// The after-the-fact rare path for non-finite inputs (docs/gpu.md, "Non-finite inputs"): a flag set by the main
// kernels and a fix-up kernel, launched always on the same stream after them, that returns at once while the flag is
// clear (one tiny launch; no host synchronization).
//
// Why: a masked P or dS is a select to 0, but the tensor-core GEMMs of a boundary tile (the causal diagonal, window
// edges, rows or keys past a sequence's end) still multiply that 0 with the other operand, and 0 * inf = NaN: a
// non-finite q, k, v or dout of a pair (i, j) that is masked leaks into dq_i, dk_j or dv_j (the backward), or into
// out_i (the sm80 forward of head dims 64 and 96, which carries no in-kernel rare path: FwdMainloop::
// kExactNonFiniteRows). A leak only ever creates non-finite values (NaN is sticky under the GEMMs' additions), so
// "every output element finite" proves that there was none. The epilogues therefore test the values they store (one
// compare per element, after the hot loops) and set the flag on a non-finite one; the dq conversion does the same for
// dq. When the flag is set, the fix-up scans the outputs (one warp per row) and recomputes every row that holds a
// non-finite element exactly from the definition over the visible pairs only (masked pairs are never read), so rows
// the bad value reaches get the NaN/inf the definition gives and the others their exact finite values:
//   forward (row i):   common/nonfinite.cuh, recompute_row_exact (out_i, lse_i)
//   backward:          P_ij = exp2(s_ij * scale_log2 - lse2_i), dP_ij = dO_i . V_j, D_i = rowsum(dO_i o O_i) (the
//                      preprocess's dsum), dS_ij = P_ij (dP_ij - D_i) (x (1 - tanh^2) with softcap),
//                      dq_i = scale sum_{j in J_i} dS_ij K_j (one warp per query row and head),
//                      dk_j = scale sum dS_ij Q_i and dv_j = sum P_ij dO_i over the rows i that see j, summed over the
//                      query heads of j's KV head (GQA) (one warp per key row and KV head).
// It is slow (scalar, two warp reductions per pair) and runs only when an output holds a non-finite value: a
// legitimate non-finite input (a NaN in q, say) makes the heads it reaches take it, which is the price of exactness.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "core/mask.hpp"
#include "cuda/check.hpp"
#include "cuda/common/block.cuh"
#include "cuda/common/nonfinite.cuh"
#include "cuda/common/seqlen.cuh"
#include "cuda/params.hpp"
#include "cuda/util.hpp"

namespace flashkv::cuda::attn {

/// NaN or +-inf (one compare with an absolute-value operand).
__device__ __forceinline__ bool not_finite(float x) { return !(fabsf(x) < INFINITY); }

/// Where packed row r (of q when kQuery, else of k) lies: batch entry b and row within the sequence; b = -1 for a
/// row past the last sequence of a varlen batch.
struct RowAt {
  int b, i;
};
template <bool kQuery>
__device__ __forceinline__ RowAt row_at(const FwdParams& p, int64_t r) {
  const int32_t* cu = kQuery ? p.cu_seqlens_q : p.cu_seqlens_k;
  if (cu == nullptr) {
    const int64_t len = kQuery ? p.seqlen_q : p.seqlen_k;
    return {static_cast<int>(r / len), static_cast<int>(r % len)};
  }
  if (r >= cu[p.batch]) return {-1, 0};
  int lo = 0, hi = p.batch - 1;  // the largest b with cu[b] <= r (empty sequences before it are skipped)
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu[mid] <= r) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return {lo, static_cast<int>(r - cu[lo])};
}

/// Element (b, row, head) of a [batch, rows, heads, head_dim] tensor (varlen: batch stride 0, row0 the sequence's
/// first packed row).
template <class T>
__device__ __forceinline__ T* row_ptr(const void* base, const TensorStrides& s, int b, int64_t row, int h) {
  return const_cast<T*>(static_cast<const T*>(base)) + b * s.batch + row * s.row + h * s.head;
}

/// True (warp-uniform) when row x (head_dim columns) holds a non-finite element.
template <class T, int kPer>
__device__ __forceinline__ bool row_not_finite(const T* x, int head_dim, int lane) {
  bool bad = false;
#pragma unroll
  for (int c = 0; c < kPer; ++c) {
    const int col = lane + 32 * c;
    if (col < head_dim) bad |= not_finite(static_cast<float>(x[col]));
  }
  return __any_sync(0xffffffffu, bad);
}

template <int kPer>
struct WarpRow {
  float v[kPer];
  template <class T>
  __device__ __forceinline__ void load(const T* x, int head_dim, int lane) {
#pragma unroll
    for (int c = 0; c < kPer; ++c) {
      const int col = lane + 32 * c;
      v[c] = col < head_dim ? static_cast<float>(x[col]) : 0.f;
    }
  }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int c = 0; c < kPer; ++c) v[c] = 0.f;
  }
  template <class T>
  __device__ __forceinline__ void store(T* x, int head_dim, int lane, float scale) const {
#pragma unroll
    for (int c = 0; c < kPer; ++c) {
      const int col = lane + 32 * c;
      if (col < head_dim) x[col] = static_cast<T>(v[c] * scale);
    }
  }
};

/// The two dot products of one visible pair: s = q_i . k_j and dP = dO_i . v_j (warp-wide), then P and dS as the
/// backward kernels define them (bwd_p_ds), in accurate float32.
template <int kPer>
__device__ __forceinline__ void pair_p_ds(const BwdParams& p, const WarpRow<kPer>& q, const WarpRow<kPer>& dout,
                                          const WarpRow<kPer>& k, const WarpRow<kPer>& v, float lse2, float dsum,
                                          float& P, float& dS) {
  float s = 0.f, dp = 0.f;
#pragma unroll
  for (int c = 0; c < kPer; ++c) {
    s = fmaf(q.v[c], k.v[c], s);
    dp = fmaf(dout.v[c], v.v[c], dp);
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    s += __shfl_xor_sync(0xffffffffu, s, off);
    dp += __shfl_xor_sync(0xffffffffu, dp, off);
  }
  const float sv = p.softcap ? tanhf(s * p.score_scale) : s;
  P = exp2f(fmaf(sv, p.softmax_scale_log2, -lse2));
  dS = P * (dp - dsum);
  if (p.softcap) dS *= 1.f - sv * sv;
}

/// dq of packed query row r, head h: recomputed when it holds a non-finite element.
template <class T, int kHeadDim>
__device__ void fix_dq_row(const BwdParams& p, int64_t r, int h, int lane) {
  constexpr int kPer = (kHeadDim + 31) / 32;
  const RowAt at = row_at<true>(p, r);
  if (at.b < 0) return;
  const SeqInfo si = seq_info(p, at.b);
  T* dq = row_ptr<T>(p.dq, p.dq_s, at.b, si.q_row0 + at.i, h);
  if (!row_not_finite<T, kPer>(dq, p.head_dim, lane)) return;
  const core::MaskRule rule{si.seqlen_q, si.seqlen_k, p.window_left, p.window_right};
  const int hk = h / (p.num_heads / p.num_heads_kv);
  WarpRow<kPer> q, dout, k, v, acc;
  q.load(row_ptr<const T>(p.q, p.q_s, at.b, si.q_row0 + at.i, h), p.head_dim, lane);
  dout.load(row_ptr<const T>(p.dout, p.dout_s, at.b, si.q_row0 + at.i, h), p.head_dim, lane);
  acc.zero();
  const int64_t ws = static_cast<int64_t>(h) * p.total_q + global_row(p, si, at.b, at.i);
  const float lse2 = p.lse_log2[ws], dsum = p.dsum[ws];
  for (int64_t j = rule.row_first(at.i); j < rule.row_last(at.i); ++j) {
    k.load(row_ptr<const T>(p.k, p.k_s, at.b, si.k_row0 + j, hk), p.head_dim, lane);
    v.load(row_ptr<const T>(p.v, p.v_s, at.b, si.k_row0 + j, hk), p.head_dim, lane);
    float P, dS;
    pair_p_ds(p, q, dout, k, v, lse2, dsum, P, dS);
#pragma unroll
    for (int c = 0; c < kPer; ++c) acc.v[c] = fmaf(dS, k.v[c], acc.v[c]);
  }
  acc.store(dq, p.head_dim, lane, p.softmax_scale);
}

/// dk and dv of packed key row r, KV head hk: recomputed (both) when either holds a non-finite element.
template <class T, int kHeadDim>
__device__ void fix_dkdv_row(const BwdParams& p, int64_t r, int hk, int lane) {
  constexpr int kPer = (kHeadDim + 31) / 32;
  const RowAt at = row_at<false>(p, r);
  if (at.b < 0) return;
  const SeqInfo si = seq_info(p, at.b);
  T* dk = row_ptr<T>(p.dk, p.dk_s, at.b, si.k_row0 + at.i, hk);
  T* dv = row_ptr<T>(p.dv, p.dv_s, at.b, si.k_row0 + at.i, hk);
  const bool bad_k = row_not_finite<T, kPer>(dk, p.head_dim, lane);
  if (!bad_k && !row_not_finite<T, kPer>(dv, p.head_dim, lane)) return;
  const core::MaskRule rule{si.seqlen_q, si.seqlen_k, p.window_left, p.window_right};
  const int j = at.i, group = p.num_heads / p.num_heads_kv;
  WarpRow<kPer> k, v, q, dout, acc_k, acc_v;
  k.load(row_ptr<const T>(p.k, p.k_s, at.b, si.k_row0 + j, hk), p.head_dim, lane);
  v.load(row_ptr<const T>(p.v, p.v_s, at.b, si.k_row0 + j, hk), p.head_dim, lane);
  acc_k.zero();
  acc_v.zero();
  int64_t i0, i1;  // the rows that see key j (contiguous)
  rule.block_query_range(j, j + 1, &i0, &i1);
  for (int h = hk * group; h < (hk + 1) * group; ++h) {
    const int64_t ws = static_cast<int64_t>(h) * p.total_q + global_row(p, si, at.b, 0);
    for (int64_t i = i0; i < i1; ++i) {
      if (!rule.visible(i, j)) continue;
      q.load(row_ptr<const T>(p.q, p.q_s, at.b, si.q_row0 + i, h), p.head_dim, lane);
      dout.load(row_ptr<const T>(p.dout, p.dout_s, at.b, si.q_row0 + i, h), p.head_dim, lane);
      float P, dS;
      pair_p_ds(p, q, dout, k, v, p.lse_log2[ws + i], p.dsum[ws + i], P, dS);
#pragma unroll
      for (int c = 0; c < kPer; ++c) {
        acc_v.v[c] = fmaf(P, dout.v[c], acc_v.v[c]);
        acc_k.v[c] = fmaf(dS, q.v[c], acc_k.v[c]);
      }
    }
  }
  acc_k.store(dk, p.head_dim, lane, p.softmax_scale);
  acc_v.store(dv, p.head_dim, lane, 1.f);
}

constexpr int kFixupThreads = 256;

/// First statement of a fix-up kernel: with programmatic dependent launch (launch_fixup) the kernel may start before
/// the one before it has finished; griddepcontrol.wait returns once that kernel has completed and its memory is
/// visible. Without the launch attribute (or below sm_90) it returns at once.
__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/// Backward fix-up: one warp per dq row (packed row, head), then per dk/dv row (packed key row, KV head), grid-stride.
/// Runs after the dq conversion and the GQA reduction; the workspaces (lse_log2, dsum) are still alive.
template <class T, int kHeadDim>
__global__ void __launch_bounds__(kFixupThreads) bwd_nonfinite_fixup_kernel(const BwdParams p) {
  wait_for_previous_kernel();
  if (*p.nonfinite_flag == 0) return;
  const int lane = threadIdx.x % 32;
  const int64_t nq = p.total_q * p.num_heads, nk = p.total_k * p.num_heads_kv;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kFixupThreads / 32);
  for (int64_t item = blockIdx.x * static_cast<int64_t>(kFixupThreads / 32) + threadIdx.x / 32; item < nq + nk;
       item += warps) {
    if (item < nq) {
      fix_dq_row<T, kHeadDim>(p, item / p.num_heads, static_cast<int>(item % p.num_heads), lane);
    } else {
      const int64_t kr = item - nq;
      fix_dkdv_row<T, kHeadDim>(p, kr / p.num_heads_kv, static_cast<int>(kr % p.num_heads_kv), lane);
    }
  }
}

/// Forward fix-up (kernels without the in-kernel rare path): one warp per out row (packed row, head), grid-stride;
/// a row that holds a non-finite element is recomputed exactly (out and lse).
template <class T, int kHeadDim>
__global__ void __launch_bounds__(kFixupThreads) fwd_nonfinite_fixup_kernel(const FwdParams p) {
  wait_for_previous_kernel();
  if (*p.nonfinite_epoch < p.nonfinite_gen) return;
  constexpr int kPer = (kHeadDim + 31) / 32;
  const int lane = threadIdx.x % 32;
  const int64_t n = p.total_q * p.num_heads;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kFixupThreads / 32);
  for (int64_t item = blockIdx.x * static_cast<int64_t>(kFixupThreads / 32) + threadIdx.x / 32; item < n;
       item += warps) {
    const RowAt at = row_at<true>(p, item / p.num_heads);
    if (at.b < 0) continue;
    FwdBlock blk = FwdBlock::make<1>(p, TileCoord{at.i, static_cast<int>(item % p.num_heads), at.b});
    blk.set_key_range<1, 1>(p);
    if (row_not_finite<T, kPer>(blk.out<T>(p), p.head_dim, lane)) recompute_row_exact<T, kHeadDim>(p, blk, 0, lane);
  }
}

/// Grid of a fix-up launch over `items` warps of work: at most one block per SM (each returns at once while the flag
/// is clear, so on the common path the launch costs its scheduling only; the rare path strides over the rows).
inline unsigned fixup_blocks(int64_t items) {
  const int64_t need = (items + kFixupThreads / 32 - 1) / (kFixupThreads / 32);
  const int64_t cap = static_cast<int64_t>(num_sms());
  return static_cast<unsigned>(need < cap ? (need > 0 ? need : 1) : cap);
}

/// Launches a fix-up kernel (kFixupThreads threads per block) on `stream`, with programmatic dependent launch where
/// the device and stream allow it (util.hpp dependent_launch_ok): its launch then overlaps the previous kernel's tail.
template <class P>
void launch_fixup(void (*kernel)(P), unsigned blocks, const P& p, cudaStream_t stream, const char* what) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(kFixupThreads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = dependent_launch_ok(stream) ? 1 : 0;
  check_cuda(cudaLaunchKernelEx(&cfg, kernel, p), what);
}

}  // namespace flashkv::cuda::attn
