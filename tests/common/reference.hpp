// flashkv test support (header-only, shared by every layer's tests):
//   * test_seed():   one seed per process, printed once, overridable with FLASHKV_TEST_SEED=<n>;
//   * HostTensor:    a host buffer in float32/float16/bfloat16/float64/int32 with a (possibly padded, i.e.
//                    non-contiguous) TensorView, filled with random normal values that are exactly representable in
//                    its dtype, readable back as float64;
//   * reference_mask / reference_forward / reference_backward: naive attention in float64 built from the definitions
//     in include/flashkv/attention.hpp, with an explicit boolean mask — deliberately independent of src/core/mask.hpp;
//     reference_forward_varlen / reference_backward_varlen apply them per sequence of a packed (cu_seqlens) batch;
//   * a rounding hook so the same code yields the "naive computation in low precision" baseline of the tolerance rule
//     (inputs, S, P, output and gradients rounded to float16/bfloat16 like a PyTorch reference without upcasting).
// Layouts: fixed-length bshd, contiguous float64 vectors: q [B, Sq, H, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv],
// out/dout [B, Sq, H, Dv], lse [B, H, Sq].
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/float16.hpp"
#include "flashkv/types.hpp"

namespace flashkv::testing {

// ---- seeds ----------------------------------------------------------------------------------------------------------

/// The process-wide test seed: FLASHKV_TEST_SEED if set, else a fresh random one. Printed once to stderr.
inline uint64_t test_seed() {
  static const uint64_t seed = [] {
    uint64_t s = 0;
    if (const char* env = std::getenv("FLASHKV_TEST_SEED"); env != nullptr && *env != '\0') {
      s = std::strtoull(env, nullptr, 10);
    } else {
      s = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
    }
    std::fprintf(stderr, "[flashkv-test] seed = %llu (reproduce with FLASHKV_TEST_SEED=%llu)\n",
                 static_cast<unsigned long long>(s), static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

/// A generator for one test: the process seed mixed with a per-test salt (so tests are independent of order).
inline std::mt19937_64 make_rng(uint64_t salt) {
  std::seed_seq seq{static_cast<uint32_t>(test_seed()), static_cast<uint32_t>(test_seed() >> 32),
                    static_cast<uint32_t>(salt), static_cast<uint32_t>(salt >> 32)};
  return std::mt19937_64(seq);
}

/// True when FLASHKV_FULL_TESTS=1 (run the complete grids).
inline bool full_tests() {
  const char* env = std::getenv("FLASHKV_FULL_TESTS");
  return env != nullptr && std::string(env) == "1";
}

// ---- dtype rounding ---------------------------------------------------------------------------------------------------

/// Rounds x to the nearest value representable in `t` (float32/float16/bfloat16; float64 unchanged).
inline double round_to(DType t, double x) {
  switch (t) {
    case DType::float32: return static_cast<double>(static_cast<float>(x));
    case DType::float16: return fp16_to_float(float_to_fp16(static_cast<float>(x)));
    case DType::bfloat16: return bf16_to_float(float_to_bf16(static_cast<float>(x)));
    default: return x;
  }
}

// ---- host tensors ---------------------------------------------------------------------------------------------------

/// Owning host buffer + TensorView. `pad_last` extra elements per row of the last dimension make every other stride
/// non-contiguous (the view stays "last dimension contiguous", as the attention API requires).
struct HostTensor {
  std::vector<unsigned char> bytes;
  TensorView view;

  HostTensor() = default;
  HostTensor(DType dtype, std::vector<int64_t> shape, int64_t pad_last = 0) {
    view.dtype = dtype;
    view.ndim = static_cast<int32_t>(shape.size());
    int64_t stride = 1;
    for (int d = view.ndim - 1; d >= 0; --d) {
      view.shape[d] = shape[d];
      view.strides[d] = stride;
      stride *= (d == view.ndim - 1) ? shape[d] + pad_last : shape[d];
    }
    bytes.assign(static_cast<std::size_t>(std::max<int64_t>(stride, 1)) * dtype_size(dtype), 0);
    view.data = bytes.data();
  }
  HostTensor(const HostTensor& o) : bytes(o.bytes), view(o.view) { view.data = bytes.data(); }
  HostTensor& operator=(const HostTensor& o) {
    bytes = o.bytes;
    view = o.view;
    view.data = bytes.data();
    return *this;
  }

  int64_t numel() const { return view.numel(); }

  /// Element offset of logical (row-major) index `flat`.
  int64_t offset_of(int64_t flat) const {
    int64_t off = 0;
    for (int d = view.ndim - 1; d >= 0; --d) {
      off += (flat % view.shape[d]) * view.strides[d];
      flat /= view.shape[d];
    }
    return off;
  }
  double get(int64_t flat) const {
    const int64_t o = offset_of(flat);
    const unsigned char* p = bytes.data();
    switch (view.dtype) {
      case DType::float32: { float f; std::memcpy(&f, p + o * 4, 4); return f; }
      case DType::float16: { uint16_t h; std::memcpy(&h, p + o * 2, 2); return fp16_to_float(h); }
      case DType::bfloat16: { uint16_t h; std::memcpy(&h, p + o * 2, 2); return bf16_to_float(h); }
      case DType::float64: { double x; std::memcpy(&x, p + o * 8, 8); return x; }
      case DType::int32: { int32_t i; std::memcpy(&i, p + o * 4, 4); return i; }
      default: return 0.0;
    }
  }
  /// Stores x rounded to the dtype.
  void set(int64_t flat, double x) {
    const int64_t o = offset_of(flat);
    unsigned char* p = bytes.data();
    switch (view.dtype) {
      case DType::float32: { float f = static_cast<float>(x); std::memcpy(p + o * 4, &f, 4); break; }
      case DType::float16: { uint16_t h = float_to_fp16(static_cast<float>(x)); std::memcpy(p + o * 2, &h, 2); break; }
      case DType::bfloat16: { uint16_t h = float_to_bf16(static_cast<float>(x)); std::memcpy(p + o * 2, &h, 2); break; }
      case DType::float64: std::memcpy(p + o * 8, &x, 8); break;
      case DType::int32: { int32_t i = static_cast<int32_t>(x); std::memcpy(p + o * 4, &i, 4); break; }
      default: break;
    }
  }
  /// Logical contents as float64 (row-major, padding dropped).
  std::vector<double> to_double() const {
    std::vector<double> out(static_cast<std::size_t>(numel()));
    for (int64_t i = 0; i < numel(); ++i) out[i] = get(i);
    return out;
  }
  /// Fills with `value` everywhere (padding included) — e.g. NaN sentinels to catch unwritten outputs.
  void fill(double value) {
    for (int64_t i = 0; i < numel(); ++i) set(i, value);
  }
  /// Fills with N(mean, stddev) values rounded to the dtype, re-drawing exact zeros (tests never use zeros).
  void randn(std::mt19937_64& rng, double stddev = 1.0, double mean = 0.0) {
    std::normal_distribution<double> dist(mean, stddev);
    for (int64_t i = 0; i < numel(); ++i) {
      double x = 0.0;
      while (round_to(view.dtype, x) == 0.0) x = dist(rng);
      set(i, x);
    }
  }
};

/// Contiguous int32 tensor [values.size()] (cu_seqlens).
inline HostTensor int32_tensor(const std::vector<int32_t>& values) {
  HostTensor t(DType::int32, {static_cast<int64_t>(values.size())});
  for (std::size_t i = 0; i < values.size(); ++i) t.set(static_cast<int64_t>(i), values[i]);
  return t;
}

// ---- float64 reference attention ------------------------------------------------------------------------------------

struct RefShape {
  int64_t batch = 1, seqlen_q = 1, seqlen_k = 1, num_heads = 1, num_heads_kv = 1, head_dim = 1, head_dim_v = 1;
};

struct RefOptions {
  double softmax_scale = 1.0;
  bool causal = false;
  int64_t window_size_left = -1;   ///< −1 = unbounded
  int64_t window_size_right = -1;  ///< −1 = unbounded
  double softcap = 0.0;            ///< 0 = off
};

/// Explicit boolean mask [seqlen_q × seqlen_k] from the definition (bottom-right aligned causal and window).
inline std::vector<char> reference_mask(int64_t seqlen_q, int64_t seqlen_k, const RefOptions& o) {
  std::vector<char> m(static_cast<std::size_t>(seqlen_q * seqlen_k), 0);
  for (int64_t i = 0; i < seqlen_q; ++i) {
    for (int64_t j = 0; j < seqlen_k; ++j) {
      const int64_t diag = i + seqlen_k - seqlen_q;  // the key aligned with query i
      bool ok = true;
      if (o.causal && j > diag) ok = false;
      if (o.window_size_left >= 0 && j < diag - o.window_size_left) ok = false;
      if (o.window_size_right >= 0 && j > diag + o.window_size_right) ok = false;
      m[static_cast<std::size_t>(i * seqlen_k + j)] = ok ? 1 : 0;
    }
  }
  return m;
}

/// Rounding applied to intermediates: none for the float64 reference; for the low-precision naive baseline every
/// stored intermediate (S, P, out, dP, dS, gradients) is rounded to `dtype` and every matmul accumulates in float32 —
/// what a PyTorch implementation without upcasting does.
struct Rounder {
  DType dtype = DType::float64;  ///< float64 = no rounding
  /// Order of the score dot products' float32 sums: 0 = channels ascending, 1 = descending, 2 = fused multiply-add
  /// steps (one rounding per step, as a vectorizing compiler emits). With huge logits the accumulation dominates the
  /// baseline's error, so tests that need it take the worst of these equally naive orders.
  int dot_order = 0;
  double operator()(double x) const { return round_to(dtype, x); }
  bool active() const { return dtype != DType::float64; }
  /// acc + x, accumulated in float32 when active (matmul inner sums), exactly otherwise.
  double accumulate(double acc, double x) const {
    return active() ? static_cast<double>(static_cast<float>(acc) + static_cast<float>(x)) : acc + x;
  }
};
inline Rounder no_rounding() { return Rounder{DType::float64}; }
inline Rounder rounding_to(DType t) { return Rounder{t}; }

namespace detail {
/// Scores of query (b, i, h) against every key (after scale, softcap, mask; masked = −inf), and the capped
/// pre-mask values t (for the softcap gradient).
inline void ref_scores(const RefShape& s, const RefOptions& o, const std::vector<double>& q,
                       const std::vector<double>& k, const std::vector<char>& mask, int64_t b, int64_t i, int64_t h,
                       const Rounder& rnd, std::vector<double>& scores) {
  const int64_t hk = h / (s.num_heads / s.num_heads_kv);
  scores.assign(static_cast<std::size_t>(s.seqlen_k), -std::numeric_limits<double>::infinity());
  const double* qi = &q[static_cast<std::size_t>(((b * s.seqlen_q + i) * s.num_heads + h) * s.head_dim)];
  for (int64_t j = 0; j < s.seqlen_k; ++j) {
    const double* kj = &k[static_cast<std::size_t>(((b * s.seqlen_k + j) * s.num_heads_kv + hk) * s.head_dim)];
    double dot = 0.0;
    for (int64_t n = 0; n < s.head_dim; ++n) {
      const int64_t c = rnd.dot_order == 1 ? s.head_dim - 1 - n : n;
      if (rnd.dot_order == 2 && rnd.active()) {
        dot = static_cast<double>(
            std::fma(static_cast<float>(qi[c]), static_cast<float>(kj[c]), static_cast<float>(dot)));
      } else {
        dot = rnd.accumulate(dot, qi[c] * kj[c]);
      }
    }
    double t = rnd(rnd(dot) * o.softmax_scale);
    if (o.softcap > 0.0) t = rnd(o.softcap * std::tanh(t / o.softcap));
    if (mask[static_cast<std::size_t>(i * s.seqlen_k + j)]) scores[static_cast<std::size_t>(j)] = t;
  }
}
}  // namespace detail

/// out = softmax(mask(softcap(q·kᵀ·scale)))·v and lse (natural log; −inf and out = 0 for rows with no visible key).
inline void reference_forward(const RefShape& s, const RefOptions& o, const std::vector<double>& q,
                              const std::vector<double>& k, const std::vector<double>& v, std::vector<double>& out,
                              std::vector<double>& lse, const Rounder& rnd = no_rounding()) {
  const std::vector<char> mask = reference_mask(s.seqlen_q, s.seqlen_k, o);
  out.assign(static_cast<std::size_t>(s.batch * s.seqlen_q * s.num_heads * s.head_dim_v), 0.0);
  lse.assign(static_cast<std::size_t>(s.batch * s.num_heads * s.seqlen_q), 0.0);
  std::vector<double> sc;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.num_heads; ++h) {
      const int64_t hk = h / (s.num_heads / s.num_heads_kv);
      for (int64_t i = 0; i < s.seqlen_q; ++i) {
        detail::ref_scores(s, o, q, k, mask, b, i, h, rnd, sc);
        double m = -std::numeric_limits<double>::infinity();
        for (double x : sc) m = std::max(m, x);
        double* oi = &out[static_cast<std::size_t>(((b * s.seqlen_q + i) * s.num_heads + h) * s.head_dim_v)];
        double& l_out = lse[static_cast<std::size_t>((b * s.num_heads + h) * s.seqlen_q + i)];
        if (m == -std::numeric_limits<double>::infinity()) {
          l_out = m;
          continue;
        }
        double l = 0.0;
        for (double x : sc) l += std::exp(x - m);
        l_out = m + std::log(l);
        std::vector<double> acc(static_cast<std::size_t>(s.head_dim_v), 0.0);
        for (int64_t j = 0; j < s.seqlen_k; ++j) {
          const double p = rnd(std::exp(sc[static_cast<std::size_t>(j)] - m) / l);
          if (p == 0.0) continue;
          const double* vj = &v[static_cast<std::size_t>(((b * s.seqlen_k + j) * s.num_heads_kv + hk) * s.head_dim_v)];
          for (int64_t c = 0; c < s.head_dim_v; ++c) {
            acc[static_cast<std::size_t>(c)] = rnd.accumulate(acc[static_cast<std::size_t>(c)], p * vj[c]);
          }
        }
        for (int64_t c = 0; c < s.head_dim_v; ++c) oi[c] = rnd(acc[static_cast<std::size_t>(c)]);
      }
    }
  }
}

/// Gradients of L = Σ out∘dout with respect to q, k, v (same shapes as q, k, v). Uses D = Σ_j P∘dP (mathematically
/// rowsum(dout∘out)), dS = P∘(dP − D), the softcap derivative 1 − tanh², and sums over the GQA group for dk/dv.
inline void reference_backward(const RefShape& s, const RefOptions& o, const std::vector<double>& q,
                               const std::vector<double>& k, const std::vector<double>& v,
                               const std::vector<double>& dout, std::vector<double>& dq, std::vector<double>& dk,
                               std::vector<double>& dv, const Rounder& rnd = no_rounding()) {
  const std::vector<char> mask = reference_mask(s.seqlen_q, s.seqlen_k, o);
  dq.assign(q.size(), 0.0);
  dk.assign(k.size(), 0.0);
  dv.assign(v.size(), 0.0);
  std::vector<double> sc, p, dp;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.num_heads; ++h) {
      const int64_t hk = h / (s.num_heads / s.num_heads_kv);
      for (int64_t i = 0; i < s.seqlen_q; ++i) {
        detail::ref_scores(s, o, q, k, mask, b, i, h, rnd, sc);
        double m = -std::numeric_limits<double>::infinity();
        for (double x : sc) m = std::max(m, x);
        if (m == -std::numeric_limits<double>::infinity()) continue;  // no visible key: zero gradients
        double l = 0.0;
        for (double x : sc) l += std::exp(x - m);
        const std::size_t qoff = static_cast<std::size_t>(((b * s.seqlen_q + i) * s.num_heads + h) * s.head_dim);
        const double* gi = &dout[static_cast<std::size_t>(((b * s.seqlen_q + i) * s.num_heads + h) * s.head_dim_v)];
        p.assign(static_cast<std::size_t>(s.seqlen_k), 0.0);
        dp.assign(static_cast<std::size_t>(s.seqlen_k), 0.0);
        double dsum = 0.0;
        for (int64_t j = 0; j < s.seqlen_k; ++j) {
          const std::size_t jj = static_cast<std::size_t>(j);
          p[jj] = rnd(std::exp(sc[jj] - m) / l);
          const double* vj = &v[static_cast<std::size_t>(((b * s.seqlen_k + j) * s.num_heads_kv + hk) * s.head_dim_v)];
          double x = 0.0;
          for (int64_t c = 0; c < s.head_dim_v; ++c) x = rnd.accumulate(x, gi[c] * vj[c]);
          dp[jj] = rnd(x);
          dsum += p[jj] * dp[jj];
        }
        dsum = rnd(dsum);
        for (int64_t j = 0; j < s.seqlen_k; ++j) {
          const std::size_t jj = static_cast<std::size_t>(j);
          if (p[jj] == 0.0) continue;
          double ds = rnd(p[jj] * (dp[jj] - dsum));
          if (o.softcap > 0.0) {
            const double th = sc[jj] / o.softcap;
            ds = rnd(ds * (1.0 - th * th));
          }
          const std::size_t koff = static_cast<std::size_t>(((b * s.seqlen_k + j) * s.num_heads_kv + hk) * s.head_dim);
          const std::size_t voff =
              static_cast<std::size_t>(((b * s.seqlen_k + j) * s.num_heads_kv + hk) * s.head_dim_v);
          for (int64_t c = 0; c < s.head_dim; ++c) {
            dq[qoff + c] += ds * o.softmax_scale * k[koff + c];
            dk[koff + c] += ds * o.softmax_scale * q[qoff + c];
          }
          for (int64_t c = 0; c < s.head_dim_v; ++c) dv[voff + c] += p[jj] * gi[c];
        }
      }
    }
  }
  for (double& x : dq) x = rnd(x);
  for (double& x : dk) x = rnd(x);
  for (double& x : dv) x = rnd(x);
}

