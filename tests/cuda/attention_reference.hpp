// Independent attention references for the CUDA tests, written from the definition with an explicit boolean mask:
//   ref_forward / ref_backward in float64, and the same computation with every intermediate rounded to the tensor
//   dtype ("naive same-precision" — FlashAttention's out_pt / dX_pt) that defines the tolerance: the kernel's max error
//   vs float64 must be <= 2x (forward) / 3x (backward) the naive computation's error (docs/engineering.md).
// Layout: packed rows. Element (row r, head h, c) of q is q[(r*H + h)*D + c] with r = cu_q[b] + i, so fixed-length
// [B, S, H, D] tensors are the special case cu = {0, S, 2S, ...}. lse is returned as [H][total_q].
#pragma once

#include <cmath>
#include <functional>
#include <vector>

namespace flashkv::cudatest {

struct RefProblem {
  int batch = 1, num_heads = 1, num_heads_kv = 1, head_dim = 64;
  std::vector<int> cu_q, cu_k;  ///< [batch + 1]
  double scale = 0.125;
  int window_left = -1, window_right = -1;  ///< causal = (−1, 0)
  double softcap = 0;
  int total_q() const { return cu_q.back(); }
  int total_k() const { return cu_k.back(); }
};

/// visible(i, j) straight from flashkv/attention.hpp (bottom-right aligned).
inline bool ref_visible(long i, long j, long sq, long sk, long wl, long wr) {
  const long shift = sk - sq;
  return (wl < 0 || j >= i + shift - wl) && (wr < 0 || j <= i + shift + wr);
}

/// Identity (float64 reference) or rounding to a 16-bit dtype (naive same-precision computation).
using RoundFn = std::function<double(double)>;

struct RefForward {
  std::vector<double> out;  ///< [total_q, H, D]
  std::vector<double> lse;  ///< [H, total_q], -inf for rows with no visible key
};

inline RefForward ref_forward(const RefProblem& p, const std::vector<double>& q, const std::vector<double>& k,
                              const std::vector<double>& v, const RoundFn& rnd) {
  const int H = p.num_heads, Hk = p.num_heads_kv, D = p.head_dim, G = H / Hk;
  RefForward r;
  r.out.assign(static_cast<size_t>(p.total_q()) * H * D, 0.0);
  r.lse.assign(static_cast<size_t>(H) * p.total_q(), -INFINITY);
  std::vector<double> s, pr;
  for (int b = 0; b < p.batch; ++b) {
    const int q0 = p.cu_q[b], sq = p.cu_q[b + 1] - q0, k0 = p.cu_k[b], sk = p.cu_k[b + 1] - k0;
    for (int h = 0; h < H; ++h) {
      const int hk = h / G;
      for (int i = 0; i < sq; ++i) {
        s.assign(sk, -INFINITY);
        double m = -INFINITY;
        for (int j = 0; j < sk; ++j) {
          if (!ref_visible(i, j, sq, sk, p.window_left, p.window_right)) continue;
          double dot = 0;
          const double* qi = &q[(static_cast<size_t>(q0 + i) * H + h) * D];
          const double* kj = &k[(static_cast<size_t>(k0 + j) * Hk + hk) * D];
          for (int c = 0; c < D; ++c) dot += qi[c] * kj[c];
          double x = rnd(rnd(dot) * p.scale);
          if (p.softcap > 0) x = rnd(p.softcap * std::tanh(x / p.softcap));
          s[j] = x;
          m = std::max(m, x);
        }
        if (m == -INFINITY) continue;  // no visible key: out 0, lse -inf
        double l = 0;
        pr.assign(sk, 0.0);
        for (int j = 0; j < sk; ++j)
          if (s[j] != -INFINITY) l += (pr[j] = std::exp(s[j] - m));
        r.lse[static_cast<size_t>(h) * p.total_q() + q0 + i] = m + std::log(l);
        double* o = &r.out[(static_cast<size_t>(q0 + i) * H + h) * D];
        for (int j = 0; j < sk; ++j) {
          if (pr[j] == 0) continue;
          const double pj = rnd(pr[j] / l);
          const double* vj = &v[(static_cast<size_t>(k0 + j) * Hk + hk) * D];
          for (int c = 0; c < D; ++c) o[c] += pj * vj[c];
        }
        for (int c = 0; c < D; ++c) o[c] = rnd(o[c]);
      }
    }
  }
  return r;
}

struct RefGrads {
  std::vector<double> dq, dk, dv;
};

/// Backward from the definition (FA2 Alg. 2 recomputation is NOT used: P is recomputed from scratch here).
inline RefGrads ref_backward(const RefProblem& p, const std::vector<double>& q, const std::vector<double>& k,
                             const std::vector<double>& v, const std::vector<double>& dout, const RoundFn& rnd) {
  const int H = p.num_heads, Hk = p.num_heads_kv, D = p.head_dim, G = H / Hk;
  const RefForward f = ref_forward(p, q, k, v, rnd);
  RefGrads g;
  g.dq.assign(q.size(), 0.0);
  std::vector<double> dk_h(static_cast<size_t>(p.total_k()) * H * D, 0.0), dv_h(dk_h.size(), 0.0);
  for (int b = 0; b < p.batch; ++b) {
    const int q0 = p.cu_q[b], sq = p.cu_q[b + 1] - q0, k0 = p.cu_k[b], sk = p.cu_k[b + 1] - k0;
    for (int h = 0; h < H; ++h) {
      const int hk = h / G;
      for (int i = 0; i < sq; ++i) {
        const double lse = f.lse[static_cast<size_t>(h) * p.total_q() + q0 + i];
        if (lse == -INFINITY) continue;
        const double* qi = &q[(static_cast<size_t>(q0 + i) * H + h) * D];
        const double* doi = &dout[(static_cast<size_t>(q0 + i) * H + h) * D];
        const double* oi = &f.out[(static_cast<size_t>(q0 + i) * H + h) * D];
        double Di = 0;
        for (int c = 0; c < D; ++c) Di += doi[c] * oi[c];
        Di = rnd(Di);
        double* dqi = &g.dq[(static_cast<size_t>(q0 + i) * H + h) * D];
        for (int j = 0; j < sk; ++j) {
          if (!ref_visible(i, j, sq, sk, p.window_left, p.window_right)) continue;
          const double* kj = &k[(static_cast<size_t>(k0 + j) * Hk + hk) * D];
          const double* vj = &v[(static_cast<size_t>(k0 + j) * Hk + hk) * D];
          double dot = 0, dp = 0;
          for (int c = 0; c < D; ++c) dot += qi[c] * kj[c], dp += doi[c] * vj[c];
          double x = rnd(rnd(dot) * p.scale), dcap = 1;
          if (p.softcap > 0) {
            const double t = std::tanh(x / p.softcap);
            x = rnd(p.softcap * t);
            dcap = 1 - t * t;
          }
          const double P = rnd(std::exp(x - lse));
          const double dS = rnd(P * (rnd(dp) - Di) * dcap);
          double* dkj = &dk_h[(static_cast<size_t>(k0 + j) * H + h) * D];
          double* dvj = &dv_h[(static_cast<size_t>(k0 + j) * H + h) * D];
          for (int c = 0; c < D; ++c) {
            dqi[c] += dS * kj[c] * p.scale;
            dkj[c] += dS * qi[c] * p.scale;
            dvj[c] += P * doi[c];
          }
        }
      }
    }
  }
  for (auto& x : g.dq) x = rnd(x);
  g.dk.assign(k.size(), 0.0);
  g.dv.assign(v.size(), 0.0);
  for (int r = 0; r < p.total_k(); ++r)
    for (int h = 0; h < H; ++h)
      for (int c = 0; c < D; ++c) {
        const size_t src = (static_cast<size_t>(r) * H + h) * D + c;
        const size_t dst = (static_cast<size_t>(r) * Hk + h / G) * D + c;
        g.dk[dst] += rnd(dk_h[src]);
        g.dv[dst] += rnd(dv_h[src]);
      }
  for (auto& x : g.dk) x = rnd(x);
  for (auto& x : g.dv) x = rnd(x);
  return g;
}

}  // namespace flashkv::cudatest
