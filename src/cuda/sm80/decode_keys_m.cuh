// The keys-as-M mainloop of the split-KV decode (sm80/decode_kernel.cuh) for register-direct packed pages
// (KvQuantSource::kRegDirect: fp8 / int8 / int4 codes, head dims 64 / 128) and CTAs of at most 8 query rows (a decode
// step with GQA groups <= 8, the serving case).
//
// The 16-row loop computes S = Q·Kᵀ with the query rows as the MMA's M: a CTA of <= 8 query rows leaves half of every
// m16n8k16 tile empty, and its 32 MMAs per warp and 64-key block (head_dim 128) bounded int4 / int8 by the tensor and
// issue pipes at 50–85 % of HBM (H200 run12). Here the keys are M and the queries N (S and O transposed):
//   Sᵀ[16 keys × 8 queries] = K[16 keys × d] · Qᵀ        A = K's register-direct fragments, B = Q's
//   Oᵀ[d × 8 queries]      += Vᵀ[d × 16 keys] · Pᵀ        A = V's register-direct fragments, B = Pᵀ
// — half the MMAs (one m16n8k16 per 16-channel slice and warp, each for QK and PV), half the accumulator registers, and
// each thread holds 2 keys (g, g + 8) × 2 queries (2t, 2t + 1) instead of 4 keys × 1 row, so the per-key metadata
// (scales, zero points) is read and converted for half as many keys. The fragments are the 16-row loop's own
// registers (sm80/decode_frag.hpp): the B fragments of K for keys 0..7 / 8..15 are the A fragment's rows g / g + 8
// (a = {bk0, bk2, bk1, bk3}), the Q A fragment's rows 0..7 are Qᵀ's B fragment ({qa0, qa2}), and V's B fragments of
// the n8 tiles 2s / 2s + 1 are the A rows g / g + 8 of Vᵀ — so Oᵀ's rows g, g + 8 of slice s are channels 16s + 2g
// and 16s + 2g + 1. Pᵀ's B fragment is the transpose of the score accumulator's 8 × 8 halves (movmatrix.trans: one
// instruction per 8 keys). The online softmax runs per query column: the max over a block's 16 keys is a reduction
// over the 8 lanes of a column (xor 4, 8, 16). Same folds as the 16-row loop (sm80/decode_fold.cuh: scale' / min'
// of the exact 16-bit images, per key on the scores and into P, zero points in float32; fp16 P's power of two per
// block), same masks, same non-finite contract (folded images are finite; masked keys are selected out as −inf).
#pragma once

#include <cmath>

#include "cuda/common/ptx.cuh"
#include "cuda/decode_params.hpp"
#include "cuda/sm80/decode_fold.cuh"
#include "cuda/sm80/decode_frag.hpp"
#include "cuda/sm80/decode_kv_source.cuh"
#include "cuda/sm80/mma.cuh"

namespace flashkv::cuda::sm80 {

/// max(a, b), NaN when either is NaN (fmaxf drops NaN; PTX max.NaN).
__device__ __forceinline__ float max_nan(float a, float b) {
  float d;
  asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(d) : "f"(a), "f"(b));
  return d;
}

/// Reductions over the 8 lanes of one query column (lanes t, t + 4, .., t + 28).
__device__ __forceinline__ float column_max_nan(float x) {
  x = max_nan(x, __shfl_xor_sync(0xffffffffu, x, 4));
  x = max_nan(x, __shfl_xor_sync(0xffffffffu, x, 8));
  return max_nan(x, __shfl_xor_sync(0xffffffffu, x, 16));
}
__device__ __forceinline__ float column_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 8));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 16));
}
__device__ __forceinline__ float column_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 4);
  x += __shfl_xor_sync(0xffffffffu, x, 8);
  return x + __shfl_xor_sync(0xffffffffu, x, 16);
}

/// What the keys-as-M loop needs of its CTA (decode_body's values).
struct KeysMCta {
  int nb_begin, nb_end;  ///< the split's 64-key blocks
  int seqlen_k;
  int jlo[2], jhi[2];  ///< visible keys [jlo, jhi) of this thread's query columns 2t, 2t + 1
  float scale_log2, score_scale;
  bool softcap;
};

