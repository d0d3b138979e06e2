// Inner loops of the CPU attention kernels on float32 tiles: a vectorizable exp, the score transform
// (scale, softcap, mask) and the two tile products S = Q·Kᵀ and O += P·V.
//
// Vectorization: these are `always_inline` and meant to be called from functions marked FLASHKV_CPU_CLONES, which
// GCC compiles three times (x86-64-v4 = AVX-512, x86-64-v3 = AVX2+FMA, baseline SSE2) and pick at load time
// (ifunc), so one binary uses the machine's widest vectors without -march=native. Verified with
// `-fopt-info-vec-optimized` (GCC 12): the j-loop of qk_tile, the d-loop of pv_tile, exp_flush loops and the
// conversion loops report "loop vectorized using 64 byte vectors" in the x86-64-v4 clone.
// Why loops and not OpenBLAS sgemm per tile: measured on this machine (see qk_tile and docs/attention-cpu.md, "Inner
// products"), the register-blocked loops are ~2.5× faster on 64×64 tiles — sgemm's per-call overhead and packing
// dominate at this size — and they avoid OpenBLAS' own thread pool competing with the OpenMP workers.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__GNUC__)
#define FLASHKV_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define FLASHKV_ALWAYS_INLINE inline
#endif

// GCC only: Clang 14 does not accept "arch=" in target_clones (Clang builds get the baseline ISA).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__ELF__)
#define FLASHKV_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FLASHKV_CPU_CLONES
#endif

namespace flashkv::cpu {

/// Query rows per tile (Br) and keys per tile (Bc) of the forward kernels. See docs/attention-cpu.md "Tile sizes":
/// a 64-key K or V tile of head_dim 128 in float32 is 32 KiB, so the tile that four query rows stream against stays
/// in the 48 KiB L1d, while the working set (Q and O tiles of 128 rows, Kᵀ, V, S/P ≈ 224 KiB at d = 128, 416 KiB at
/// d = 256) stays in the 2 MiB L2 of one core. 128 query rows amortize each K/V tile load and conversion over twice
/// as many rows as 64 (measured: 43 vs 20–30 GFLOP/s at d = 64, one thread, N = 2048).
inline constexpr int kBlockM = 128;
inline constexpr int kBlockN = 64;

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// e^x for x <= 88 (float32, ≤ 2 ulp on the normal range); returns exactly 0 for x < −87.33 (including −inf), which
/// is how masked scores (−inf) become probability 0, and NaN for NaN (the clamps are comparisons, false for NaN, and
/// NaN then flows through the polynomial), which is how a NaN score reaches l and O. Callers only pass x <= 0 or NaN.
/// Branch-free so loops over it vectorize.
/// Cephes expf: x = n·ln2 + r, |r| <= ln2/2, e^r by a degree-6 polynomial, 2^n by exponent bits.
FLASHKV_ALWAYS_INLINE float exp_flush(float x) {
  const bool underflow = x < -87.33f;
  float xc = x < -87.33f ? -87.33f : x;
  xc = xc > 88.0f ? 88.0f : xc;
  const float t = xc * 1.44269504088896341f;
  const float shifted = t + 12582912.0f;  // 1.5·2^23 + n: round to nearest (no -ffast-math needed)
  const float n = shifted - 12582912.0f;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n from the integer in the low mantissa bits of `shifted` (|n| <= 127 here): unsigned arithmetic, so a NaN x
  // (garbage bits, then multiplied by a NaN p) is defined behaviour, unlike a float -> int conversion of NaN.
  const uint32_t e = std::bit_cast<uint32_t>(shifted) - 0x4B400000u + 127u;
  const float two_n = std::bit_cast<float>(e << 23);
  const float y = p * two_n;
  return underflow ? 0.0f : y;
}

/// True when x[0..n) holds no NaN or ±inf (x·0 is 0 for finite x and NaN otherwise; one vectorized pass). The CPU
/// kernels call it on an operand tile only where the mask splits the tile, to pick the guarded product below.
FLASHKV_ALWAYS_INLINE bool all_finite(const float* __restrict x, int64_t n) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += x[i] * 0.0f;
  return acc == 0.0f;
}

