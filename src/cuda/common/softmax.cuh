// Online softmax state of the forward kernels (FlashAttention, Dao et al. 2022 §3.1; FlashAttention-2 §3.1: running
// max m, running sum l, unnormalized O, one final division; exp2 with log2(e) folded into the scale), with
// FlashAttention-4's conditional rescaling (exact): a row's m is raised only when the new tile max exceeds it by more
// than kRescaleThreshold (log2 units), so P = exp2(s - m) stays <= 2^threshold; O and l are rescaled only then, and a
// warp skips the O rescale entirely when none of its rows moved. Numerator and denominator use the same m.
//
// Optionally (kExp2EmuEighths > 0, FlashAttention-4's software exponential) that share of each row's 8-column groups
// takes exp2 on the FMA pipe (exp2_poly3) instead of the MUFU, so that the two pipes share the exponentials; off by
// default (measured 1-6% slower on the H200 with the sm90ws kernel: bench/results/h200-v3-2026-12-01.md).
//
// FP8 (kMaxOffset = 8, kRescaleThresholdLog2 = 0, the FA3 / FA4 choice for e4m3): P = exp2(s - m + 8) in [0, 256], so
// that P, rounded to e4m3 for the P V GEMM, uses e4m3's normal range (2^-6 .. 448) for the probabilities that matter
// instead of [0, 1] where everything below 2^-6 is subnormal; the threshold must then be 0 (max offset + threshold <
// log2(448)). l carries the same factor 2^8, which cancels in O / l; finalize() takes it out of lse.
//
// Non-finite scores follow IEEE (docs/design.md, "Non-finite inputs"): the max ignores NaN (fmaxf) but a NaN score
// gives P = NaN and so l = NaN; +inf gives m = +inf and P = exp2(inf - inf) = NaN; a row whose visible scores are all
// -inf keeps m = -inf and l = 0. finalize() turns these into out/lse and keeps "no visible key" (out 0, lse -inf)
// apart from them: that case is decided by the mask rule, never by the values.
#pragma once

#include <cmath>

#include "cuda/common/frag.cuh"
#include "cuda/common/ptx.cuh"