/// Runs the split's blocks and leaves this warp's partial softmax state in the warp-merge scratch of decode_body:
/// sO[warp][16][kHeadDim] (rows = the CTA's query rows, natural channel order), sM (row max, natural log), sL (row
/// sum). qa: the Q tile's A fragments (channels permuted like the K fragments'). kGroup: channels per affine group at
/// compile time (head_dim or 32), 0 = run time. ring(it) waits for block `it` of the split, refills the ring and
/// returns its stage's shared address; prefetch(nb) is the L2 hint at a block's end.
template <class Src, class T, int kHeadDim, int kGroup, class Ring, class Prefetch>
__device__ __forceinline__ void decode_keys_m(const Src& src, const KeysMCta& c, const uint32_t (&qa)[kHeadDim / 16][4],
                                              Ring&& ring, Prefetch&& prefetch, float* sO, float* sM, float* sL) {
  static_assert(Src::kRegDirect, "the keys-as-M loop reads register-direct fragments");
  using Fold = DecodeFold<Src, T, kHeadDim>;  // the scalings (its hooks are the 16-row loop's layout)
  using TV = typename Fold::TV;
  constexpr bool kKHead = Fold::kKHead, kKToken = Fold::kKToken, kKAffine = Fold::kKAffine;
  constexpr bool kVHead = Fold::kVHead, kVToken = Fold::kVToken, kVAffine = Fold::kVAffine;
  constexpr bool kVNormalize = Fold::kVNormalize;
  constexpr int kS = kHeadDim / 16;                      // 16-channel slices
  constexpr int kSlots = kGroup > 0 ? kHeadDim / kGroup : kS;  // fold slots: per group, or per slice (run-time group)
  constexpr float kLn2 = 0.69314718055994531f;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int rk = warp * 16 + g;  // block rows of this thread's keys: rk, rk + 8
  const int kgroup = kGroup > 0 ? kGroup : Fold::group(src, 0);
  const int vgroup = kGroup > 0 ? kGroup : Fold::group(src, 1);
  auto slot = [&](int s, int grp) { return kGroup > 0 ? s * 16 / kGroup : (s * 16 / grp) * grp / 16; };

  // Qᵀ's B fragments: rows 0..7 of the Q tile's A fragments qa (the CTA has <= 8 query rows)
  uint32_t qb[kS][2];
#pragma unroll
  for (int kk = 0; kk < kS; ++kk) frag::keys_m_q_operand(qa[kk], qb[kk]);
  // affine keys: Σ_d q_d of each group (compile-time groups) or slice (run time) for query columns 2t, 2t + 1
  float qsum[kKAffine ? kSlots : 1][2];
  if constexpr (kKAffine) {
#pragma unroll
    for (int i = 0; i < kSlots; ++i) qsum[i][0] = qsum[i][1] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kS; ++kk) {
      const float2 x = unpack2<T>(qb[kk][0]), y = unpack2<T>(qb[kk][1]);
      const float row = quad_sum((x.x + x.y) + (y.x + y.y));  // query row g's slice sum (every lane of quad g)
#pragma unroll
      for (int e = 0; e < 2; ++e) qsum[kGroup > 0 ? kk * 16 / kGroup : kk][e] += __shfl_sync(0xffffffffu, row, 4 * (2 * t + e));
    }
  }
  float pmin[kVAffine ? kSlots : 1][2];  // affine values: Σ_j P_j · min'_j per group slot and query column
#pragma unroll
  for (int i = 0; i < (kVAffine ? kSlots : 1); ++i) pmin[i][0] = pmin[i][1] = 0.f;
  float vscale = 1.f;  // kVNormalize: o holds the output divided by vscale

  float o[kS][4];  // Oᵀ of slice s: [0], [1] = channel 16s + 2g, queries 2t, 2t + 1; [2], [3] = channel 16s + 2g + 1
