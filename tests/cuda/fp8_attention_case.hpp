// The cases of the FP8 (float8_e4m3fn q/k/v, bfloat16 out) forward tests (test_attention_fp8_cuda.cpp,
// test_attention_fp8_outlier_cuda.cpp): a case's shape and options (Fp8Case), its host inputs quantized to e4m3
// (make_data: random values with per-(sequence, kv head) scales, fp8_test_util.hpp), the device tensors and the call
// through validation and the CUDA backend (Fp8Run), the outputs read back (download), the float64 reference's shape
// and options, and which FP8 head dims the build compiled.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/validate.hpp"
#include "cuda/attention_cuda.hpp"
#include "cuda/kernels.hpp"
#include "cuda_test_util.hpp"
#include "flashkv/attention.hpp"
#include "flashkv/error.hpp"
#include "fp8_test_util.hpp"

namespace flashkv::cudatest {

/// The public entry points' work (flashkv/attention.hpp; src/cpu/attention_api.cpp is not linked into this binary):
/// validation into a problem, then the CUDA backend.
inline void run_forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                        const TensorView* lse, const AttentionOptions& o) {
  cuda::attention_forward_cuda(core::make_forward_problem(q, k, v, out, lse, o), nullptr);
}
inline void run_varlen_forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& cq,
                               const TensorView& ck, int64_t mq, int64_t mk, const TensorView& out,
                               const TensorView* lse, const AttentionOptions& o) {
  cuda::attention_forward_cuda(core::make_varlen_forward_problem(q, k, v, cq, ck, mq, mk, out, lse, o), nullptr);
}

/// One test case: shape, mask, softcap, descale layout, pitch, varlen lengths.
struct Fp8Case {
  int batch = 2, heads = 4, heads_kv = 4, head_dim = 128;
  int seqlen_q = 113, seqlen_k = 203;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  bool per_head = true;          ///< descales per (batch, kv head), else per tensor
  bool strided_descale = false;  ///< per-head descales stored [num_heads_kv, batch] and viewed transposed
  bool with_descale = true;      ///< false: no descale tensors (all 1; inputs quantized with scale 1)
  int pitch_extra = 0;           ///< > 0: q/k/v/out head stride head_dim + pitch_extra (the padded-copy path)
  std::vector<int> varlen_q, varlen_k;
  std::string name() const {
    char buf[256];
    std::snprintf(buf, sizeof buf, "fp8 d=%d b=%d h=%d/%d sq=%d sk=%d causal=%d win=(%d,%d) softcap=%g %s%s%s%s",
                  head_dim, batch, heads, heads_kv, seqlen_q, seqlen_k, causal, window_left, window_right, softcap,
                  with_descale ? (per_head ? "per-head" : "per-tensor") : "no-descale",
                  strided_descale ? " strided-descale" : "", varlen_q.empty() ? "" : " varlen",
                  pitch_extra ? " pitched" : "");
    return buf;
  }
};

inline bool hopper_sm90a() { return cuda::device_runs_sm90(); }

/// Host inputs of one case: values in the packed [total, H, d] order with the per-sequence bounds.
struct Fp8Data {
  std::vector<int32_t> cu_q, cu_k;
  fp8::Quantized q, k, v;
};

inline std::vector<double> randn(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> x(n);
  for (double& e : x) e = dist(rng);
  return x;
}
/// Multiplies each (sequence, kv head) group by its own factor in [0.25, 4] so that per-head descales differ.
inline void vary_groups(std::vector<double>& x, const std::vector<int32_t>& cu, int heads, int group, int d,
                 std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    std::vector<double> f(static_cast<size_t>(heads / group));
    for (double& e : f) e = std::exp2(u(rng));
    for (int r = cu[b]; r < cu[b + 1]; ++r)
      for (int h = 0; h < heads; ++h)
        for (int c = 0; c < d; ++c) x[(static_cast<size_t>(r) * heads + h) * d + c] *= f[static_cast<size_t>(h / group)];
  }
}

