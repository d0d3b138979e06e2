// Shared pieces of the CUDA attention tests (test_attention_cuda.cpp: forward and kernel selection;
// test_attention_bwd_cuda.cpp: backward): the Case grid description, device buffers, the float64 reference runs and
// the error measures. Functions are inline in an anonymous namespace: each test file uses its own subset.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/path_log.hpp"
#include "core/validate.hpp"
#include "cuda/attention_cuda.hpp"
#include "cuda/kernels.hpp"
#include "cuda/util.hpp"
#include "cuda_test_util.hpp"
#include "flashkv/attention.hpp"
#include "flashkv/error.hpp"

namespace flashkv::cudatest {
namespace {

using flashkv::testing::full_tests;  // FLASHKV_FULL_TESTS=1

struct Case {
  DType dtype = DType::bfloat16;
  int batch = 2, heads = 4, heads_kv = 4, head_dim = 64;
  int seqlen_q = 113, seqlen_k = 203;
  int window_left = -1, window_right = -1;
  bool causal = false;
  float softcap = 0;
  std::vector<int> varlen_q, varlen_k;  ///< per-sequence lengths (non-empty => varlen)
  bool strided = false;                 ///< q/k/v/out views with a padded head stride (padded-copy path)
  bool deterministic = true;
  Algorithm algorithm = Algorithm::tiled;
  KernelFamily family = KernelFamily::automatic;  ///< automatic: the suite's family (FamilyScope)
  std::string name() const {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s d=%d b=%d h=%d/%d sq=%d sk=%d win=(%d,%d) causal=%d softcap=%g%s%s %s",
                  dtype_name(dtype), head_dim, batch, heads, heads_kv, seqlen_q, seqlen_k, window_left,
                  window_right, causal, softcap, varlen_q.empty() ? "" : " varlen", strided ? " strided" : "",
                  algorithm == Algorithm::v1_order ? "v1" : "tiled");
    return buf;
  }
};

/// Inputs of one case. The reference sees every case as packed rows (fixed-length [B, S, H, D] is the varlen special
/// case cu = {0, S, 2S, ...}): `shape` is a RefVarlenShape and the reference lse is [H, total_q].
struct RefProblem {
  RefVarlenShape shape;
  RefOptions opts;
  std::vector<int32_t> cu_q, cu_k;  ///< device copies of shape.cu_seqlens_q/k
  int batch = 1;
  int total_q() const { return static_cast<int>(shape.total_q()); }
  int total_k() const { return static_cast<int>(shape.total_k()); }
};
struct CaseData {
  RefProblem ref;
  HostTensor q, k, v;
  int64_t pitch;  // elements between heads (head_dim, or head_dim + 3 when strided)
};

struct RefForward {
  std::vector<double> out, lse;  ///< out [total_q, H, D], lse [H, total_q]
};
/// float64 reference (rnd = no_rounding()) or the naive same-precision computation (rnd = rounding_to(dtype)).
inline RefForward ref_forward(const RefProblem& p, const std::vector<double>& q, const std::vector<double>& k,
                       const std::vector<double>& v, const flashkv::testing::Rounder& rnd) {
  RefForward r;
  reference_forward_varlen(p.shape, p.opts, q, k, v, r.out, r.lse, rnd);
  return r;
}
struct RefGrads {
  std::vector<double> dq, dk, dv;
};
inline RefGrads ref_backward(const RefProblem& p, const std::vector<double>& q, const std::vector<double>& k,
                      const std::vector<double>& v, const std::vector<double>& dout,
                      const flashkv::testing::Rounder& rnd) {
  RefGrads g;
  reference_backward_varlen(p.shape, p.opts, q, k, v, dout, g.dq, g.dk, g.dv, rnd);
  return g;
}

/// Tensor with `rows` x heads x head_dim logical elements stored with head pitch `pitch`.
inline HostTensor random_pitched(int64_t rows, int heads, int d, int64_t pitch, DType t, std::mt19937_64& rng) {
  HostTensor dense = random_tensor(static_cast<size_t>(rows) * heads * d, t, rng);
  if (pitch == d) return dense;
  HostTensor out;
  out.bits.assign(static_cast<size_t>(rows) * heads * pitch, to_bits(NAN, t));
  out.val = dense.val;
  for (int64_t i = 0; i < rows * heads; ++i)
    for (int c = 0; c < d; ++c) out.bits[i * pitch + c] = dense.bits[i * d + c];
  return out;
}
inline std::vector<double> unpitch(const std::vector<uint16_t>& bits, int64_t rows, int heads, int d, int64_t pitch,
                            DType t) {
  std::vector<double> v(static_cast<size_t>(rows) * heads * d);
  for (int64_t i = 0; i < rows * heads; ++i)
    for (int c = 0; c < d; ++c) v[i * d + c] = from_bits(bits[i * pitch + c], t);
  return v;
}

inline CaseData make_run(const Case& c, std::mt19937_64& rng) {
  CaseData r;
  RefProblem& p = r.ref;
  const bool varlen = !c.varlen_q.empty();
  p.batch = varlen ? static_cast<int>(c.varlen_q.size()) : c.batch;
  p.shape.num_heads = c.heads, p.shape.num_heads_kv = c.heads_kv;
  p.shape.head_dim = p.shape.head_dim_v = c.head_dim;
  p.cu_q = {0}, p.cu_k = {0};
  for (int b = 0; b < p.batch; ++b) {
    p.cu_q.push_back(p.cu_q.back() + (varlen ? c.varlen_q[b] : c.seqlen_q));
    p.cu_k.push_back(p.cu_k.back() + (varlen ? c.varlen_k[b] : c.seqlen_k));
  }
  p.shape.cu_seqlens_q.assign(p.cu_q.begin(), p.cu_q.end());
  p.shape.cu_seqlens_k.assign(p.cu_k.begin(), p.cu_k.end());
  p.opts.softmax_scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  p.opts.causal = c.causal;
  p.opts.window_size_left = c.window_left;
  p.opts.window_size_right = c.window_right;
  p.opts.softcap = c.softcap;
  r.pitch = c.strided ? c.head_dim + 3 : c.head_dim;
  r.q = random_pitched(p.total_q(), c.heads, c.head_dim, r.pitch, c.dtype, rng);
  r.k = random_pitched(p.total_k(), c.heads_kv, c.head_dim, r.pitch, c.dtype, rng);
  r.v = random_pitched(p.total_k(), c.heads_kv, c.head_dim, r.pitch, c.dtype, rng);
  return r;
}

/// The kernel family of the running suite: Cuda* suites run `automatic` (sm90 on Hopper where compiled), Cuda*Sm80
/// suites force sm80 through AttentionOptions::kernel_family (never through the environment).
KernelFamily g_family = KernelFamily::automatic;
struct FamilyScope {
  explicit FamilyScope(KernelFamily f) { g_family = f; }
  ~FamilyScope() { g_family = KernelFamily::automatic; }
  FamilyScope(const FamilyScope&) = delete;
  FamilyScope& operator=(const FamilyScope&) = delete;
};

inline AttentionOptions options_of(const Case& c) {
  AttentionOptions o;
  o.kernel_family = c.family != KernelFamily::automatic ? c.family : g_family;
  o.causal = c.causal;
  o.window_size_left = c.window_left;
  o.window_size_right = c.window_right;
  o.softcap = c.softcap;
  o.deterministic = c.deterministic;
  o.algorithm = c.algorithm;
  return o;
}

struct DeviceRun {
  DevBuf q, k, v, out, lse, cu_q, cu_k;
  TensorView qv, kv, vv, ov, lv, cqv, ckv;
  DeviceRun(const Case& c, const CaseData& r)
      : q(r.q.bits.size() * 2), k(r.k.bits.size() * 2), v(r.v.bits.size() * 2),
        out(static_cast<size_t>(r.ref.total_q()) * c.heads * r.pitch * 2),
        lse(static_cast<size_t>(r.ref.total_q()) * c.heads * 4), cu_q(r.ref.cu_q.size() * 4),
        cu_k(r.ref.cu_k.size() * 4) {
    const bool varlen = !c.varlen_q.empty();
    q.upload(r.q.bits), k.upload(r.k.bits), v.upload(r.v.bits);
    cu_q.upload(r.ref.cu_q), cu_k.upload(r.ref.cu_k);
    out.poison(), lse.poison();
    const int64_t sq = varlen ? r.ref.total_q() : c.seqlen_q, sk = varlen ? r.ref.total_k() : c.seqlen_k;
    qv = view(q.p, c.dtype, varlen, r.ref.batch, sq, c.heads, c.head_dim, r.pitch);
    kv = view(k.p, c.dtype, varlen, r.ref.batch, sk, c.heads_kv, c.head_dim, r.pitch);
    vv = view(v.p, c.dtype, varlen, r.ref.batch, sk, c.heads_kv, c.head_dim, r.pitch);
    ov = view(out.p, c.dtype, varlen, r.ref.batch, sq, c.heads, c.head_dim, r.pitch);
    lv = varlen ? dev_view(lse, DType::float32, {c.heads, r.ref.total_q()})
                : dev_view(lse, DType::float32, {r.ref.batch, c.heads, c.seqlen_q});
    cqv = dev_view(cu_q, DType::int32, {r.ref.batch + 1});
    ckv = dev_view(cu_k, DType::int32, {r.ref.batch + 1});
  }
  core::AttentionProblem forward_problem(const Case& c) const {
    const AttentionOptions o = options_of(c);
    if (c.varlen_q.empty()) return core::make_forward_problem(qv, kv, vv, ov, &lv, o);
    int mq = 0, mk = 0;
    for (int x : c.varlen_q) mq = std::max(mq, x);
    for (int x : c.varlen_k) mk = std::max(mk, x);
    return core::make_varlen_forward_problem(qv, kv, vv, cqv, ckv, mq, mk, ov, &lv, o);
  }
};

/// lse from the device layout ([B, H, S] or [H, total]) into the reference layout [H, total_q].
inline std::vector<double> lse_to_ref(const std::vector<float>& l, const Case& c, const RefProblem& p) {
  std::vector<double> out(static_cast<size_t>(c.heads) * p.total_q());
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < c.heads; ++h)
      for (int i = 0; i < p.cu_q[b + 1] - p.cu_q[b]; ++i) {
        const size_t src = c.varlen_q.empty() ? (static_cast<size_t>(b) * c.heads + h) * c.seqlen_q + i
                                              : static_cast<size_t>(h) * p.total_q() + p.cu_q[b] + i;
        out[static_cast<size_t>(h) * p.total_q() + p.cu_q[b] + i] = l[src];
      }
  return out;
}
/// max |a - ref| over rows with a visible key; a row with no visible key must be exactly -inf in both (lse error of
/// +inf otherwise, also for a kernel -inf/NaN where the reference is finite).
inline double lse_err(const std::vector<double>& a, const std::vector<double>& ref) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::isinf(a[i]) && a[i] != ref[i]) return INFINITY;
  return max_abs_diff(a, ref);
}

