// Host side of the FP8 (float8_e4m3fn) attention tests: an e4m3 codec built from the format's definition (OCP FP8
// E4M3 "fn": bias 7, 3 mantissa bits, subnormals, no infinities, S.1111.111 = NaN, max 448), amax quantization per
// tensor or per (batch, kv head), a Walsh-Hadamard rotation (incoherent processing, FA3 §3.3), and the "naive
// same-precision" FP8 attention of the tolerance rule. Independent of the library's conversion code.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
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

struct NaiveShape {
  std::vector<int32_t> cu_q, cu_k;
  int heads = 1, heads_kv = 1, d = 64;
  double softmax_scale = 1.0, softcap = 0.0;
  int window_left = -1, window_right = -1;  ///< causal = (-1, 0)
};
/// The naive same-precision FP8 attention (the tolerance rule's baseline): e4m3 inputs (the dequantized values, i.e.
/// code * descale), scores accumulated in float32, P = exp(s - m) * 2^8 rounded to e4m3 (FA3's FP8 P: an unscaled
/// normalized P would flush everything below 2^-9 to zero and make a useless baseline), P V accumulated in float32,
/// divided by the float32 sum of the unrounded P, rounded once to bfloat16. out [total_q, H, d], lse [H, total_q].
inline void naive_fp8(const NaiveShape& s, const std::vector<double>& q, const std::vector<double>& k,
                      const std::vector<double>& v, std::vector<double>& out, std::vector<double>& lse) {
  const int H = s.heads, G = s.heads / s.heads_kv, d = s.d;
  const int total_q = s.cu_q.back();
  out.assign(static_cast<size_t>(total_q) * H * d, 0.0);
  lse.assign(static_cast<size_t>(H) * total_q, -INFINITY);
  std::vector<float> sc, p;
  for (size_t b = 0; b + 1 < s.cu_q.size(); ++b) {
    const int q0 = s.cu_q[b], sq = s.cu_q[b + 1] - q0, k0 = s.cu_k[b], sk = s.cu_k[b + 1] - k0;
    for (int h = 0; h < H; ++h) {
      const int hk = h / G;
      for (int i = 0; i < sq; ++i) {
        const int diag = i + sk - sq;
        sc.assign(static_cast<size_t>(sk), -INFINITY);
        float m = -INFINITY;
        for (int j = 0; j < sk; ++j) {
          if (s.window_left >= 0 && j < diag - s.window_left) continue;
          if (s.window_right >= 0 && j > diag + s.window_right) continue;
          float dot = 0.f;
          for (int c = 0; c < d; ++c) {
            dot += static_cast<float>(q[(static_cast<size_t>(q0 + i) * H + h) * d + c]) *
                   static_cast<float>(k[(static_cast<size_t>(k0 + j) * s.heads_kv + hk) * d + c]);
          }
          float x = dot * static_cast<float>(s.softmax_scale);
          if (s.softcap > 0) x = static_cast<float>(s.softcap) * std::tanh(x / static_cast<float>(s.softcap));
          sc[static_cast<size_t>(j)] = x;
          m = std::max(m, x);
        }
        if (m == -INFINITY) continue;  // no visible key: out 0, lse -inf
        float l = 0.f;
        p.assign(static_cast<size_t>(sk), 0.f);
        for (int j = 0; j < sk; ++j) {
          const float pj = std::exp(sc[static_cast<size_t>(j)] - m);
          l += pj;
          p[static_cast<size_t>(j)] = static_cast<float>(round_e4m3(pj * 256.0));
        }
        lse[static_cast<size_t>(h) * total_q + q0 + i] = static_cast<double>(m) + std::log(static_cast<double>(l));
        for (int c = 0; c < d; ++c) {
          float acc = 0.f;
          for (int j = 0; j < sk; ++j) {
            if (p[static_cast<size_t>(j)] == 0.f) continue;
            acc += p[static_cast<size_t>(j)] * static_cast<float>(v[(static_cast<size_t>(k0 + j) * s.heads_kv + hk) * d + c]);
          }
          out[(static_cast<size_t>(q0 + i) * H + h) * d + c] = bf16_to_float(float_to_bf16(acc / 256.f / l));
        }
      }
    }
  }
}

}  // namespace flashkv::cudatest::fp8