namespace flashkv::cuda::attn {

// kRowMaxTree: the row maxima of all the thread's rows are taken first, each over four interleaved partial maxima
// (fmaxf is exactly associative, NaN ignored in any order: the same m bit for bit), then reduced across the quad
// together, before any exponential; without it each row's max is one dependent chain of kNT FMNMX, rows one after
// the other (the FP8 mainloop, whose softmax sits on the tensor cores' critical path, turns it on).
template <int kMT, bool kRescaleSkip, int kExp2EmuEighths = 0, int kMaxOffset = 0, int kRescaleThresholdLog2 = 8,
          bool kRowMaxTree = false>
struct OnlineSoftmax {
  static constexpr float kRescaleThreshold = static_cast<float>(kRescaleThresholdLog2);
  static_assert(kMaxOffset >= 0 && kRescaleThresholdLog2 >= 0, "P = exp2(s - m + offset) <= 2^(offset + threshold)");
  float row_max[kMT][2];
  float row_sum[kMT][2];  ///< this thread's partial sums (quad_sum in finalize)

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      row_max[mt][0] = row_max[mt][1] = -INFINITY;
      row_sum[mt][0] = row_sum[mt][1] = 0.f;
    }
  }

  /// Scores s (masked: -inf) -> P = exp2(s * scale_log2 - m) in place; corr = the factor O must be multiplied by.
  /// Returns whether any of this thread's rows raised its max.
  template <int kNT>
  __device__ __forceinline__ bool update(Frag<kMT, kNT> s, float scale_log2, float (&corr)[kMT][2]) {
    bool any_rescale = false;
    [[maybe_unused]] float row_mx[kMT][2];
    if constexpr (kRowMaxTree) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          float part[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
            part[nt % 4] = fmaxf(part[nt % 4], fmaxf(s(mt, nt, hh, 0), s(mt, nt, hh, 1)));
          row_mx[mt][hh] = fmaxf(fmaxf(part[0], part[1]), fmaxf(part[2], part[3]));
        }
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
          row_mx[mt][hh] = fmaxf(row_mx[mt][hh], __shfl_xor_sync(0xffffffffu, row_mx[mt][hh], 1));
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
          row_mx[mt][hh] = fmaxf(row_mx[mt][hh], __shfl_xor_sync(0xffffffffu, row_mx[mt][hh], 2));
    }
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float mx;
        if constexpr (kRowMaxTree) {
          mx = row_mx[mt][hh];
        } else {
          mx = -INFINITY;
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) mx = fmaxf(mx, fmaxf(s(mt, nt, hh, 0), s(mt, nt, hh, 1)));
          mx = quad_max(mx);
        }
        const float m_old = row_max[mt][hh];
        // Raise m only when the tile max exceeds it (by more than the threshold with conditional rescaling; the
        // first finite max always raises it since m_old = -inf).
        const bool raise = kRescaleSkip ? (mx - m_old) * scale_log2 > kRescaleThreshold : mx > m_old;
        corr[mt][hh] = 1.f;
        if (raise) {
          corr[mt][hh] = exp2_approx((m_old - mx) * scale_log2);  // 0 when m_old = -inf
          row_max[mt][hh] = mx;
          row_sum[mt][hh] *= corr[mt][hh];
          any_rescale = true;
        }
        const float m_scaled = row_max[mt][hh] == -INFINITY ? 0.f : row_max[mt][hh] * scale_log2 - kMaxOffset;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float x = fmaf(s(mt, nt, hh, e), scale_log2, -m_scaled);
            const float pv = (nt % 8) < kExp2EmuEighths ? exp2_poly3(x) : exp2_approx(x);
            s(mt, nt, hh, e) = pv;
            sum += pv;
          }
        row_sum[mt][hh] += sum;
      }
    return any_rescale;
  }

  /// O *= corr row-wise; skipped by the whole warp when no row of it raised its max (warp-uniform branch).
  template <int kNT>
  __device__ __forceinline__ void rescale(Frag<kMT, kNT> o, const float (&corr)[kMT][2], bool any_rescale) const {
    if (!kRescaleSkip || __any_sync(0xffffffffu, any_rescale)) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          o(mt, nt, 0, 0) *= corr[mt][0];
          o(mt, nt, 0, 1) *= corr[mt][0];
          o(mt, nt, 1, 0) *= corr[mt][1];
          o(mt, nt, 1, 1) *= corr[mt][1];
        }
    }
  }

  /// Row (mt, hh)'s sum l over the whole row (the quad's partial sums added).
  __device__ __forceinline__ float total(int mt, int hh) const { return quad_sum(row_sum[mt][hh]); }

  /// Row (mt, hh) with l = total(mt, hh): the output factor and the natural-log lse. `empty`: the row sees no key
  /// (mask rule) -> inv = 0 (whatever out_scale is) and lse = -inf, so that the caller's O * inv stores 0 for it.
  /// Otherwise IEEE: inv = (1/l) * out_scale (the FP8 kernels' v descale; l = NaN or 0 give NaN outputs), and lse is
  /// NaN when m = -inf (every visible score -inf) or l = NaN.
  __device__ __forceinline__ void finalize(int mt, int hh, float l, float scale_log2, bool empty, float& inv,
                                           float& lse, float out_scale = 1.f) const {
    const float m = row_max[mt][hh];
    inv = empty ? 0.f : (1.f / l) * out_scale;
    lse = empty ? -INFINITY
                : (m == -INFINITY ? NAN : (m * scale_log2 + (log2f(l) - kMaxOffset)) * 0.69314718055994531f);
  }
};

}  // namespace flashkv::cuda::attn