/// Runs the forward case; returns false (and records a failure) on a tolerance violation.
inline void check_forward(const Case& c) {
  SCOPED_TRACE(c.name());
  std::mt19937_64 rng(test_seed() ^ std::hash<std::string>{}(c.name()));
  const CaseData r = make_run(c, rng);
  DeviceRun d(c, r);
  cuda::attention_forward_cuda(d.forward_problem(c), nullptr);
  const auto out = unpitch(d.out.download<uint16_t>(d.out.bytes / 2), r.ref.total_q(), c.heads, c.head_dim, r.pitch,
                           c.dtype);
  const auto lse = lse_to_ref(d.lse.download<float>(d.lse.bytes / 4), c, r.ref);
  const RefForward ref = ref_forward(r.ref, r.q.val, r.k.val, r.v.val, no_rounding());
  const RefForward naive = ref_forward(r.ref, r.q.val, r.k.val, r.v.val, rounding_to(c.dtype));
  const double err = max_abs_diff(out, ref.out), naive_err = max_abs_diff(naive.out, ref.out);
  EXPECT_LE(err, 2 * naive_err + 1e-5) << "out: kernel err " << err << " vs naive " << naive_err;
  const double lerr = lse_err(lse, ref.lse), naive_lerr = lse_err(naive.lse, ref.lse);
  EXPECT_LE(lerr, 2 * naive_lerr + 1e-4) << "lse: kernel err " << lerr << " vs naive " << naive_lerr;
}