inline Fp8Data make_data(const Fp8Case& c, std::mt19937_64& rng) {
  Fp8Data r;
  const bool varlen = !c.varlen_q.empty();
  const int batch = varlen ? static_cast<int>(c.varlen_q.size()) : c.batch;
  r.cu_q = {0}, r.cu_k = {0};
  for (int b = 0; b < batch; ++b) {
    r.cu_q.push_back(r.cu_q.back() + (varlen ? c.varlen_q[b] : c.seqlen_q));
    r.cu_k.push_back(r.cu_k.back() + (varlen ? c.varlen_k[b] : c.seqlen_k));
  }
  const int group = c.heads / c.heads_kv, d = c.head_dim;
  auto qx = randn(static_cast<size_t>(r.cu_q.back()) * c.heads * d, rng);
  auto kx = randn(static_cast<size_t>(r.cu_k.back()) * c.heads_kv * d, rng);
  auto vx = randn(static_cast<size_t>(r.cu_k.back()) * c.heads_kv * d, rng);
  if (c.with_descale) {
    vary_groups(qx, r.cu_q, c.heads, group, d, rng);
    vary_groups(kx, r.cu_k, c.heads_kv, 1, d, rng);
    vary_groups(vx, r.cu_k, c.heads_kv, 1, d, rng);
  }
  const bool per_head = c.with_descale && c.per_head;
  r.q = fp8::quantize(qx, r.cu_q, c.heads, group, d, per_head);
  r.k = fp8::quantize(kx, r.cu_k, c.heads_kv, 1, d, per_head);
  r.v = fp8::quantize(vx, r.cu_k, c.heads_kv, 1, d, per_head);
  if (!c.with_descale) {  // no descale tensors: the codes are the values (scale 1; N(0, 1) fits e4m3's range)
    for (fp8::Quantized* t : {&r.q, &r.k, &r.v}) {
      for (size_t i = 0; i < t->codes.size(); ++i) {
        t->codes[i] = fp8::e4m3_code(t == &r.q ? qx[i] : t == &r.k ? kx[i] : vx[i]);
        t->deq[i] = fp8::e4m3_value(t->codes[i]);
      }
      t->descale.assign(1, 1.f);
    }
  }
  return r;
}

/// Device tensors of one case and the problem over them.
struct Fp8Run {
  DevBuf q, k, v, out, lse, cu_q, cu_k, dq, dk, dv;
  TensorView qv, kv, vv, ov, lv, cqv, ckv, dqv, dkv, dvv;
  int64_t pitch;
  int batch;
  std::vector<int> mq_mk;
  static std::vector<uint8_t> pitched(const std::vector<uint8_t>& codes, int d, int64_t pitch) {
    if (pitch == d) return codes;
    std::vector<uint8_t> out(codes.size() / d * pitch, 0x7F);  // NaN padding: must never be read
    for (size_t r = 0; r * d < codes.size(); ++r)
      for (int c = 0; c < d; ++c) out[r * pitch + c] = codes[r * d + c];
    return out;
  }
  static std::vector<float> descale_store(const Fp8Case& c, const std::vector<float>& ds, int batch) {
    if (!(c.per_head && c.strided_descale)) return ds;
    std::vector<float> t(ds.size());  // [hkv, batch]
    for (int b = 0; b < batch; ++b)
      for (int h = 0; h < c.heads_kv; ++h) t[static_cast<size_t>(h) * batch + b] = ds[static_cast<size_t>(b) * c.heads_kv + h];
    return t;
  }
  Fp8Run(const Fp8Case& c, const Fp8Data& r)
      : q(Fp8Run::pitched(r.q.codes, c.head_dim, c.head_dim + c.pitch_extra).size()),
        k(Fp8Run::pitched(r.k.codes, c.head_dim, c.head_dim + c.pitch_extra).size()),
        v(Fp8Run::pitched(r.v.codes, c.head_dim, c.head_dim + c.pitch_extra).size()),
        out(static_cast<size_t>(r.cu_q.back()) * c.heads * (c.head_dim + c.pitch_extra) * 2),
        lse(static_cast<size_t>(r.cu_q.back()) * c.heads * 4), cu_q(r.cu_q.size() * 4), cu_k(r.cu_k.size() * 4),
        dq(r.q.descale.size() * 4), dk(r.k.descale.size() * 4), dv(r.v.descale.size() * 4),
        pitch(c.head_dim + c.pitch_extra), batch(static_cast<int>(r.cu_q.size()) - 1) {
    const bool varlen = !c.varlen_q.empty();
    q.upload(pitched(r.q.codes, c.head_dim, pitch));
    k.upload(pitched(r.k.codes, c.head_dim, pitch));
    v.upload(pitched(r.v.codes, c.head_dim, pitch));
    cu_q.upload(r.cu_q), cu_k.upload(r.cu_k);
    dq.upload(descale_store(c, r.q.descale, batch));
    dk.upload(descale_store(c, r.k.descale, batch));
    dv.upload(descale_store(c, r.v.descale, batch));
    out.poison(), lse.poison();
    const int64_t sq = varlen ? r.cu_q.back() : c.seqlen_q, sk = varlen ? r.cu_k.back() : c.seqlen_k;
    qv = view(q.p, DType::float8_e4m3fn, varlen, batch, sq, c.heads, c.head_dim, pitch);
    kv = view(k.p, DType::float8_e4m3fn, varlen, batch, sk, c.heads_kv, c.head_dim, pitch);
    vv = view(v.p, DType::float8_e4m3fn, varlen, batch, sk, c.heads_kv, c.head_dim, pitch);
    ov = view(out.p, DType::bfloat16, varlen, batch, sq, c.heads, c.head_dim, pitch);
    lv = varlen ? dev_view(lse, DType::float32, {c.heads, r.cu_q.back()})
                : dev_view(lse, DType::float32, {batch, c.heads, c.seqlen_q});
    cqv = dev_view(cu_q, DType::int32, {batch + 1});
    ckv = dev_view(cu_k, DType::int32, {batch + 1});
    auto dview = [&](const DevBuf& b) {
      if (!c.per_head) return dev_view(b, DType::float32, {1});
      TensorView t = dev_view(b, DType::float32, {batch, c.heads_kv});
      if (c.strided_descale) t.strides[0] = 1, t.strides[1] = batch;
      return t;
    };
    dqv = dview(dq), dkv = dview(dk), dvv = dview(dv);
  }
  AttentionOptions options(const Fp8Case& c) const {
    AttentionOptions o;
    o.kernel_family = KernelFamily::sm90ws;
    o.causal = c.causal;
    o.window_size_left = c.window_left;
    o.window_size_right = c.window_right;
    o.softcap = c.softcap;
    if (c.with_descale) o.q_descale = &dqv, o.k_descale = &dkv, o.v_descale = &dvv;
    return o;
  }
  /// Runs the forward: validation, dispatch, the sm90ws FP8 kernel.
  void forward(const Fp8Case& c) const {
    const AttentionOptions o = options(c);
    if (c.varlen_q.empty()) {
      run_forward(qv, kv, vv, ov, &lv, o);
    } else {
      int mq = 0, mk = 0;
      for (int x : c.varlen_q) mq = std::max(mq, x);
      for (int x : c.varlen_k) mk = std::max(mk, x);
      run_varlen_forward(qv, kv, vv, cqv, ckv, mq, mk, ov, &lv, o);
    }
  }
};

