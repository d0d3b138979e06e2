// The folded scales of the split-KV decode (sm80/decode_kernel.cuh) over packed pages: a KvQuantSource
// (sm80/decode_kv_source.cuh) delivers exact 16-bit images x16 = (code − kOff) · kMul of the codes (Code16), and the
// per-key factors are applied in float32 around the MMAs instead of per element, with scale' = scale / kMul and
// min' = min + kOff · scale (x̂ = scale' · x16 + min'):
//   K  head_static   s_ij · scale'_h after the QK MMA (k_factors)
//      token_f32     s_ij · scale'_j after the QK MMA (k_factors)
//      token_affine  s_ij = Σ_g scale'_jg · (q_i · x16_j)_g + min'_jg · Σ_{d in g} q_id: the MMAs accumulate one
//                    channel group at a time, the per-group hook k_slice adds it (Σ_{d in g} q_id: from init)
//   V  head_static   the output · scale'_h once, after the loop (finish)
//      token_f32     P_ij · scale'_j into the P·V MMA's A operand (p_operand)
//      token_affine  per channel group g: P_ij · scale'_jg as the A operand of its 16-column slices (the per-group
//                    hook v_slice) + Σ_j P_ij · min'_jg in float32, added to the output after the loop (finish)
// A per-token V scale in fp16's P (TV = __half) is kept in range by a power of two per block (vscale: o holds
// out / vscale, its change folded into o's rescale). For 16-bit pages (Kv16Source) every hook compiles to nothing.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/sm80/decode_kv_source.cuh"
#include "cuda/sm80/mma.cuh"
#include "kvcache/format/traits.hpp"

namespace flashkv::cuda::sm80 {

/// A quantized source's own estimate of the CTA's shared memory (its register cap is derived from it) is exact.
template <class Src, int kBytes>
constexpr bool smem_estimate_ok() {
  if constexpr (Src::kFolded) {
    return Src::kSmemBytes == kBytes;
  } else {
    return true;
  }
}

/// The K / V scalings of a KV source (none for 16-bit pages).
template <class Src>
__host__ __device__ constexpr kv::KVScaling scaling_k() {
  if constexpr (Src::kFolded) return Src::kScalingK; else return kv::KVScaling::none;
}
template <class Src>
__host__ __device__ constexpr kv::KVScaling scaling_v() {
  if constexpr (Src::kFolded) return Src::kScalingV; else return kv::KVScaling::none;
}

/// The hooks the mainloop calls for one thread (its rows g, g + 8 and its keys rk, rk + 1, rk + 8, rk + 9 of each
/// block); T = the query dtype, kHeadDim the compiled head dim. The fold state is the mainloop's own variables (QSum,
/// PMin, vscale; per block vf, vratio), passed in: as locals of the kernel they compile exactly as inline code.
template <class Src, class T, int kHeadDim>
struct DecodeFold {
  static constexpr int kDT = kHeadDim / 8;
  static constexpr bool kFolded = Src::kFolded;
  static constexpr bool kKHead = scaling_k<Src>() == kv::KVScaling::head_static;
  static constexpr bool kKToken = scaling_k<Src>() == kv::KVScaling::token_f32;
  static constexpr bool kKAffine = scaling_k<Src>() == kv::KVScaling::token_affine;
  static constexpr bool kVHead = scaling_v<Src>() == kv::KVScaling::head_static;
  static constexpr bool kVToken = scaling_v<Src>() == kv::KVScaling::token_f32;
  static constexpr bool kVAffine = scaling_v<Src>() == kv::KVScaling::token_affine;
  using TV = typename Src::TV;  ///< element type of P in the P·V MMA (fp16 for token-scaled V)
  static constexpr bool kVNormalize = std::is_same_v<TV, __half> && (kVToken || kVAffine);