inline bool is_hopper() {
  int dev = 0, major = 0, minor = 0;
  EXPECT_EQ(cudaGetDevice(&dev), cudaSuccess);
  EXPECT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
  EXPECT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), cudaSuccess);
  return major == 9 && minor == 0;
}
inline bool sm80_only_env() {
  const char* v = std::getenv("FLASHKV_CUDA_SM80_ONLY");
  return v != nullptr && v[0] != '\0' && std::string(v) != "0";
}
inline bool contains(const std::string& s, const std::string& x) { return s.find(x) != std::string::npos; }

/// Runs one forward of c and returns the recorded kernel path.
inline std::string forward_path(const Case& c) {
  std::mt19937_64 rng(11);
  const CaseData r = make_run(c, rng);
  DeviceRun d(c, r);
  cuda::attention_forward_cuda(d.forward_problem(c), nullptr);
  return core::last_path();
}
inline std::vector<int> head_dims() { return {64, 128, 59, 111, 96, 192, 256}; }

inline bool compiled(int d, DType t) {
  try {
    Case c;
    c.head_dim = d, c.dtype = t, c.batch = 1, c.heads = c.heads_kv = 1, c.seqlen_q = c.seqlen_k = 1;
    std::mt19937_64 rng(1);
    const CaseData r = make_run(c, rng);
    DeviceRun dr(c, r);
    cuda::attention_forward_cuda(dr.forward_problem(c), nullptr);
    return true;
  } catch (const UnsupportedError& e) {
    std::printf("  [not compiled] %s\n", e.what());
    return false;
  }
}