struct Fp8Result {
  std::vector<double> out, lse;  ///< out [total_q, H, d], lse [H, total_q]
};
inline Fp8Result download(const Fp8Case& c, const Fp8Data& r, const Fp8Run& d) {
  Fp8Result res;
  const int tq = r.cu_q.back();
  const auto bits = d.out.download<uint16_t>(d.out.bytes / 2);
  res.out.resize(static_cast<size_t>(tq) * c.heads * c.head_dim);
  for (size_t i = 0; i < static_cast<size_t>(tq) * c.heads; ++i)
    for (int col = 0; col < c.head_dim; ++col)
      res.out[i * c.head_dim + col] = bf16_to_float(bits[i * d.pitch + col]);
  const auto l = d.lse.download<float>(d.lse.bytes / 4);
  res.lse.assign(static_cast<size_t>(c.heads) * tq, 0.0);
  for (int b = 0; b < d.batch; ++b)
    for (int h = 0; h < c.heads; ++h)
      for (int i = 0; i < r.cu_q[b + 1] - r.cu_q[b]; ++i) {
        const size_t src = c.varlen_q.empty() ? (static_cast<size_t>(b) * c.heads + h) * c.seqlen_q + i
                                              : static_cast<size_t>(h) * tq + r.cu_q[b] + i;
        res.lse[static_cast<size_t>(h) * tq + r.cu_q[b] + i] = l[src];
      }
  return res;
}

inline RefVarlenShape ref_shape(const Fp8Case& c, const Fp8Data& r) {
  RefVarlenShape s;
  s.cu_seqlens_q.assign(r.cu_q.begin(), r.cu_q.end());
  s.cu_seqlens_k.assign(r.cu_k.begin(), r.cu_k.end());
  s.num_heads = c.heads, s.num_heads_kv = c.heads_kv, s.head_dim = s.head_dim_v = c.head_dim;
  return s;
}
inline RefOptions ref_options(const Fp8Case& c) {
  RefOptions o;
  o.softmax_scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  o.causal = c.causal;
  o.window_size_left = c.window_left;
  o.window_size_right = c.window_right;
  o.softcap = c.softcap;
  return o;
}

/// The FP8 head dims this build compiled (an UnsupportedError "not compiled" otherwise, printed).
inline bool fp8_compiled(int d) {
  try {
    cuda::select_kernel(cuda::KernelKind::fwd, KernelFamily::sm90ws, d, DType::float8_e4m3fn);
    return true;
  } catch (const UnsupportedError& e) {
    std::printf("  [not compiled] %s\n", e.what());
    return false;
  }
}

}  // namespace flashkv::cudatest

/// First statement of an FP8 test: skips it without a Hopper GPU running sm_90a code.
#define FLASHKV_REQUIRE_FP8() \
  if (!::flashkv::cudatest::hopper_sm90a()) GTEST_SKIP() << "no Hopper GPU running sm_90a code (FP8 is sm90ws only)"