#pragma unroll
  for (int s = 0; s < kS; ++s) o[s][0] = o[s][1] = o[s][2] = o[s][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};

  for (int it = 0; c.nb_begin + it < c.nb_end; ++it) {
    const int nb = c.nb_begin + it;
    const uint32_t stage = ring(it);
    const int j0 = nb * kDecodeBlockN, jw0 = j0 + warp * 16;

    // ---- Sᵀ = K · Qᵀ (s[2h + e]: key rk + 8h, query column 2t + e) ----
    float s[4] = {0.f, 0.f, 0.f, 0.f};
    {
      float acc[4] = {0.f, 0.f, 0.f, 0.f}, qacc[2] = {0.f, 0.f};
      float(&qk)[4] = kKAffine ? acc : s;
      uint32_t kw[Src::kLdsmK][4];
      src.k_words(stage, kw);
#pragma unroll
      for (int kk = 0; kk < kS; ++kk) {
        uint32_t bk[4];
        src.k_frag(kw, kk, bk);
        uint32_t a[4];
        frag::keys_m_operand(bk, a);
        mma_16816<T>(qk, a, qb[kk][0], qb[kk][1]);
        if constexpr (kKAffine) {
          if constexpr (kGroup == 0) qacc[0] += qsum[kk][0], qacc[1] += qsum[kk][1];
          if (((kk + 1) * 16) % kgroup == 0) {  // the group ends here (compile time, or a uniform branch)
            const int gi = kk * 16 / kgroup;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const float2 f = src.template affine_factors<0>(stage, rk + 8 * h, gi);
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const float q = kGroup > 0 ? qsum[gi][e] : qacc[e];
                s[2 * h + e] = fmaf(f.x, acc[2 * h + e], fmaf(f.y, q, s[2 * h + e]));
                acc[2 * h + e] = 0.f;
              }
            }
            qacc[0] = qacc[1] = 0.f;
          }
        }
      }
      if constexpr (kKToken) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float f = src.template token_factor<0>(stage, rk + 8 * h);
          s[2 * h] *= f, s[2 * h + 1] *= f;
        }
      } else if constexpr (kKHead) {
        const float f = src.k_head_factor();
#pragma unroll
        for (int e = 0; e < 4; ++e) s[e] *= f;
      }
    }
    uint32_t vw[Src::kLdsmV][4];
    src.v_words(stage, vw);

    // ---- the block's V factors: per-token scales of keys rk, rk + 8 (0 past the end); fp16 P's power of two ----
    float vf[2] = {1.f, 1.f}, vratio = 1.f;
    if constexpr (kVToken) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float f = src.template token_factor<1>(stage, rk + 8 * h);
        vf[h] = j0 + rk + 8 * h < c.seqlen_k ? f : 0.f;
      }
    }
    if constexpr (kVNormalize) {
      float mx = 0.f;  // scales are >= 0
      if constexpr (kVToken) {
        mx = fmaxf(vf[0], vf[1]);
      } else {
        for (int gi = 0; gi < kHeadDim / vgroup; ++gi)  // a compile-time count for compile-time groups
#pragma unroll
          for (int h = 0; h < 2; ++h)
            if (j0 + rk + 8 * h < c.seqlen_k) mx = fmaxf(mx, src.template affine_factors<1>(stage, rk + 8 * h, gi).x);
      }
      mx = column_max(mx);  // the 8 lanes of a column hold all 16 keys of the warp
      const uint32_t ex = __float_as_uint(mx) & 0x7f800000u;  // 2^floor(log2 mx); keep vscale for 0 / subnormal
      if (ex != 0u && ex != 0x7f800000u) {
        vratio = (vscale * 0.5f) * __uint_as_float(0x7f800000u - ex);  // vscale / nv, exact (decode_fold.cuh)
        vscale = __uint_as_float(ex);
        const float inv = __uint_as_float(0x7f000000u - ex);
        if constexpr (kVToken) vf[0] *= inv, vf[1] *= inv;
      }
    }

    // ---- softcap, masks, online softmax per query column ----
    if (c.softcap) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[e] = tanh_approx(s[e] * c.score_scale);
    }
    if (jw0 < max(c.jlo[0], c.jlo[1]) || jw0 + 16 > min(c.jhi[0], c.jhi[1])) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = jw0 + g + 8 * (e >> 1), col = e & 1;
        if (j < c.jlo[col] || j >= c.jhi[col]) s[e] = -INFINITY;  // a select: masked keys are exactly absent
      }
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float mx = column_max_nan(max_nan(row_max[e], max_nan(s[e], s[2 + e])));
      const float m_scaled = mx == -INFINITY ? 0.f : mx * c.scale_log2;
      const float corr = exp2_approx(row_max[e] * c.scale_log2 - m_scaled);
      row_max[e] = mx;
      row_sum[e] *= corr;
      const float ocorr = kVNormalize ? corr * vratio : corr;
      if (ocorr != 1.f || corr != 1.f) {  // skipped where the column max and vscale did not move
#pragma unroll
        for (int i = 0; i < kS; ++i) o[i][e] *= ocorr, o[i][e + 2] *= ocorr;
        if constexpr (kVAffine) {
#pragma unroll
          for (int i = 0; i < kSlots; ++i) pmin[i][e] *= corr;
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float pv = exp2_approx(fmaf(s[2 * h + e], c.scale_log2, -m_scaled));
        s[2 * h + e] = pv;
        row_sum[e] += pv;
      }
    }

    // ---- Oᵀ += Vᵀ · Pᵀ (Pᵀ's B fragment: the transposed 8 × 8 halves of the scores, V's per-key factor folded in) ----
    auto p_operand = [&](float x0, float x1, uint32_t (&b)[2]) {
      b[0] = movmatrix_trans(pack2<TV>(s[0] * x0, s[1] * x0));  // keys rk: -> B rows 2t, 2t + 1 of keys 0..7
      b[1] = movmatrix_trans(pack2<TV>(s[2] * x1, s[3] * x1));  // keys rk + 8
    };
    uint32_t pb[2];
    if constexpr (!kVAffine) p_operand(vf[0], vf[1], pb);
    const float vinv = kVAffine ? Fold::inv_pow2(vscale) : 1.f;
