// Host side of the FP8 (float8_e4m3fn) attention tests: an e4m3 codec built from the format's definition (OCP FP8
// E4M3 "fn": bias 7, 3 mantissa bits, subnormals, no infinities, S.1111.111 = NaN, max 448), amax quantization per
// tensor or per (batch, kv head), a Walsh-Hadamard rotation (incoherent processing, FA3 §3.3), and the "naive
// same-precision" FP8 attention of the tolerance rule. Independent of the library's conversion code.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "core/float16.hpp"

namespace flashkv::cudatest::fp8 {

/// Value of e4m3 code c (NaN for 0x7F / 0xFF).
inline double e4m3_value(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}
/// Nearest e4m3 code to x (ties to the even code), saturating to +-448 (cvt.rn.satfinite); NaN -> 0x7F.
inline uint8_t e4m3_code(double x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(x);
  // Positive codes 0x00 .. 0x7E are increasing in value.
  int lo = 0, hi = 0x7E;
  if (a >= e4m3_value(0x7E)) return sign | 0x7E;
  while (hi - lo > 1) {  // e4m3_value(lo) <= a < e4m3_value(hi)
    const int mid = (lo + hi) / 2;
    (e4m3_value(static_cast<uint8_t>(mid)) <= a ? lo : hi) = mid;
  }
  const double dlo = a - e4m3_value(static_cast<uint8_t>(lo)), dhi = e4m3_value(static_cast<uint8_t>(hi)) - a;
  const int c = dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
  return static_cast<uint8_t>(sign | c);
}
inline double round_e4m3(double x) { return e4m3_value(e4m3_code(x)); }

/// A quantized [rows, heads, d] tensor of a (packed) batch: codes for the device, per-(b, hk) descales (float32), and
/// the dequantized values code * descale (what the kernel computes on: the reference's inputs).
struct Quantized {
  std::vector<uint8_t> codes;
  std::vector<float> descale;  ///< [batch, num_heads_kv] (per tensor: one value)
  std::vector<double> deq;
};
/// x: [total_rows, heads, d] values; rows [cu[b], cu[b+1]) belong to sequence b; head h uses kv head h / group.
/// per_head: one scale per (b, kv head) (amax / 448 over its rows and heads), else one per tensor.
inline Quantized quantize(const std::vector<double>& x, const std::vector<int32_t>& cu, int heads, int group, int d,
                          bool per_head) {
  const int batch = static_cast<int>(cu.size()) - 1, hkv = heads / group;
  Quantized q;
  q.descale.assign(per_head ? static_cast<size_t>(batch) * hkv : 1, 0.f);
  std::vector<double> amax(q.descale.size(), 0.0);
  auto slot = [&](int b, int h) { return per_head ? static_cast<size_t>(b) * hkv + h / group : size_t{0}; };
  for (int b = 0; b < batch; ++b)
    for (int r = cu[b]; r < cu[b + 1]; ++r)
      for (int h = 0; h < heads; ++h)
        for (int c = 0; c < d; ++c) {
          const double v = std::fabs(x[(static_cast<size_t>(r) * heads + h) * d + c]);
          if (std::isfinite(v)) amax[slot(b, h)] = std::max(amax[slot(b, h)], v);
        }
  for (size_t i = 0; i < amax.size(); ++i) q.descale[i] = amax[i] > 0 ? static_cast<float>(amax[i] / 448.0) : 1.f;
  q.codes.resize(x.size());
  q.deq.resize(x.size());
  for (int b = 0; b < batch; ++b)
    for (int r = cu[b]; r < cu[b + 1]; ++r)
      for (int h = 0; h < heads; ++h)
        for (int c = 0; c < d; ++c) {
          const size_t i = (static_cast<size_t>(r) * heads + h) * d + c;
          const double s = q.descale[slot(b, h)];
          q.codes[i] = e4m3_code(x[i] / s);
          q.deq[i] = e4m3_value(q.codes[i]) * s;
        }
  return q;
}

/// In-place orthonormal Walsh-Hadamard transform of every length-d row (d a power of two), after multiplying by the
/// random signs `sign` (the M = H diag(sign) / sqrt(d) of FA3 §3.3: Q M (K M)^T = Q K^T, outliers spread over d).
inline void hadamard_rows(std::vector<double>& x, int d, const std::vector<double>& sign) {
  const double norm = 1.0 / std::sqrt(static_cast<double>(d));
  for (size_t r = 0; r * d < x.size(); ++r) {
    double* v = &x[r * d];
    for (int c = 0; c < d; ++c) v[c] *= sign[c];
    for (int len = 1; len < d; len *= 2)
      for (int i = 0; i < d; i += 2 * len)
        for (int j = i; j < i + len; ++j) {
          const double a = v[j], b = v[j + len];
          v[j] = a + b;
          v[j + len] = a - b;
        }
    for (int c = 0; c < d; ++c) v[c] *= norm;
  }
}

// ---- the naive same-precision FP8 attention (the tolerance rule's baseline) ---------------------------------------

/// An e4m3 x e4m3 -> float32 product in cuBLASLt's FP8 "TN" form (A transposed, B not; column-major D = Aᵀ B with A
/// k x m, lda = k; B k x n, ldb = k; D m x n, ldd = m), i.e. row-major with both operands K-major: codes a [m][k],
/// b [n][k], float32 d [n][m] with
///   d[j * m + i] = sum_l a[i * k + l] * b[j * k + l].
/// m, n, k are multiples of 16 (pack_kmajor pads with zero codes, which add exact zeros to every dot product).
/// On the GPU it is the device's FP8 tensor-core GEMM (fp8_gemm_cublaslt.hpp); gemm_exact is the host emulation with
/// exact sums (the layout check; also what the baseline was before run6: exact float32 accumulation).
using Fp8Gemm = std::function<void(const uint8_t* a, const uint8_t* b, int m, int n, int k, float* d)>;

inline int pad16(int n) { return (n + 15) / 16 * 16; }

/// rows x cols codes, element (r, c) at src[r * row_stride + c * col_stride], as a zero-padded K-major
/// [pad16(rows)][pad16(cols)] block (row r, column c at r * pad16(cols) + c).
inline std::vector<uint8_t> pack_kmajor(const uint8_t* src, int rows, int cols, size_t row_stride, size_t col_stride) {
  const int ld = pad16(cols);
  std::vector<uint8_t> out(static_cast<size_t>(pad16(rows)) * ld, 0);  // code 0 = +0.0
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) out[static_cast<size_t>(r) * ld + c] = src[r * row_stride + c * col_stride];
  return out;
}