  /// affine keys: Σ_d q_id over each 16-channel slice of this thread's two rows (the zero point's term per group)
  using QSum = float[kKAffine ? kHeadDim / 16 : 1][2];
  /// affine values: Σ_j P_ij · min'_j of each channel group (at the group's first 16-column slice), rescaled like o
  using PMin = float[kVAffine ? kDT / 2 : 1][2];
  // vscale (kVNormalize): o holds the output divided by vscale, 1 at the start; per block: vf, the token-scaled
  // values' factor of each of this thread's keys (0 past the sequence's end: never NaN · 0), and vratio, o's extra
  // rescale for the block's vscale (kVNormalize)

  /// Channels per group of the affine K / V half (0 for other scalings).
  __device__ __forceinline__ static int group(const Src& src, int half) {
    if constexpr (kKAffine || kVAffine) {
      return src.group(half);
    } else {
      return 0;
    }
  }
  /// Every affine half's channel group is g channels (the mainloop's compile-time variants: the whole head, 32).
  __device__ __forceinline__ static bool groups_are(const Src& src, int g) {
    return (!kKAffine || src.group(0) == g) && (!kVAffine || src.group(1) == g);
  }
  /// qsum of the Q fragments qa (affine keys) and pmin zeroed (affine values).
  __device__ __forceinline__ static void init(const uint32_t (&qa)[kHeadDim / 16][4], QSum& qsum, PMin& pmin) {
    if constexpr (kKAffine) {
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float2 x = unpack2<T>(qa[kk][hh]), y = unpack2<T>(qa[kk][hh + 2]);
          qsum[kk][hh] = quad_sum((x.x + x.y) + (y.x + y.y));
        }
    }
#pragma unroll
    for (int i = 0; i < (kVAffine ? kDT / 2 : 1); ++i) pmin[i][0] = pmin[i][1] = 0.f;
  }

