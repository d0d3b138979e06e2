// The naive same-precision quantization of a KV cache, for bounding the cache's quantization error: each half
// quantized to its format's grid in float64 straight from the definitions in include/flashkv/kvcache.hpp (the
// grammar and "TOKENS AND WINDOWS"), independent of the codec (src/kvcache/format/): exact float64 scale / min instead
// of fp16-rounded ones, round-to-nearest-even written out per format. Attention on these values is "the naive
// computation at the format's precision"; the cache's output error vs the unquantized K/V must stay within 2× its error
// (the rule of docs: low-precision error ≤ 2× the naive same-precision error). Rotation (QuaRot): the quantized
// tokens are rotated x' = H·D·x / sqrt(d) in float64 (an FWHT written here; D = `signs`, the cache's ±1 diagonal),
// quantized, and rotated back.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "flashkv/kvcache.hpp"

namespace kvtest {

/// x rounded to nearest-even with `mant` fraction bits, normal exponents >= emin (subnormal quantum 2^(emin − mant)).
inline double naive_round_float(double x, int mant, int emin) {
  if (x == 0.0) return 0.0;
  const int e = std::max(static_cast<int>(std::floor(std::log2(std::fabs(x)))), emin);
  const double quantum = std::ldexp(1.0, e - mant);
  return std::nearbyint(x / quantum) * quantum;  // x / quantum exact (power of two); default mode = ties to even
}
inline double naive_bf16(double x) { return naive_round_float(x, 7, -126); }
inline double naive_fp16(double x) { return naive_round_float(x, 10, -14); }
/// OCP fp8 E4M3FN (max 448) / E5M2 (max 57344), saturating.
inline double naive_fp8(double x, bool e4m3) {
  const double mx = e4m3 ? 448.0 : 57344.0;
  const double r = naive_round_float(x, e4m3 ? 3 : 2, e4m3 ? -6 : -14);
  return std::clamp(r, -mx, mx);
}
/// Asymmetric uniform quantization of the values at x[0], x[stride], ... (n of them) with 2^bits levels, in place.
inline void naive_affine(double* x, int64_t n, int64_t stride, int bits) {
  double mn = x[0], mx = x[0];
  for (int64_t i = 0; i < n; ++i) mn = std::min(mn, x[i * stride]), mx = std::max(mx, x[i * stride]);
  const double qmax = std::ldexp(1.0, bits) - 1, scale = (mx - mn) / qmax;
  for (int64_t i = 0; i < n; ++i) {
    double& v = x[i * stride];
    v = scale > 0 ? mn + scale * std::clamp(std::nearbyint((v - mn) / scale), 0.0, qmax) : mn;
  }
}

/// In place: x' = H·D·x / sqrt(n) (forward) or x = D·H·x' / sqrt(n) (inverse); n a power of two, H Walsh–Hadamard.
inline void naive_hadamard(double* x, int64_t n, const std::vector<float>& signs, bool inverse) {
  if (!inverse) {
    for (int64_t i = 0; i < n; ++i) x[i] *= signs[static_cast<size_t>(i)];
  }
  for (int64_t h = 1; h < n; h *= 2) {
    for (int64_t i = 0; i < n; i += 2 * h) {
      for (int64_t j = i; j < i + h; ++j) {
        const double a = x[j], b = x[j + h];
        x[j] = a + b, x[j + h] = a - b;
      }
    }
  }
  const double norm = 1.0 / std::sqrt(static_cast<double>(n));
  for (int64_t i = 0; i < n; ++i) x[i] *= norm * (inverse ? signs[static_cast<size_t>(i)] : 1.0);
}

/// One half [n][H][d] of a cache with config `cfg`, naively quantized (float64). `is_key` picks K's format / scales;
/// `signs`: the rotation's ±1 diagonal (needed when cfg.rotation is hadamard).
inline std::vector<double> naive_quantize_half(const flashkv::KVCacheConfig& cfg, bool is_key,
                                               const std::vector<float>& x, int64_t n,
                                               const std::vector<float>& signs = {}) {
  using flashkv::KVFormat;
  const flashkv::KVFormatSpec& f = is_key ? cfg.k_format : cfg.v_format;
  const int64_t H = cfg.num_heads_kv, d = cfg.head_dim, S = cfg.sink_tokens, R = cfg.residual_tokens;
  const bool kivi = cfg.k_format.is_kivi() || cfg.v_format.is_kivi();
  const int64_t G = [&] {
    const flashkv::KVFormatSpec& kf = cfg.k_format.is_kivi() ? cfg.k_format : cfg.v_format;
    return kf.group_size > 0 ? kf.group_size : 32;
  }();
  const int64_t Gq = kivi ? G : 1;
  const bool windows = S > 0 || R > 0 || Gq > 1;
  std::vector<double> y(x.begin(), x.end());
  if (windows) {
    for (double& v : y) v = naive_bf16(v);  // every appended value rounded to bf16 first
  }
  const int64_t s0 = std::min(n, S), nq = std::max<int64_t>(0, n - S - R) / Gq * Gq;
  auto at = [&](int64_t t, int64_t h) { return y.data() + (t * H + h) * d; };
  for (int64_t t = 0; t < n; ++t) {  // sinks and residual: bf16
    if (t < s0 || t >= S + nq) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t c = 0; c < d; ++c) at(t, h)[c] = naive_bf16(at(t, h)[c]);
      }
    }
  }
  const bool rotate = cfg.rotation == flashkv::KVRotation::hadamard && f.is_quantized();
  if (rotate && static_cast<int64_t>(signs.size()) != d) throw std::invalid_argument("naive_quantize_half: signs");
  if (rotate) {
    for (int64_t t = S; t < S + nq; ++t) {
      for (int64_t h = 0; h < H; ++h) naive_hadamard(at(t, h), d, signs, false);
    }
  }
  const std::vector<float>& scales = is_key ? cfg.k_scales : cfg.v_scales;
  for (int64_t h = 0; h < H; ++h) {
    const double static_scale = scales.empty() ? 1.0 : scales[scales.size() == 1 ? 0 : static_cast<size_t>(h)];
    if (f.is_kivi() && is_key) {  // per channel over each unit of G tokens
      for (int64_t u = S; u < S + nq; u += G) {
        for (int64_t c = 0; c < d; ++c) naive_affine(at(u, h) + c, G, H * d, f.code_bits());
      }
      continue;
    }
    for (int64_t t = S; t < S + nq; ++t) {
      double* row = at(t, h);
      switch (f.format) {
        case KVFormat::fp32: break;
        case KVFormat::bf16:
          for (int64_t c = 0; c < d; ++c) row[c] = naive_bf16(row[c]);
          break;
        case KVFormat::fp16:
          for (int64_t c = 0; c < d; ++c) row[c] = naive_fp16(row[c]);
          break;
        case KVFormat::fp8_e4m3:
        case KVFormat::fp8_e5m2: {
          const bool e4m3 = f.format == KVFormat::fp8_e4m3;
          double scale = static_scale;
          if (f.dynamic_scale) {
            double amax = 0;
            for (int64_t c = 0; c < d; ++c) amax = std::max(amax, std::fabs(row[c]));
            scale = amax / (e4m3 ? 448.0 : 57344.0);
          }
          for (int64_t c = 0; c < d; ++c) row[c] = scale > 0 ? naive_fp8(row[c] / scale, e4m3) * scale : 0.0;
          break;
        }
        default: {  // int8 / int4 per channel group, KIVI values per G channels
          const int64_t g = f.is_kivi() ? G : (f.group_size > 0 ? f.group_size : d);
          for (int64_t c = 0; c < d; c += g) naive_affine(row + c, g, 1, f.code_bits());
        }
      }
    }
  }
  if (rotate) {
    for (int64_t t = S; t < S + nq; ++t) {
      for (int64_t h = 0; h < H; ++h) naive_hadamard(at(t, h), d, signs, true);
    }
  }
  return y;
}

}  // namespace kvtest