/// Fp8Gemm with exact sums: the host emulation of the layout. Every e4m3 product has <= 8 significant bits between
/// 2^-18 and 2^18, so float64 holds any sum of up to 2^16 of them exactly, in any order; d is that sum rounded once to
/// float32.
inline void gemm_exact(const uint8_t* a, const uint8_t* b, int m, int n, int k, float* d) {
  static const std::vector<double> value = [] {
    std::vector<double> t(256);
    for (int c = 0; c < 256; ++c) t[static_cast<size_t>(c)] = e4m3_value(static_cast<uint8_t>(c));
    return t;
  }();
  auto widen = [](const uint8_t* x, size_t count) {
    std::vector<double> w(count);
    for (size_t i = 0; i < count; ++i) w[i] = value[x[i]];
    return w;
  };
  const std::vector<double> av = widen(a, static_cast<size_t>(m) * k), bv = widen(b, static_cast<size_t>(n) * k);
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      const double* ai = &av[static_cast<size_t>(i) * k];
      const double* bj = &bv[static_cast<size_t>(j) * k];
      double acc[4] = {0, 0, 0, 0};  // k is a multiple of 16; exact in any order (above)
      for (int l = 0; l < k; l += 4)
        for (int u = 0; u < 4; ++u) acc[u] += ai[l + u] * bj[l + u];
      d[static_cast<size_t>(j) * m + i] = static_cast<float>((acc[0] + acc[1]) + (acc[2] + acc[3]));
    }
}

