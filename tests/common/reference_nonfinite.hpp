// flashkv test support: the float64 reference of the NON-FINITE contract (include/flashkv/attention.hpp "NON-FINITE
// INPUTS"), and the per-element comparison every path's NaN/inf tests use (header-only; CPU, CUDA and KV-cache tests).
//
// The reference evaluates the definition in IEEE arithmetic over the keys J_i each query row sees, and only over them
// (an explicit boolean mask from tests/common/reference.hpp's reference_mask; masked keys are never read):
//   s_ij = softcap(scale · q_i·k_j), the dot product taken to ±inf where it leaves the float32 range (the kernels
//          accumulate in float32; inside the range the reference stays float64)
//   m_i  = max_{j∈J_i} s_ij, NaN if any s_ij is NaN;  p_ij = exp(s_ij − m_i);  l_i = Σ_j p_ij
//   out_i = (Σ_j p_ij v_j) / l_i;  lse_i = m_i + log l_i;  J_i empty: out_i = 0, lse_i = −inf
// Backward (dout given; out and lse from the forward reference):
//   P_ij = exp(s_ij − lse_i) (j∈J_i);  D_i = Σ_c dout_ic out_ic;  dP_ij = dout_i·v_j;  dS_ij = P_ij (dP_ij − D_i)
//   (softcap: × (1 − tanh²));  dq_i = scale Σ_{j∈J_i} dS_ij k_j;  dk_j = scale Σ_{i: j∈J_i} dS_ij q_i;
//   dv_j = Σ_{i: j∈J_i} P_ij dout_i.
// Layouts: packed (varlen) — q [total_q, H, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv], out/dout [total_q, H, Dv],
// lse [H, total_q]. A fixed-length bshd batch is the packed batch with uniform cu_seqlens (reference.hpp
// uniform_cu_seqlens), except that its lse is [B, H, S]: lse_bhs_to_packed converts.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "common/reference.hpp"