// ---- varlen (packed) float64 reference ------------------------------------------------------------------------------

/// A batch of independent sequences packed along the row dimension, as the varlen API takes them: sequence b owns rows
/// [cu_seqlens_q[b], cu_seqlens_q[b+1]) of q/out/dout and rows [cu_seqlens_k[b], cu_seqlens_k[b+1]) of k/v; empty
/// sequences allowed. Layouts: q [total_q, H, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv], out/dout [total_q, H, Dv],
/// lse [H, total_q]. Fixed-length bshd tensors [B, S, H, D] are the special case cu = {0, S, 2S, ...}
/// (uniform_cu_seqlens), with lse in [H, B·S] order instead of [B, H, S].
struct RefVarlenShape {
  std::vector<int64_t> cu_seqlens_q, cu_seqlens_k;  ///< [batch + 1], 0 first, non-decreasing
  int64_t num_heads = 1, num_heads_kv = 1, head_dim = 1, head_dim_v = 1;
  int64_t batch() const { return cu_seqlens_q.empty() ? 0 : static_cast<int64_t>(cu_seqlens_q.size()) - 1; }
  int64_t total_q() const { return cu_seqlens_q.empty() ? 0 : cu_seqlens_q.back(); }
  int64_t total_k() const { return cu_seqlens_k.empty() ? 0 : cu_seqlens_k.back(); }
};