/// Applies softmax_scale and softcap to a score (FlashAttention semantics: softcap·tanh(s·scale/softcap)).
FLASHKV_ALWAYS_INLINE float transform_score(float s, float scale, float softcap) {
  s *= scale;
  return softcap > 0.0f ? softcap * std::tanh(s / softcap) : s;
}

/// S[i][0..kBlockN) = Q[i]·Kt[:, j] for i < rows. Q is [rows][d] (ld = d), Kt is [d][kBlockN] (the K tile
/// transposed; columns past the valid keys must be zero), S is [rows][kBlockN].
/// Register blocking: four query rows share every Kt load (4×64 float accumulators = 16 zmm registers with AVX-512).
/// Measured on the 2-core Xeon (AVX-512, 2.1 GHz), S = Q·Kᵀ plus O += P·V on one 64×64 tile: 4-row blocking
/// 30 (d = 64) / 40 (d = 128) GFLOP/s per core vs 23 / 26–34 for 1–2 rows and 12 / 16 for OpenBLAS sgemm per tile.
FLASHKV_ALWAYS_INLINE void qk_tile(const float* __restrict q, int rows, int d, const float* __restrict kt,
                                   float* __restrict s) {
  int i = 0;
  for (; i + 4 <= rows; i += 4) {
    float acc0[kBlockN] = {};
    float acc1[kBlockN] = {};
    float acc2[kBlockN] = {};
    float acc3[kBlockN] = {};
    const float* q0 = q + static_cast<int64_t>(i) * d;
    for (int dd = 0; dd < d; ++dd) {
      const float a0 = q0[dd];
      const float a1 = q0[d + dd];
      const float a2 = q0[2 * d + dd];
      const float a3 = q0[3 * d + dd];
      const float* krow = kt + static_cast<int64_t>(dd) * kBlockN;
      for (int j = 0; j < kBlockN; ++j) {
        acc0[j] += a0 * krow[j];
        acc1[j] += a1 * krow[j];
        acc2[j] += a2 * krow[j];
        acc3[j] += a3 * krow[j];
      }
    }
    float* s0 = s + static_cast<int64_t>(i) * kBlockN;
    for (int j = 0; j < kBlockN; ++j) {
      s0[j] = acc0[j];
      s0[kBlockN + j] = acc1[j];
      s0[2 * kBlockN + j] = acc2[j];
      s0[3 * kBlockN + j] = acc3[j];
    }
  }
  for (; i < rows; ++i) {
    float acc[kBlockN] = {};
    const float* q0 = q + static_cast<int64_t>(i) * d;
    for (int dd = 0; dd < d; ++dd) {
      const float a = q0[dd];
      const float* krow = kt + static_cast<int64_t>(dd) * kBlockN;
      for (int j = 0; j < kBlockN; ++j) acc[j] += a * krow[j];
    }
    float* s0 = s + static_cast<int64_t>(i) * kBlockN;
    for (int j = 0; j < kBlockN; ++j) s0[j] = acc[j];
  }
}

/// o[0..dv) += Σ_{j < cols} p[j] · V[j][0..dv)  (one output row; V is [cols][dv], ld = dv).
/// Four keys per pass so each o element is loaded/stored once per four FMAs.
FLASHKV_ALWAYS_INLINE void pv_row(const float* __restrict p, int cols, const float* __restrict v, int dv,
                                  float* __restrict o) {
  int j = 0;
  for (; j + 4 <= cols; j += 4) {
    const float p0 = p[j], p1 = p[j + 1], p2 = p[j + 2], p3 = p[j + 3];
    const float* v0 = v + static_cast<int64_t>(j) * dv;
    const float* v1 = v0 + dv;
    const float* v2 = v1 + dv;
    const float* v3 = v2 + dv;
    for (int c = 0; c < dv; ++c) o[c] += p0 * v0[c] + p1 * v1[c] + p2 * v2[c] + p3 * v3[c];
  }
  for (; j < cols; ++j) {
    const float pj = p[j];
    const float* vj = v + static_cast<int64_t>(j) * dv;
    for (int c = 0; c < dv; ++c) o[c] += pj * vj[c];
  }
}