namespace flashkv::testing {

/// The four classes the contract distinguishes.
enum class FpClass { finite, nan, pos_inf, neg_inf };

inline FpClass fp_class(double x) {
  if (std::isnan(x)) return FpClass::nan;
  if (std::isinf(x)) return x > 0 ? FpClass::pos_inf : FpClass::neg_inf;
  return FpClass::finite;
}

inline const char* fp_class_name(FpClass c) {
  switch (c) {
    case FpClass::finite: return "finite";
    case FpClass::nan: return "NaN";
    case FpClass::pos_inf: return "+inf";
    case FpClass::neg_inf: return "-inf";
  }
  return "?";
}

namespace detail {
inline double nan_max(double a, double b) { return (std::isnan(a) || a > b) ? a : b; }

/// s_ij of query row (global row iq, head h) against key (global row jk) per the header comment.
inline double ieee_score(const RefVarlenShape& s, const RefOptions& o, const std::vector<double>& q,
                         const std::vector<double>& k, int64_t iq, int64_t h, int64_t jk) {
  const int64_t hk = h / (s.num_heads / s.num_heads_kv);
  const double* qi = &q[static_cast<std::size_t>((iq * s.num_heads + h) * s.head_dim)];
  const double* kj = &k[static_cast<std::size_t>((jk * s.num_heads_kv + hk) * s.head_dim)];
  double dot = 0.0;
  for (int64_t c = 0; c < s.head_dim; ++c) dot += qi[c] * kj[c];
  if (std::isfinite(dot) && std::fabs(dot) > static_cast<double>(FLT_MAX)) dot = dot > 0 ? INFINITY : -INFINITY;
  double t = dot * o.softmax_scale;
  if (o.softcap > 0.0) t = o.softcap * std::tanh(t / o.softcap);
  return t;
}
}  // namespace detail

/// Forward reference of the contract: out [total_q, H, Dv], lse [H, total_q].
inline void ieee_reference_forward(const RefVarlenShape& s, const RefOptions& o, const std::vector<double>& q,
                                   const std::vector<double>& k, const std::vector<double>& v,
                                   std::vector<double>& out, std::vector<double>& lse) {
  const int64_t H = s.num_heads, Hk = s.num_heads_kv, Dv = s.head_dim_v, tq = s.total_q();
  out.assign(static_cast<std::size_t>(tq * H * Dv), 0.0);
  lse.assign(static_cast<std::size_t>(H * tq), -INFINITY);
  std::vector<double> sc;
  std::vector<double> acc(static_cast<std::size_t>(Dv));
  for (int64_t b = 0; b < s.batch(); ++b) {
    const int64_t q0 = s.cu_seqlens_q[b], lq = s.cu_seqlens_q[b + 1] - q0;
    const int64_t k0 = s.cu_seqlens_k[b], lk = s.cu_seqlens_k[b + 1] - k0;
    const std::vector<char> mask = reference_mask(lq, lk, o);
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / (H / Hk);
      for (int64_t i = 0; i < lq; ++i) {
        sc.assign(static_cast<std::size_t>(lk), 0.0);
        bool any = false;
        double m = -INFINITY;
        for (int64_t j = 0; j < lk; ++j) {
          if (!mask[static_cast<std::size_t>(i * lk + j)]) continue;
          sc[static_cast<std::size_t>(j)] = detail::ieee_score(s, o, q, k, q0 + i, h, k0 + j);
          m = any ? detail::nan_max(sc[static_cast<std::size_t>(j)], m) : sc[static_cast<std::size_t>(j)];
          any = true;
        }
        if (!any) continue;  // out = 0, lse = −inf
        double l = 0.0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < lk; ++j) {
          if (!mask[static_cast<std::size_t>(i * lk + j)]) continue;
          const double p = std::exp(sc[static_cast<std::size_t>(j)] - m);
          l += p;
          const double* vj = &v[static_cast<std::size_t>(((k0 + j) * Hk + hk) * Dv)];
          for (int64_t c = 0; c < Dv; ++c) acc[static_cast<std::size_t>(c)] += p * vj[c];
        }
        double* oi = &out[static_cast<std::size_t>(((q0 + i) * H + h) * Dv)];
        for (int64_t c = 0; c < Dv; ++c) oi[c] = acc[static_cast<std::size_t>(c)] / l;
        lse[static_cast<std::size_t>(h * tq + q0 + i)] = m + std::log(l);
      }
    }
  }
}

/// Backward reference of the contract (out/lse: the forward reference's, packed layouts): dq/dk/dv like q/k/v.
inline void ieee_reference_backward(const RefVarlenShape& s, const RefOptions& o, const std::vector<double>& q,
                                    const std::vector<double>& k, const std::vector<double>& v,
                                    const std::vector<double>& out, const std::vector<double>& lse,
                                    const std::vector<double>& dout, std::vector<double>& dq,
                                    std::vector<double>& dk, std::vector<double>& dv) {
  const int64_t H = s.num_heads, Hk = s.num_heads_kv, D = s.head_dim, Dv = s.head_dim_v, tq = s.total_q();
  dq.assign(q.size(), 0.0);
  dk.assign(k.size(), 0.0);
  dv.assign(v.size(), 0.0);
  for (int64_t b = 0; b < s.batch(); ++b) {
    const int64_t q0 = s.cu_seqlens_q[b], lq = s.cu_seqlens_q[b + 1] - q0;
    const int64_t k0 = s.cu_seqlens_k[b], lk = s.cu_seqlens_k[b + 1] - k0;
    const std::vector<char> mask = reference_mask(lq, lk, o);
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / (H / Hk);
      for (int64_t i = 0; i < lq; ++i) {
        const int64_t iq = q0 + i;
        const double l_i = lse[static_cast<std::size_t>(h * tq + iq)];
        const double* gi = &dout[static_cast<std::size_t>((iq * H + h) * Dv)];
        const double* oi = &out[static_cast<std::size_t>((iq * H + h) * Dv)];
        double d_i = 0.0;
        for (int64_t c = 0; c < Dv; ++c) d_i += gi[c] * oi[c];
        for (int64_t j = 0; j < lk; ++j) {
          if (!mask[static_cast<std::size_t>(i * lk + j)]) continue;
          const int64_t jk = k0 + j;
          const double sij = detail::ieee_score(s, o, q, k, iq, h, jk);
          const double p = std::exp(sij - l_i);
          const double* vj = &v[static_cast<std::size_t>((jk * Hk + hk) * Dv)];
          double dp = 0.0;
          for (int64_t c = 0; c < Dv; ++c) dp += gi[c] * vj[c];
          double ds = p * (dp - d_i);
          if (o.softcap > 0.0) {
            const double th = sij / o.softcap;
            ds *= 1.0 - th * th;
          }
          const double* qi = &q[static_cast<std::size_t>((iq * H + h) * D)];
          const double* kj = &k[static_cast<std::size_t>((jk * Hk + hk) * D)];
          double* dqi = &dq[static_cast<std::size_t>((iq * H + h) * D)];
          double* dkj = &dk[static_cast<std::size_t>((jk * Hk + hk) * D)];
          double* dvj = &dv[static_cast<std::size_t>((jk * Hk + hk) * Dv)];
          for (int64_t c = 0; c < D; ++c) {
            dqi[c] += o.softmax_scale * ds * kj[c];
            dkj[c] += o.softmax_scale * ds * qi[c];
          }
          for (int64_t c = 0; c < Dv; ++c) dvj[c] += p * gi[c];
        }
      }
    }
  }
}