struct NaiveShape {
  std::vector<int32_t> cu_q, cu_k;
  int heads = 1, heads_kv = 1, d = 64;
  double softmax_scale = 1.0, softcap = 0.0;
  int window_left = -1, window_right = -1;  ///< causal = (-1, 0)
};
/// The naive same-precision FP8 attention (the tolerance rule's baseline), computed as the kernel's arithmetic is:
///   S = (q8 . k8) from `gemm` (on the GPU: the device's FP8 tensor-core GEMM, whose accumulation keeps ~13-14
///   mantissa bits on Hopper, DeepSeek-V3 §3.3.2 — the same MMA the kernel uses, so "same precision"), times
///   q_descale * k_descale * softmax_scale in float32, softcap, mask; softmax and lse in float32 (m, l = the float32
///   sum of the unrounded P); P = exp(s - m) * 2^8 rounded to e4m3 (FA3's FP8 P: an unscaled normalized P would flush
///   everything below 2^-9 to zero and make a useless baseline); out = (P8 . v8) from `gemm` * v_descale / 2^8 / l,
///   rounded once to bfloat16. One GEMM per (sequence, head) (descales are per (sequence, kv head) or per tensor; GQA:
///   head h reads kv head h / group). Inputs: the codes and descales of `quantize` (q [total_q, H, d], k/v
///   [total_k, Hkv, d]); out [total_q, H, d], lse [H, total_q] (-inf and out 0 for rows without a visible key).
inline void naive_fp8(const NaiveShape& s, const Quantized& q, const Quantized& k, const Quantized& v,
                      const Fp8Gemm& gemm, std::vector<double>& out, std::vector<double>& lse) {
  const int H = s.heads, Hkv = s.heads_kv, G = s.heads / s.heads_kv, d = s.d, dp = pad16(d);
  const int total_q = s.cu_q.back();
  out.assign(static_cast<size_t>(total_q) * H * d, 0.0);
  lse.assign(static_cast<size_t>(H) * total_q, -INFINITY);
  auto descale = [](const Quantized& t, size_t b, int hk, int hkv) {
    return t.descale.size() == 1 ? t.descale[0] : t.descale[b * hkv + static_cast<size_t>(hk)];
  };
  std::vector<float> sc, p, acc_s, acc_o;
  for (size_t b = 0; b + 1 < s.cu_q.size(); ++b) {
    const int q0 = s.cu_q[b], sq = s.cu_q[b + 1] - q0, k0 = s.cu_k[b], sk = s.cu_k[b + 1] - k0;
    if (sq == 0 || sk == 0) continue;  // no key: out 0, lse -inf
    const int sqp = pad16(sq), skp = pad16(sk);
    for (int h = 0; h < H; ++h) {
      const int hk = h / G;
      const float qk_descale = descale(q, b, hk, Hkv) * descale(k, b, hk, Hkv), v_descale = descale(v, b, hk, Hkv);
      // S: a = K rows [sk][d] (m = sk), b = Q rows [sq][d] (n = sq), k = d -> acc_s[i * skp + j] = q_i . k_j.
      const auto qh = pack_kmajor(&q.codes[(static_cast<size_t>(q0) * H + h) * d], sq, d, static_cast<size_t>(H) * d, 1);
      const auto kh = pack_kmajor(&k.codes[(static_cast<size_t>(k0) * Hkv + hk) * d], sk, d, static_cast<size_t>(Hkv) * d, 1);
      acc_s.assign(static_cast<size_t>(sqp) * skp, 0.f);
      gemm(kh.data(), qh.data(), skp, sqp, dp, acc_s.data());
      std::vector<uint8_t> p8(static_cast<size_t>(sqp) * skp, 0);  // [sq][sk] P codes, 0 where masked or padded
      std::vector<float> l_row(static_cast<size_t>(sq), 0.f);
      for (int i = 0; i < sq; ++i) {
        const int diag = i + sk - sq;
        sc.assign(static_cast<size_t>(sk), -INFINITY);
        float m = -INFINITY;
        for (int j = 0; j < sk; ++j) {
          if (s.window_left >= 0 && j < diag - s.window_left) continue;
          if (s.window_right >= 0 && j > diag + s.window_right) continue;
          float x = acc_s[static_cast<size_t>(i) * skp + j] * qk_descale * static_cast<float>(s.softmax_scale);
          if (s.softcap > 0) x = static_cast<float>(s.softcap) * std::tanh(x / static_cast<float>(s.softcap));
          sc[static_cast<size_t>(j)] = x;
          m = std::max(m, x);
        }
        if (m == -INFINITY) continue;  // no visible key: out 0, lse -inf
        float l = 0.f;
        for (int j = 0; j < sk; ++j) {
          const float pj = std::exp(sc[static_cast<size_t>(j)] - m);
          l += pj;
          p8[static_cast<size_t>(i) * skp + j] = e4m3_code(pj * 256.0);
        }
        l_row[static_cast<size_t>(i)] = l;
        lse[static_cast<size_t>(h) * total_q + q0 + i] = static_cast<double>(m) + std::log(static_cast<double>(l));
      }
      // P V: a = Vᵀ [d][sk] (m = d), b = P8 [sq][sk] (n = sq), k = sk -> acc_o[i * dp + c] = sum_j p_ij v_jc.
      const auto vt = pack_kmajor(&v.codes[(static_cast<size_t>(k0) * Hkv + hk) * d], d, sk, 1, static_cast<size_t>(Hkv) * d);
      acc_o.assign(static_cast<size_t>(sqp) * dp, 0.f);
      gemm(vt.data(), p8.data(), dp, sqp, skp, acc_o.data());
      for (int i = 0; i < sq; ++i) {
        const float l = l_row[static_cast<size_t>(i)];
        if (l == 0.f) continue;
        for (int c = 0; c < d; ++c)
          out[(static_cast<size_t>(q0 + i) * H + h) * d + c] =
              bf16_to_float(float_to_bf16(acc_o[static_cast<size_t>(i) * dp + c] * v_descale / 256.f / l));
      }
    }
  }
}

}  // namespace flashkv::cudatest::fp8