struct BwdResult {
  std::vector<uint16_t> dq, dk, dv;
};

inline BwdResult run_backward(const Case& c, const CaseData& r, DeviceRun& d, const HostTensor& dout) {
  DevBuf dO(dout.bits.size() * 2), dq(d.q.bytes), dk(d.k.bytes), dv(d.v.bytes);
  dO.upload(dout.bits);
  dq.poison(), dk.poison(), dv.poison();
  const bool varlen = !c.varlen_q.empty();
  const int64_t sq = varlen ? r.ref.total_q() : c.seqlen_q, sk = varlen ? r.ref.total_k() : c.seqlen_k;
  const TensorView dov = view(dO.p, c.dtype, varlen, r.ref.batch, sq, c.heads, c.head_dim, r.pitch);
  const TensorView dqv = view(dq.p, c.dtype, varlen, r.ref.batch, sq, c.heads, c.head_dim, r.pitch);
  const TensorView dkv = view(dk.p, c.dtype, varlen, r.ref.batch, sk, c.heads_kv, c.head_dim, r.pitch);
  const TensorView dvv = view(dv.p, c.dtype, varlen, r.ref.batch, sk, c.heads_kv, c.head_dim, r.pitch);
  const AttentionOptions o = options_of(c);
  core::AttentionProblem pr;
  if (!varlen) {
    pr = core::make_backward_problem(d.qv, d.kv, d.vv, d.ov, d.lv, dov, dqv, dkv, dvv, o);
  } else {
    int mq = 0, mk = 0;
    for (int x : c.varlen_q) mq = std::max(mq, x);
    for (int x : c.varlen_k) mk = std::max(mk, x);
    pr = core::make_varlen_backward_problem(d.qv, d.kv, d.vv, d.cqv, d.ckv, mq, mk, d.ov, d.lv, dov, dqv, dkv, dvv,
                                            o);
  }
  cuda::attention_backward_cuda(pr, nullptr);
  return {dq.download<uint16_t>(dq.bytes / 2), dk.download<uint16_t>(dk.bytes / 2),
          dv.download<uint16_t>(dv.bytes / 2)};
}


}  // namespace
}  // namespace flashkv::cudatest
