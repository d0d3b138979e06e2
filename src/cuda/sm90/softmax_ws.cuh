// Online softmax over one warpgroup's wgmma accumulator tile (64 rows x kBlockN keys, 128 threads) for the TMA
// warp-specialized forward, with FlashAttention-4's two ideas that port to Hopper:
//   * conditional (lazy) rescaling: the running max m of a row is raised only when the tile max exceeds it by more
//     than kRescaleThreshold (log2 units), so most tiles skip the O rescale; exact, since the final normalization
//     divides by the l accumulated under the same m (P values stay <= 2^8, fine in 16 bits);
//   * software exp2 on the FMA pipe for a compile-time share of the elements (exp2_poly3), next to MUFU.EX2, so the
//     two pipes share the exponentials.
// Non-finite inputs follow the library contract (NaN-propagating row max; masked keys give p = 0 exactly).
// Source: Zadouri et al., "FlashAttention-4" (2026), "conditional softmax rescaling" and "software emulation of the
// exponential"; FlashAttention-2 (Dao 2023) §3.1 for the online softmax with exp2 and log2(e) folded into the scale.
//
// Accumulator layout (PTX ISA, wgmma D fragment for m64nN, f32): in warp w of the warpgroup, lane 4g + t holds
// element s[j*4 + 2*hh + e] = (row 16w + g + 8hh, column 8j + 2t + e), j < N/8, hh, e in {0, 1}.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace flashkv::cuda::sm90 {

/// max(a, b), NaN if either is NaN (PTX max.NaN; fmaxf would drop the NaN).
__device__ __forceinline__ float fmax_nan(float a, float b) {
  float d;
  asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(d) : "f"(a), "f"(b));
  return d;
}
__device__ __forceinline__ float quad_max_nan(float x) {
  x = fmax_nan(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmax_nan(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum_f(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/// 2^x on the multi-function unit (MUFU.EX2; subnormal results flush to 0, ex2(-inf) = 0).
__device__ __forceinline__ float exp2_mufu(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// 2^x on the FMA pipe: x = i + f with i = floor(x) (one round-down add of 1.5*2^23), 2^f by a degree-3 minimax
/// polynomial (max relative error 7.5e-5 on [0, 1): below the 16-bit rounding of P), times 2^i built from the
/// integer bits. Matches exp2_mufu's special cases: x < -126 gives 0 (2^i with i = -127 is the float 0, as the FTZ
/// of MUFU), NaN stays NaN (max.NaN keeps it and NaN * anything is NaN), +inf overflows to inf or NaN (only reached
/// from a NaN/inf row, which is NaN anyway). 9 instructions, 8 of them on the FMA/ALU pipes.
__device__ __forceinline__ float exp2_poly3(float x) {
  constexpr float kMagic = 12582912.f;  // 1.5 * 2^23: adding it leaves floor(x) in the low mantissa bits
  x = fmax_nan(x, -127.f);
  const float j = __fadd_rd(x, kMagic);
  const float f = x - __fsub_rn(j, kMagic);  // f in [0, 1)
  const float p = fmaf(fmaf(fmaf(0.07802403f, f, 0.22606707f), f, 0.695834f), f, 0.99992514f);
  // bits(j) = 0x4B400000 + i; (bits << 23) = i << 23 (mod 2^32); + 127 << 23 = the float 2^i (0 for i = -127).
  const float scale = __uint_as_float((__float_as_uint(j) << 23) + 0x3F800000u);
  return p * scale;
}

/// Two floats -> one register of two T (round to nearest even), `lo` in the low half: a wgmma A-operand register.
template <class T>
__device__ __forceinline__ uint32_t pack_x2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

/// Running (m, l) of the two rows a thread holds; m in score units (the log2 scale is applied on use).
template <int kBlockN, bool kCondRescale, int kEmuEighths>
struct OnlineSoftmaxWs {
  static constexpr float kRescaleThreshold = 8.f;  ///< log2 units (FA4: 8 for 16-bit P)
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};

  /// Turns the scores s (already masked with -inf) into unnormalized probabilities in place, updates (m, l), and
  /// returns in corr the factor O must be multiplied by; the return value is false when no row of this thread moved
  /// (corr = 1; the caller votes across the warp before touching O).
  template <bool kFirst>
  __device__ __forceinline__ bool update(float (&s)[kBlockN / 2], float scale_log2, float (&corr)[2]) {
    bool moved = false;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float mx = s[2 * hh];
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) mx = fmax_nan(mx, fmax_nan(s[j * 4 + 2 * hh], s[j * 4 + 2 * hh + 1]));
      mx = quad_max_nan(mx);
      const float m_old = row_max[hh];
      corr[hh] = 1.f;
      if constexpr (kCondRescale) {
        // Raise m when the tile max is > 2^threshold above it (always for the first finite max: inf > threshold),
        // or when it is NaN (the row becomes NaN, as the definition's max does).
        if ((mx - m_old) * scale_log2 > kRescaleThreshold || mx != mx) {
          if constexpr (!kFirst) corr[hh] = exp2_mufu((m_old - mx) * scale_log2);
          row_max[hh] = mx;
          row_sum[hh] *= corr[hh];
          moved = true;
        }
      } else {
        const float m_new = fmax_nan(m_old, mx);
        if constexpr (!kFirst) corr[hh] = m_new == -INFINITY ? 1.f : exp2_mufu((m_old - m_new) * scale_log2);
        row_max[hh] = m_new;
        row_sum[hh] *= corr[hh];
        moved = true;
      }
      const float m_scaled = row_max[hh] == -INFINITY ? 0.f : row_max[hh] * scale_log2;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
        constexpr int kEmu = kEmuEighths;
        const bool emulate = kEmu > 0 && (j % 8) < kEmu;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float x = fmaf(s[j * 4 + 2 * hh + e], scale_log2, -m_scaled);
          const float pv = emulate ? exp2_poly3(x) : exp2_mufu(x);
          s[j * 4 + 2 * hh + e] = pv;
          sum += pv;
        }
      }
      row_sum[hh] += sum;
    }
    return moved;
  }

  /// 1/l of each row (0 for rows that saw no key, NaN stays NaN) and lse (natural log; -inf when no key).
  __device__ __forceinline__ void finalize(float scale_log2, float (&inv)[2], float (&lse)[2]) const {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float l = quad_sum_f(row_sum[hh]);
      inv[hh] = l == 0.f ? 0.f : 1.f / l;
      lse[hh] = l == 0.f ? -INFINITY : (row_max[hh] * scale_log2 + log2f(l)) * 0.69314718055994531f;
    }
  }
};

}  // namespace flashkv::cuda::sm90