/// {0, seqlen, 2·seqlen, ..., batch·seqlen}.
inline std::vector<int64_t> uniform_cu_seqlens(int64_t batch, int64_t seqlen) {
  std::vector<int64_t> cu(static_cast<std::size_t>(batch + 1));
  for (int64_t b = 0; b <= batch; ++b) cu[static_cast<std::size_t>(b)] = b * seqlen;
  return cu;
}

namespace detail {
/// Rows [row0, row0 + rows) of a packed [rows, row_len] vector.
inline std::vector<double> ref_rows(const std::vector<double>& x, int64_t row0, int64_t rows, int64_t row_len) {
  return std::vector<double>(x.begin() + row0 * row_len, x.begin() + (row0 + rows) * row_len);
}
}  // namespace detail

/// reference_forward applied to each sequence of a packed batch (masks are per sequence, bottom-right aligned).
inline void reference_forward_varlen(const RefVarlenShape& s, const RefOptions& o, const std::vector<double>& q,
                                     const std::vector<double>& k, const std::vector<double>& v,
                                     std::vector<double>& out, std::vector<double>& lse,
                                     const Rounder& rnd = no_rounding()) {
  const int64_t h = s.num_heads, hk = s.num_heads_kv, d = s.head_dim, dv = s.head_dim_v, tq = s.total_q();
  out.assign(static_cast<std::size_t>(tq * h * dv), 0.0);
  lse.assign(static_cast<std::size_t>(h * tq), 0.0);
  std::vector<double> o1, l1;
  for (int64_t b = 0; b < s.batch(); ++b) {
    const int64_t q0 = s.cu_seqlens_q[b], lq = s.cu_seqlens_q[b + 1] - q0;
    const int64_t k0 = s.cu_seqlens_k[b], lk = s.cu_seqlens_k[b + 1] - k0;
    if (lq == 0) continue;
    const RefShape one{1, lq, lk, h, hk, d, dv};
    reference_forward(one, o, detail::ref_rows(q, q0, lq, h * d), detail::ref_rows(k, k0, lk, hk * d),
                      detail::ref_rows(v, k0, lk, hk * dv), o1, l1, rnd);
    std::copy(o1.begin(), o1.end(), out.begin() + q0 * h * dv);
    for (int64_t hh = 0; hh < h; ++hh) {
      for (int64_t i = 0; i < lq; ++i) lse[static_cast<std::size_t>(hh * tq + q0 + i)] = l1[hh * lq + i];
    }
  }
}