/// [B, H, S] (fixed-length lse) -> [H, B·S] (packed order).
inline std::vector<double> lse_bhs_to_packed(const std::vector<double>& x, int64_t B, int64_t H, int64_t S) {
  std::vector<double> y(x.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < S; ++i) y[static_cast<std::size_t>(h * B * S + b * S + i)] = x[(b * H + h) * S + i];
  return y;
}

/// Per-element comparison: every element's class must equal the reference's; finite elements must be within
/// rtol · max(1, max |finite reference|). Returns "" when it holds, else a report (first few mismatches and counts).
inline std::string compare_classified(const char* what, const std::vector<double>& got,
                                      const std::vector<double>& ref, double rtol) {
  if (got.size() != ref.size()) return std::string(what) + ": size mismatch\n";
  double scale = 1.0;
  for (double r : ref) {
    if (std::isfinite(r)) scale = std::max(scale, std::fabs(r));
  }
  const double tol = rtol * scale;
  int64_t bad_class = 0, bad_value = 0, nonfinite_ref = 0;
  double worst = 0.0;
  std::string first;
  char buf[200];
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const FpClass cr = fp_class(ref[i]), cg = fp_class(got[i]);
    if (cr != FpClass::finite) ++nonfinite_ref;
    if (cr != cg) {
      if (bad_class++ < 5) {
        std::snprintf(buf, sizeof buf, "  %s[%zu]: got %s (%g), reference %s (%g)\n", what, i, fp_class_name(cg),
                      got[i], fp_class_name(cr), ref[i]);
        first += buf;
      }
      continue;
    }
    if (cr == FpClass::finite) {
      const double e = std::fabs(got[i] - ref[i]);
      worst = std::max(worst, e);
      if (e > tol && bad_value++ < 5) {
        std::snprintf(buf, sizeof buf, "  %s[%zu]: got %.9g, reference %.9g (err %.3e > tol %.3e)\n", what, i, got[i],
                      ref[i], e, tol);
        first += buf;
      }
    }
  }
  if (bad_class == 0 && bad_value == 0) return "";
  std::snprintf(buf, sizeof buf, "%s: %lld class mismatches, %lld value mismatches (worst finite err %.3e, tol %.3e; "
                "%lld non-finite reference elements of %zu)\n",
                what, static_cast<long long>(bad_class), static_cast<long long>(bad_value), worst, tol,
                static_cast<long long>(nonfinite_ref), ref.size());
  return buf + first;
}

}  // namespace flashkv::testing