#pragma unroll
    for (int s2 = 0; s2 < kS; ++s2) {
      if constexpr (kVAffine) {
        if ((s2 * 16) % vgroup == 0) {  // a group starts at this slice: P · scale'_g / vscale, and P · min'_g
          const int gi = s2 * 16 / vgroup, sl = slot(s2, vgroup);
          float x[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float2 f = src.template affine_factors<1>(stage, rk + 8 * h, gi);
            if (j0 + rk + 8 * h >= c.seqlen_k) f = make_float2(0.f, 0.f);
            x[h] = f.x * vinv;
            pmin[sl][0] = fmaf(s[2 * h], f.y, pmin[sl][0]);
            pmin[sl][1] = fmaf(s[2 * h + 1], f.y, pmin[sl][1]);
          }
          p_operand(x[0], x[1], pb);
        }
      }
      uint32_t bv[4];
      src.v_frag(vw, s2, bv);
      uint32_t a[4];
      frag::keys_m_operand(bv, a);
      mma_16816<TV>(o[s2], a, pb[0], pb[1]);
    }
    prefetch(nb);
  }

  // ---- the factors left out of the loop: o · vscale (· the static V scale) + Σ P · min' ----
  {
    const float f = kVHead ? src.v_head_factor() : vscale;
#pragma unroll
    for (int i = 0; i < kS; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[i][e] *= f;
    if constexpr (kVAffine) {
      float cur[2] = {0.f, 0.f};
#pragma unroll
      for (int s2 = 0; s2 < kS; ++s2) {
        if ((s2 * 16) % vgroup == 0) {
          const int sl = slot(s2, vgroup);
          cur[0] = column_sum(pmin[sl][0]), cur[1] = column_sum(pmin[sl][1]);
        }
#pragma unroll
        for (int e = 0; e < 2; ++e) o[s2][e] += cur[e], o[s2][e + 2] += cur[e];
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the ring: the merge scratch reuses it
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int r = 2 * t + e;  // query row of the CTA
    const float l = column_sum(row_sum[e]);
    if (g == 0) {
      sM[warp * 16 + r] = row_max[e] * (c.scale_log2 * kLn2);  // -inf stays -inf, NaN stays NaN
      sL[warp * 16 + r] = l;
    }
#pragma unroll
    for (int s2 = 0; s2 < kS; ++s2)
      *reinterpret_cast<float2*>(&sO[(warp * 16 + r) * kHeadDim + frag::keys_m_channel(s2, g)]) =
          make_float2(o[s2][e], o[s2][e + 2]);  // channels keys_m_channel(s2, g), keys_m_channel(s2, g + 8)
  }
}

}  // namespace flashkv::cuda::sm80