/// reference_backward applied to each sequence of a packed batch: dq/dk/dv in the layouts of q/k/v (dk/dv of keys
/// that no query sees are 0).
inline void reference_backward_varlen(const RefVarlenShape& s, const RefOptions& o, const std::vector<double>& q,
                                      const std::vector<double>& k, const std::vector<double>& v,
                                      const std::vector<double>& dout, std::vector<double>& dq,
                                      std::vector<double>& dk, std::vector<double>& dv,
                                      const Rounder& rnd = no_rounding()) {
  const int64_t h = s.num_heads, hk = s.num_heads_kv, d = s.head_dim, dvd = s.head_dim_v;
  dq.assign(q.size(), 0.0);
  dk.assign(k.size(), 0.0);
  dv.assign(v.size(), 0.0);
  std::vector<double> dq1, dk1, dv1;
  for (int64_t b = 0; b < s.batch(); ++b) {
    const int64_t q0 = s.cu_seqlens_q[b], lq = s.cu_seqlens_q[b + 1] - q0;
    const int64_t k0 = s.cu_seqlens_k[b], lk = s.cu_seqlens_k[b + 1] - k0;
    if (lq == 0 || lk == 0) continue;
    const RefShape one{1, lq, lk, h, hk, d, dvd};
    reference_backward(one, o, detail::ref_rows(q, q0, lq, h * d), detail::ref_rows(k, k0, lk, hk * d),
                       detail::ref_rows(v, k0, lk, hk * dvd), detail::ref_rows(dout, q0, lq, h * dvd), dq1, dk1,
                       dv1, rnd);
    std::copy(dq1.begin(), dq1.end(), dq.begin() + q0 * h * d);
    std::copy(dk1.begin(), dk1.end(), dk.begin() + k0 * hk * d);
    std::copy(dv1.begin(), dv1.end(), dv.begin() + k0 * hk * dvd);
  }
}

// ---- error measures -------------------------------------------------------------------------------------------------

/// max_i |a_i − b_i| over finite reference entries; a non-finite `a` where b is finite counts as infinite error.
inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double e = 0.0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!std::isfinite(b[i])) {
      if (a[i] != b[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    const double d = std::fabs(a[i] - b[i]);
    if (!(d <= e)) e = std::isnan(d) ? std::numeric_limits<double>::infinity() : d;
  }
  return e;
}

inline double max_abs(const std::vector<double>& a) {
  double m = 0.0;
  for (double x : a) {
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  }
  return m;
}

}  // namespace flashkv::testing
