// The split-KV decode's sequence view and its combine (flash-decoding: Dao, Haziza, Massa, Sizov, "Flash-Decoding for
// long-context inference", 2023; the FlashAttention-3 code's split-KV combine, notes §4.5), arch-neutral: the merge of
// the num_splits normalized partials (o_s, lse_s) of a query row is core/merge.hpp's (m = lse_s, l = 1, acc = o_s)
// instance, done either
//   - by decode_combine_kernel, a separate launch after the split kernel (one warp per (batch, head, query row)),
//     with programmatic dependent launch where the device and stream allow it (DecodeParams::combine_pdl), or
//   - inside the split kernel (DecodeParams::split_counters): every split CTA of a (batch, kv head, 16-row tile)
//     counts its arrival after writing its partial; the last to arrive merges the tile's rows (combine_tile) with all
//     of its threads, so that the merge overlaps other tiles' splits and costs no launch.
// Both give the same values up to the order of the float32 sums (each is exact to float32 rounding).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/mask.hpp"
#include "core/merge.hpp"
#include "cuda/common/ptx.cuh"
#include "cuda/decode_params.hpp"

namespace flashkv::cuda {

/// Queries and keys of sequence b (varlen or fixed queries; key count checked against the precondition).
struct DecodeSeq {
  int64_t q_row0;
  int seqlen_q;
  int seqlen_k;
  bool broken;  ///< seqlens[b] breaks the host's precondition: NaN out / lse, nothing appended
};
__device__ __forceinline__ DecodeSeq decode_seq(const DecodeParams& p, int b) {
  DecodeSeq s;
  if (p.cu_seqlens_q != nullptr) {
    s.q_row0 = p.cu_seqlens_q[b];
    s.seqlen_q = static_cast<int>(p.cu_seqlens_q[b + 1] - s.q_row0);
  } else {
    s.q_row0 = 0;
    s.seqlen_q = p.seqlen_q;
  }
  const int64_t cached = p.seqlens[b];
  const int64_t n = cached + p.seqlen_add;
  s.broken = cached < 0 || (p.promised_max > 0 && cached > p.promised_max) || n > p.capacity;
  s.seqlen_k = s.broken ? 0 : static_cast<int>(n);
  return s;
}
__device__ __forceinline__ core::MaskRule decode_rule(const DecodeParams& p, const DecodeSeq& s) {
  return core::MaskRule{s.seqlen_q, s.seqlen_k, p.window_left, p.causal ? 0 : -1};
}

/// First statement of a kernel launched with programmatic dependent launch: returns once the kernel before it on the
/// stream has completed and its memory is visible (at once without the launch attribute, or below sm_90).
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
/// Lets the dependent kernel (launched with programmatic dependent launch) be scheduled before this one finishes.
__device__ __forceinline__ void grid_dependency_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// Row of query row r of a tile (PackGQA: packed row row0 + r is query qi = pr / group of head hk·group + pr % group)
/// in the [batch, num_heads, seqlen_q] order of o_accum / lse_accum within one split.
struct TileRow {
  int qi, h;
  int64_t row;
};
__device__ __forceinline__ TileRow tile_row(const DecodeParams& p, int b, int hk, int row0, int r, int group) {
  const int pr = row0 + r, qi = pr / group, h = hk * group + pr % group;
  return {qi, h, (static_cast<int64_t>(b) * p.num_heads + h) * p.seqlen_q + qi};
}

/// The merge of one tile's `rows` query rows over the p.num_splits partials, by the CTA's kThreads threads (the last
/// split CTA of the tile to arrive; the partials are read from L2, ld.global.cg: other SMs wrote them). sW: shared
/// memory of num_splits · 16 + 32 floats (decode_params.hpp, fused_combine_fits).
template <int kHeadDim, class T, int kThreads>
__device__ __forceinline__ void combine_tile(const DecodeParams& p, const DecodeSeq& sq, const core::MaskRule& rule,
                                             int b, int hk, int row0, int rows, int group, float* sW) {
  const int S = p.num_splits;
  const int64_t nrows = static_cast<int64_t>(p.batch) * p.num_heads * p.seqlen_q;
  float* sM = sW + S * 16;  // [16] global max per row
  float* sL = sM + 16;      // [16] merged sum per row
  for (int i = threadIdx.x; i < S * 16; i += kThreads) {
    const int s = i / 16, r = i % 16;
    sW[i] = r < rows ? __ldcg(p.lse_accum + s * nrows + tile_row(p, b, hk, row0, r, group).row) : -INFINITY;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < rows; r += kThreads / 32) {  // per row: M = max_s lse_s, w_s = exp(lse_s - M), L = sum w_s
    float M = -INFINITY;
    for (int s = lane; s < S; s += 32) M = core::merge_max(M, sW[s * 16 + r]);
#pragma unroll
    for (int o = 16; o > 0; o /= 2) M = core::merge_max(M, __shfl_xor_sync(0xffffffffu, M, o));
    float L = 0.f;
    for (int s = lane; s < S; s += 32) {
      const float w = core::merge_weight(sW[s * 16 + r], M);
      sW[s * 16 + r] = w;
      L = core::merge_accumulate(L, w, 1.f);
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) L += __shfl_xor_sync(0xffffffffu, L, o);
    if (lane == 0) sM[r] = M, sL[r] = L;
  }
  __syncthreads();
  constexpr int kQuads = kHeadDim / 4;
  for (int i = threadIdx.x; i < rows * kQuads; i += kThreads) {
    const int r = i / kQuads, c = (i % kQuads) * 4;
    if (c >= p.head_dim) continue;
    const TileRow tr = tile_row(p, b, hk, row0, r, group);
    float a[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
    for (int s = 0; s < S; ++s) {
      const float w = sW[s * 16 + r];
      if (w == 0.f) continue;  // an empty split's values are never multiplied (core::merge_accumulate)
      const float4 v = __ldcg(reinterpret_cast<const float4*>(p.o_accum + (s * nrows + tr.row) * kHeadDim + c));
      a[0] += w * v.x, a[1] += w * v.y, a[2] += w * v.z, a[3] += w * v.w;
    }
    const bool has_keys = rule.row_last(tr.qi) > rule.row_first(tr.qi);
    float inv = core::merged_inv_sum(sL[r], has_keys);
    float lse = core::merged_lse(sM[r], sL[r], has_keys);
    if (sq.broken) inv = lse = NAN;
    T* og = static_cast<T*>(p.out) + b * p.out_batch + (sq.q_row0 + tr.qi) * p.out_row + tr.h * p.out_head + c;
    *reinterpret_cast<uint2*>(og) = make_uint2(attn::pack2<T>(a[0] * inv, a[1] * inv), attn::pack2<T>(a[2] * inv, a[3] * inv));
    if (p.lse != nullptr && c == 0) p.lse[b * p.lse_batch + tr.h * p.lse_head + (sq.q_row0 + tr.qi) * p.lse_row] = lse;
  }
}

/// Merges the num_splits partial outputs (core/merge.hpp: the (m = lse_s, l = 1, acc = o_s) instance): one warp per
/// (batch, head, query row).
template <int kHeadDim, class T>
__global__ void decode_combine_kernel(const DecodeParams p) {
  grid_dependency_wait();
  const int64_t warp_id = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  const int64_t rows = static_cast<int64_t>(p.batch) * p.num_heads * p.seqlen_q;
  if (warp_id >= rows) return;
  const int qi = static_cast<int>(warp_id % p.seqlen_q);
  const int h = static_cast<int>((warp_id / p.seqlen_q) % p.num_heads);
  const int b = static_cast<int>(warp_id / (static_cast<int64_t>(p.seqlen_q) * p.num_heads));
  const DecodeSeq sq = decode_seq(p, b);
  if (qi >= sq.seqlen_q) return;  // varlen: past this sequence's queries
  float M = -INFINITY;
  for (int s = 0; s < p.num_splits; ++s) M = core::merge_max(M, p.lse_accum[s * rows + warp_id]);
  constexpr int kPer = kHeadDim / 32;
  float acc[kPer] = {};
  float L = 0.f;
  for (int s = 0; s < p.num_splits; ++s) {
    const float w = core::merge_weight(p.lse_accum[s * rows + warp_id], M);
    L = core::merge_accumulate(L, w, 1.f);
    const float* src = p.o_accum + (s * rows + warp_id) * kHeadDim;
#pragma unroll
    for (int i = 0; i < kPer; ++i) acc[i] = core::merge_accumulate(acc[i], w, src[lane + 32 * i]);
  }
  const core::MaskRule rule = decode_rule(p, sq);
  const bool has_keys = rule.row_last(qi) > rule.row_first(qi);
  float inv = core::merged_inv_sum(L, has_keys);
  float lse = core::merged_lse(M, L, has_keys);
  if (sq.broken) inv = lse = NAN;
  T* og = static_cast<T*>(p.out) + b * p.out_batch + (sq.q_row0 + qi) * p.out_row + h * p.out_head;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int c = lane + 32 * i;
    if (c < p.head_dim) og[c] = static_cast<T>(acc[i] * inv);
  }
  if (p.lse != nullptr && lane == 0) p.lse[b * p.lse_batch + h * p.lse_head + (sq.q_row0 + qi) * p.lse_row] = lse;
}

}  // namespace flashkv::cuda