  /// Affine keys, after the QK MMA of 16-column slice kk into `acc`: where a channel group of `kgroup` channels ends,
  /// its partial scores join `s` with the group's factors (stage: the block's staged metadata; rk: this thread's keys).
  /// (halves: std::integral_constant<int, 1 or 2>, the row halves g / g + 8 with query rows; 1: scores of row g + 8
  /// are left as they are, the mainloop ignores them.)
  template <class Halves>
  __device__ __forceinline__ static void k_slice(const Src& src, int kk, int kgroup, uint32_t stage, int rk,
                                                 const QSum& qsum, float (&acc)[2][4], float (&qacc)[2],
                                                 float (&s)[2][4], Halves) {
    constexpr int kHalves = Halves::value;
    if constexpr (kKAffine) {
      qacc[0] += qsum[kk][0];
      if constexpr (kHalves == 2) qacc[1] += qsum[kk][1];
      if (((kk + 1) * 16) % kgroup == 0) {  // the group ends here (uniform branch)
        const int gi = kk * 16 / kgroup;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e2 = 0; e2 < 2; ++e2) {
            const float2 f = src.template affine_factors<0>(stage, rk + nt * 8 + e2, gi);
#pragma unroll
            for (int hh = 0; hh < kHalves; ++hh) {
              s[nt][2 * hh + e2] = fmaf(f.x, acc[nt][2 * hh + e2], fmaf(f.y, qacc[hh], s[nt][2 * hh + e2]));
              acc[nt][2 * hh + e2] = 0.f;
            }
          }
        qacc[0] = qacc[1] = 0.f;
      }
    }
  }
  /// Per-token / static K scales on the block's scores (keys past the end are masked afterwards).
  template <class Halves>
  __device__ __forceinline__ static void k_factors(const Src& src, uint32_t stage, int rk, float (&s)[2][4], Halves) {
    constexpr int kHalves = Halves::value;
    if constexpr (kKToken) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const float2 f = src.template token_factors<0>(stage, rk + nt * 8);
        s[nt][0] *= f.x, s[nt][1] *= f.y;
        if constexpr (kHalves == 2) s[nt][2] *= f.x, s[nt][3] *= f.y;
      }
    } else if constexpr (kKHead) {
      const float f = src.k_head_factor();
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2 * kHalves; ++e) s[nt][e] *= f;
    }
  }

  /// The block's V factors vf (keys j0 + rk, ...; 0 past seqlen_k; vf and vratio enter as 0 and 1) and, for fp16 P,
  /// its power of two: vscale, vratio (vgroup: affine V's channels per group).
  __device__ __forceinline__ static void v_factors(const Src& src, int vgroup, uint32_t stage, int rk, int j0, int seqlen_k,
                                                   float (&vf)[2][2], float& vscale, float& vratio) {
    if constexpr (kVToken) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const float2 f = src.template token_factors<1>(stage, rk + nt * 8);
        const int j = j0 + rk + nt * 8;
        vf[nt][0] = j < seqlen_k ? f.x : 0.f, vf[nt][1] = j + 1 < seqlen_k ? f.y : 0.f;
      }
    }
    if constexpr (kVNormalize) {
      float mx = 0.f;  // scales are >= 0
      if constexpr (kVToken) {
        mx = fmaxf(fmaxf(vf[0][0], vf[0][1]), fmaxf(vf[1][0], vf[1][1]));
      } else {
        const int ng = kHeadDim / vgroup;  // a compile-time 1 in the whole-group loop
        for (int gi = 0; gi < ng; ++gi)
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e2 = 0; e2 < 2; ++e2) {
              const int j = j0 + rk + nt * 8 + e2;
              if (j < seqlen_k) mx = fmaxf(mx, src.template affine_factors<1>(stage, rk + nt * 8 + e2, gi).x);
            }
      }
      mx = quad_max(mx);  // the quad holds all 16 keys (the same in every quad)
      const uint32_t ex = __float_as_uint(mx) & 0x7f800000u;  // 2^floor(log2 mx); keep vscale for 0 / subnormal
      if (ex != 0u && ex != 0x7f800000u) {
        const float nv = __uint_as_float(ex);
        // vscale / nv without a division: 2^(a − b) = (2^a · 0.5) · 2^(1 − b), both factors exact (2^(1 − b) is normal
        // for every normal nv = 2^b; 2^a · 0.5 at worst the exact subnormal 2^−127), one rounding: the quotient's value
        vratio = (vscale * 0.5f) * __uint_as_float(0x7f800000u - ex);
        vscale = nv;
        const float inv = __uint_as_float(0x7f000000u - ex);  // 1 / nv
        if constexpr (kVToken) vf[0][0] *= inv, vf[0][1] *= inv, vf[1][0] *= inv, vf[1][1] *= inv;
      }
    }
  }
  /// 1 / v for a power of two v (normal): (0.5 · 2^(1 − b)), exact, no division.
  __device__ __forceinline__ static float inv_pow2(float v) {
    return __uint_as_float(0x7f800000u - (__float_as_uint(v) & 0x7f800000u)) * 0.5f;
  }
  /// o's rescale of row hh by `corr` also applies to the P · min' sums.
  __device__ __forceinline__ static void rescale(PMin& pmin, int hh, float corr) {
    if constexpr (kVAffine) {
#pragma unroll
      for (int i = 0; i < kDT / 2; ++i) pmin[i][hh] *= corr;
    }
  }

  /// The P·V MMA's A operand of the block's probabilities s (e = 0, 1: keys rk, rk + 1 of rows g, g + 8), with the
  /// per-token V scale folded in (not for affine V: v_slice sets it per channel group).
  /// (halves 1: the A rows g + 8, a[1] and a[3], are 0.)
  template <class Halves>
  __device__ __forceinline__ static void p_operand(const float (&s)[2][4], const float (&vf)[2][2], uint32_t (&a)[4],
                                                   Halves) {
    if constexpr (Halves::value == 1) {
      if constexpr (kVToken) {
        a[0] = pack2<TV>(s[0][0] * vf[0][0], s[0][1] * vf[0][1]);
        a[2] = pack2<TV>(s[1][0] * vf[1][0], s[1][1] * vf[1][1]);
      } else if constexpr (!kVAffine) {
        a[0] = pack2<TV>(s[0][0], s[0][1]);
        a[2] = pack2<TV>(s[1][0], s[1][1]);
      }
      a[1] = a[3] = 0u;
    } else if constexpr (kVToken) {
      a[0] = pack2<TV>(s[0][0] * vf[0][0], s[0][1] * vf[0][1]);
      a[1] = pack2<TV>(s[0][2] * vf[0][0], s[0][3] * vf[0][1]);
      a[2] = pack2<TV>(s[1][0] * vf[1][0], s[1][1] * vf[1][1]);
      a[3] = pack2<TV>(s[1][2] * vf[1][0], s[1][3] * vf[1][1]);
    } else if constexpr (!kVAffine) {
      a[0] = pack2<TV>(s[0][0], s[0][1]);
      a[1] = pack2<TV>(s[0][2], s[0][3]);
      a[2] = pack2<TV>(s[1][0], s[1][1]);
      a[3] = pack2<TV>(s[1][2], s[1][3]);
    }
  }
  /// Affine values, before the P·V MMAs of 16-column slice dt2: where a channel group of `vgroup` channels starts,
  /// a = P · scale'_g / vscale (inv = 1 / vscale) and P · min'_g joins pmin — out_i += Σ_j (P_ij · scale'_jg) · v16_jd
  /// (the MMA) + Σ_j P_ij · min'_jg (float32). Keys j0 + rk, ... past seqlen_k weigh 0.
  template <class Halves>
  __device__ __forceinline__ static void v_slice(const Src& src, int dt2, int vgroup, float inv, uint32_t stage, int rk,
                                                 int j0, int seqlen_k, const float (&s)[2][4], PMin& pmin,
                                                 uint32_t (&a)[4], Halves) {
    constexpr int kHalves = Halves::value;
    if constexpr (kVAffine) {
      if ((dt2 * 16) % vgroup == 0) {  // a group starts at this 16-column slice (uniform branch)
        const int gi = dt2 * 16 / vgroup;
        float pf[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e2 = 0; e2 < 2; ++e2) {
            float2 f = src.template affine_factors<1>(stage, rk + nt * 8 + e2, gi);
            if (j0 + rk + nt * 8 + e2 >= seqlen_k) f = make_float2(0.f, 0.f);
#pragma unroll
            for (int hh = 0; hh < kHalves; ++hh) {
              const float pv = s[nt][2 * hh + e2];
              pf[nt][2 * hh + e2] = pv * (f.x * inv);
              pmin[dt2][hh] = fmaf(pv, f.y, pmin[dt2][hh]);
            }
          }
        a[0] = pack2<TV>(pf[0][0], pf[0][1]);
        a[2] = pack2<TV>(pf[1][0], pf[1][1]);
        if constexpr (kHalves == 2) {
          a[1] = pack2<TV>(pf[0][2], pf[0][3]);
          a[3] = pack2<TV>(pf[1][2], pf[1][3]);
        } else {
          a[1] = a[3] = 0u;
        }
      }
    }
  }

  /// After the loop: the output factors left out of it — o · vscale (· the static V scale) + P · min'.
  __device__ __forceinline__ static void finish(const Src& src, float vscale, const PMin& pmin, float (&o)[kDT][4]) {
    if constexpr (kFolded) {
      const float f = kVHead ? src.v_head_factor() : vscale;
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[dt][e] *= f;
      if constexpr (kVAffine) {
        const int vgroup = src.group(1);
        float cur[2] = {0.f, 0.f};
#pragma unroll
        for (int dt2 = 0; dt2 < kDT / 2; ++dt2) {
          if ((dt2 * 16) % vgroup == 0) cur[0] = quad_sum(pmin[dt2][0]), cur[1] = quad_sum(pmin[dt2][1]);
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            o[2 * dt2][2 * hh] += cur[hh], o[2 * dt2][2 * hh + 1] += cur[hh];
            o[2 * dt2 + 1][2 * hh] += cur[hh], o[2 * dt2 + 1][2 * hh + 1] += cur[hh];
          }
        }
      }
    }
  }
};

}  // namespace flashkv::cuda::sm80