/// pv_row restricted to the keys [first, last) — the keys the row sees (NON-FINITE INPUTS in
/// include/flashkv/attention.hpp: a masked key is absent, its p is a select to 0, never 0 × v, which is NaN for a
/// non-finite v). Same arithmetic as pv_row, group for group (masked keys read the zero row `zeros` [dv] instead of
/// their V row; their p is exactly 0, so 0·0 adds exactly what 0·v adds for finite v): where V is finite the result is
/// bit-for-bit pv_row's.
FLASHKV_ALWAYS_INLINE void pv_row_visible(const float* __restrict p, int cols, const float* __restrict v, int dv,
                                          float* __restrict o, int64_t first, int64_t last,
                                          const float* __restrict zeros) {
  auto row = [&](int j) { return j >= first && j < last ? v + static_cast<int64_t>(j) * dv : zeros; };
  int j = 0;
  for (; j + 4 <= cols; j += 4) {
    if (j + 4 <= first || j >= last) continue;  // the whole group is masked: p = 0 and nothing is added
    const float p0 = p[j], p1 = p[j + 1], p2 = p[j + 2], p3 = p[j + 3];
    const float* v0 = row(j);
    const float* v1 = row(j + 1);
    const float* v2 = row(j + 2);
    const float* v3 = row(j + 3);
    for (int c = 0; c < dv; ++c) o[c] += p0 * v0[c] + p1 * v1[c] + p2 * v2[c] + p3 * v3[c];
  }
  for (; j < cols; ++j) {
    if (j < first || j >= last) continue;
    const float pj = p[j];
    const float* vj = v + static_cast<int64_t>(j) * dv;
    for (int c = 0; c < dv; ++c) o[c] += pj * vj[c];
  }
}

/// O[i][0..dv) += Σ_{j < cols} P[i][j] · V[j][0..dv) for i < rows (P is [rows][kBlockN], V [cols][dv], O [rows][dv]).
/// Two output rows × four keys per pass: each V element loaded once feeds two FMAs.
FLASHKV_ALWAYS_INLINE void pv_tile(const float* __restrict p, int rows, int cols, const float* __restrict v, int dv,
                                   float* __restrict o) {
  int i = 0;
  for (; i + 2 <= rows; i += 2) {
    const float* pa = p + static_cast<int64_t>(i) * kBlockN;
    const float* pb = pa + kBlockN;
    float* oa = o + static_cast<int64_t>(i) * dv;
    float* ob = oa + dv;
    int j = 0;
    for (; j + 4 <= cols; j += 4) {
      const float a0 = pa[j], a1 = pa[j + 1], a2 = pa[j + 2], a3 = pa[j + 3];
      const float b0 = pb[j], b1 = pb[j + 1], b2 = pb[j + 2], b3 = pb[j + 3];
      const float* v0 = v + static_cast<int64_t>(j) * dv;
      const float* v1 = v0 + dv;
      const float* v2 = v1 + dv;
      const float* v3 = v2 + dv;
      for (int c = 0; c < dv; ++c) {
        oa[c] += a0 * v0[c] + a1 * v1[c] + a2 * v2[c] + a3 * v3[c];
        ob[c] += b0 * v0[c] + b1 * v1[c] + b2 * v2[c] + b3 * v3[c];
      }
    }
    for (; j < cols; ++j) {
      const float a = pa[j], b = pb[j];
      const float* vj = v + static_cast<int64_t>(j) * dv;
      for (int c = 0; c < dv; ++c) {
        oa[c] += a * vj[c];
        ob[c] += b * vj[c];
      }
    }
  }
  for (; i < rows; ++i) pv_row(p + static_cast<int64_t>(i) * kBlockN, cols, v, dv, o + static_cast<int64_t>(i) * dv);
}

}  // namespace flashkv::cpu
