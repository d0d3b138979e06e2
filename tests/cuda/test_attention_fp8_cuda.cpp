// FP8 (float8_e4m3fn q/k/v, bfloat16 out) forward of the sm90ws family (sm90/mainloop_fwd_tma_ws_fp8.cuh) against
// a float64 reference on the dequantized values (tolerance: 2x the error of the naive same-precision computation,
// fp8_test_util.hpp naive_fp8 with the device's own FP8 GEMM through cuBLASLt, fp8_gemm_cublaslt.hpp; lse too) for
// head dims 64/128/256 (those compiled: FLASHKV_CUDA_FP8_HEADDIMS) x causal / window / softcap / GQA-MQA / varlen x
// descales per tensor / per (batch, kv head) (incl. strided descale views), persistent tiles, padded copies, a NaN in
// a masked key; the FA3-paper outlier study (RMSE vs float64 on unquantized values, with and without Hadamard
// incoherent processing); and the typed errors. Skipped (exit 77) without a GPU; the suites need a Hopper GPU running
// sm_90a code, else they check the UnsupportedError.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/path_log.hpp"
#include "core/validate.hpp"
#include "cuda/attention_cuda.hpp"
#include "cuda/kernels.hpp"
#include "cuda_test_util.hpp"
#include "flashkv/attention.hpp"
#include "flashkv/error.hpp"
#include "fp8_gemm_cublaslt.hpp"
#include "fp8_test_util.hpp"

namespace flashkv::cudatest {
namespace {

using fp8::Quantized;
using flashkv::testing::full_tests;

/// The public entry points' work (flashkv/attention.hpp; src/cpu/attention_api.cpp is not linked into this binary):
/// validation into a problem, then the CUDA backend.
void run_forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                       const TensorView* lse, const AttentionOptions& o) {
  cuda::attention_forward_cuda(core::make_forward_problem(q, k, v, out, lse, o), nullptr);
}
void run_varlen_forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& cq,
                              const TensorView& ck, int64_t mq, int64_t mk, const TensorView& out,
                              const TensorView* lse, const AttentionOptions& o) {
  cuda::attention_forward_cuda(core::make_varlen_forward_problem(q, k, v, cq, ck, mq, mk, out, lse, o), nullptr);
}
void run_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                        const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, const AttentionOptions& o) {
  cuda::attention_backward_cuda(core::make_backward_problem(q, k, v, out, lse, dout, dq, dk, dv, o), nullptr);
}

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

bool hopper_sm90a() { return cuda::device_runs_sm90(); }

/// Host inputs of one case: values in the packed [total, H, d] order with the per-sequence bounds.
struct Fp8Data {
  std::vector<int32_t> cu_q, cu_k;
  Quantized q, k, v;
};

std::vector<double> randn(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> x(n);
  for (double& e : x) e = dist(rng);
  return x;
}
/// Multiplies each (sequence, kv head) group by its own factor in [0.25, 4] so that per-head descales differ.
void vary_groups(std::vector<double>& x, const std::vector<int32_t>& cu, int heads, int group, int d,
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

Fp8Data make_data(const Fp8Case& c, std::mt19937_64& rng) {
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
    for (Quantized* t : {&r.q, &r.k, &r.v}) {
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
Fp8Result download(const Fp8Case& c, const Fp8Data& r, const Fp8Run& d) {
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

RefVarlenShape ref_shape(const Fp8Case& c, const Fp8Data& r) {
  RefVarlenShape s;
  s.cu_seqlens_q.assign(r.cu_q.begin(), r.cu_q.end());
  s.cu_seqlens_k.assign(r.cu_k.begin(), r.cu_k.end());
  s.num_heads = c.heads, s.num_heads_kv = c.heads_kv, s.head_dim = s.head_dim_v = c.head_dim;
  return s;
}
RefOptions ref_options(const Fp8Case& c) {
  RefOptions o;
  o.softmax_scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  o.causal = c.causal;
  o.window_size_left = c.window_left;
  o.window_size_right = c.window_right;
  o.softcap = c.softcap;
  return o;
}
double lse_error(const std::vector<double>& a, const std::vector<double>& ref) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::isinf(a[i]) && a[i] != ref[i]) return INFINITY;
  return max_abs_diff(a, ref);
}

/// The FP8 baseline's GEMM: the device's cuBLASLt e4m3 GEMM (one per process; nullptr and a failure naming what was
/// tried when cuBLASLt cannot be loaded).
fp8::CublasLtFp8Gemm* device_fp8_gemm() {
  static std::string error;
  static fp8::CublasLtFp8Gemm* gemm = []() -> fp8::CublasLtFp8Gemm* {
    try {
      auto* g = new fp8::CublasLtFp8Gemm();
      std::printf("  [fp8 baseline] cuBLASLt e4m3 GEMM from %s\n", g->library().c_str());
      return g;
    } catch (const std::exception& e) {
      error = e.what();
      return nullptr;
    }
  }();
  if (gemm == nullptr) ADD_FAILURE() << error;
  return gemm;
}

/// Runs one case and checks out and lse against the float64 reference on the dequantized values: the kernel's error
/// is at most 2x the naive same-precision computation's (fp8::naive_fp8 with the device's FP8 GEMM: the same tensor
/// core arithmetic as the kernel's MMAs), plus a floor for float32 itself. The naive with exact float32 accumulation
/// (the baseline before run6, 1e-6-2e-5 from float64 in lse where Hopper's FP8 MMA is 1e-4-1e-2 off; FA3's lse equals
/// ours within 1.4e-6, bench/results/h200-2026-12-01-run6 call 3) is printed for comparison.
void check_fp8(const Fp8Case& c) {
  SCOPED_TRACE(c.name() + " (FLASHKV_TEST_SEED=" + std::to_string(test_seed()) + ")");
  std::mt19937_64 rng(test_seed() ^ std::hash<std::string>{}(c.name()));
  const Fp8Data r = make_data(c, rng);
  Fp8Run d(c, r);
  d.forward(c);
  EXPECT_TRUE(core::last_path().find(" sm90ws fwd ") != std::string::npos &&
              core::last_path().find("float8_e4m3fn") != std::string::npos)
      << core::last_path();
  const Fp8Result got = download(c, r, d);
  std::vector<double> ref_out, ref_lse;
  reference_forward_varlen(ref_shape(c, r), ref_options(c), r.q.deq, r.k.deq, r.v.deq, ref_out, ref_lse);
  fp8::NaiveShape ns;
  ns.cu_q = r.cu_q, ns.cu_k = r.cu_k, ns.heads = c.heads, ns.heads_kv = c.heads_kv, ns.d = c.head_dim;
  ns.softmax_scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim)), ns.softcap = c.softcap;
  ns.window_left = c.window_left, ns.window_right = c.causal ? 0 : c.window_right;
  fp8::CublasLtFp8Gemm* gemm = device_fp8_gemm();
  if (gemm == nullptr) return;
  std::vector<double> naive_out, naive_lse, exact_out, exact_lse;
  fp8::naive_fp8(ns, r.q, r.k, r.v, std::ref(*gemm), naive_out, naive_lse);
  fp8::naive_fp8(ns, r.q, r.k, r.v, fp8::gemm_exact, exact_out, exact_lse);
  const double err = max_abs_diff(got.out, ref_out), naive_err = max_abs_diff(naive_out, ref_out);
  EXPECT_LE(err, 2 * naive_err + 1e-5) << "out: kernel err " << err << " vs naive " << naive_err;
  // Floor: the lse is float32 and both it and the scores pass through a few float32 roundings and MUFU ex2/lg2
  // approximations (relative error <= 2^-22) on the way: 64 ulps of the largest |lse| (4e-6 x |lse|; the naive FP8
  // GEMM's own lse error is 1e-4-1e-2 on these inputs, a kernel bug such as an lse off by log 2 or a descale
  // applied twice is >= 0.1).
  double lse_mag = 1.0;
  for (double x : ref_lse)
    if (std::isfinite(x)) lse_mag = std::max(lse_mag, std::fabs(x));
  const double lse_floor = 64 * std::ldexp(lse_mag, -24);
  const double lerr = lse_error(got.lse, ref_lse), naive_lerr = lse_error(naive_lse, ref_lse);
  EXPECT_LE(lerr, 2 * naive_lerr + lse_floor)
      << "lse: kernel err " << lerr << " vs naive (device FP8 GEMM) " << naive_lerr << " + floor " << lse_floor;
  std::printf("  %s: out err %.3g (naive %.3g; exact-accumulation naive %.3g), lse err %.3g (naive %.3g; "
              "exact-accumulation naive %.3g)\n",
              c.name().c_str(), err, naive_err, max_abs_diff(exact_out, ref_out), lerr, naive_lerr,
              lse_error(exact_lse, ref_lse));
}

/// The FP8 head dims this build compiled (an UnsupportedError "not compiled" otherwise, printed).
bool fp8_compiled(int d) {
  try {
    cuda::select_kernel(cuda::KernelKind::fwd, KernelFamily::sm90ws, d, DType::float8_e4m3fn);
    return true;
  } catch (const UnsupportedError& e) {
    std::printf("  [not compiled] %s\n", e.what());
    return false;
  }
}

#define FLASHKV_REQUIRE_FP8() \
  if (!hopper_sm90a()) GTEST_SKIP() << "no Hopper GPU running sm_90a code (FP8 is sm90ws only)"

// The baseline's device GEMM has the layout of its host emulation (fp8::gemm_exact): on codes whose products and sums
// need <= 11 significant bits (values in {0, +-1/2, +-1, +-2}, k = 80) the tensor cores are exact, so d must equal
// the emulation bit for bit (a transposed operand or output would not); on full-range codes the two differ by the
// FP8 MMA's accumulation only (printed: the error the baseline now carries).
TEST(CudaFp8Forward, BaselineGemmLayout) {
  FLASHKV_REQUIRE_FP8();
  fp8::CublasLtFp8Gemm* gemm = device_fp8_gemm();
  if (gemm == nullptr) return;
  std::mt19937_64 rng(test_seed() + 11);
  const int m = 48, n = 32, k = 80;
  std::vector<uint8_t> a(static_cast<size_t>(m) * k), b(static_cast<size_t>(n) * k);
  std::vector<float> dev(static_cast<size_t>(m) * n), host(dev.size());
  const uint8_t small[] = {0x00, 0x30, 0x38, 0x40, 0xB0, 0xB8, 0xC0};  // 0, 1/2, 1, 2, -1/2, -1, -2
  std::uniform_int_distribution<int> pick(0, 6), code(0, 0x7E);
  for (auto& x : a) x = small[pick(rng)];
  for (auto& x : b) x = small[pick(rng)];
  (*gemm)(a.data(), b.data(), m, n, k, dev.data());
  fp8::gemm_exact(a.data(), b.data(), m, n, k, host.data());
  for (size_t i = 0; i < dev.size(); ++i) ASSERT_EQ(dev[i], host[i]) << "d[" << i / m << " * m + " << i % m << "]";
  for (auto& x : a) x = static_cast<uint8_t>(code(rng) | (rng() & 0x80));
  for (auto& x : b) x = static_cast<uint8_t>(code(rng) | (rng() & 0x80));
  (*gemm)(a.data(), b.data(), m, n, k, dev.data());
  fp8::gemm_exact(a.data(), b.data(), m, n, k, host.data());
  double err = 0, mag = 0;
  for (size_t i = 0; i < dev.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(dev[i]) - host[i]));
    mag = std::max(mag, std::fabs(static_cast<double>(host[i])));
  }
  std::printf("  [fp8 baseline] device e4m3 GEMM vs exact sums, full-range codes, k = %d: max abs err %.3g of max "
              "|d| %.3g (%.2g relative)\n",
              k, err, mag, err / mag);
  EXPECT_LE(err, mag * std::ldexp(1.0, -8)) << "the FP8 MMA keeps ~13-14 bits: far more than 8";
}

TEST(CudaFp8Forward, GridVsFloat64Reference) {
  FLASHKV_REQUIRE_FP8();
  for (int d : {64, 128, 256}) {
    if (!fp8_compiled(d)) continue;
    struct Shape {
      int sq, sk, batch, heads;
    };
    std::vector<Shape> shapes = {{1, 1, 2, 4}, {113, 203, 2, 4}, {203, 113, 2, 4}};
    if (d == 128 || full_tests()) shapes.push_back({1023, 1024, 1, 2});
    for (const Shape& s : shapes) {
      for (int variant = 0; variant < 5; ++variant) {
        if (s.sq >= 1023 && variant % 2 == 1 && !full_tests()) continue;
        Fp8Case c;
        c.head_dim = d, c.seqlen_q = s.sq, c.seqlen_k = s.sk, c.batch = s.batch, c.heads = c.heads_kv = s.heads;
        c.per_head = variant % 2 == 0;
        if (variant == 1) c.causal = true, c.heads_kv = std::max(1, s.heads / 2);           // GQA
        if (variant == 2) c.window_left = 37, c.window_right = 11, c.heads_kv = 1;          // MQA
        if (variant == 3) c.softcap = 30.f, c.causal = true;                                // softcap
        if (variant == 4) c.causal = true, c.heads_kv = std::max(1, s.heads / 2), c.strided_descale = true;
        check_fp8(c);
      }
    }
  }
}

TEST(CudaFp8Forward, VarlenWithEmptySequences) {
  FLASHKV_REQUIRE_FP8();
  for (int d : {64, 128, 256}) {
    if (!fp8_compiled(d)) continue;
    for (bool causal : {false, true}) {
      Fp8Case c;
      c.head_dim = d, c.causal = causal, c.heads = 4, c.heads_kv = 2;
      c.varlen_q = {5, 0, 133, 1, 70};
      c.varlen_k = {17, 9, 0, 300, 70};
      check_fp8(c);
      c.causal = false, c.window_left = 20, c.window_right = 3, c.per_head = false;
      check_fp8(c);
    }
  }
}

// Persistent CTAs carry the K, raw V and Vt rings and the Q buffer from tile to tile (more tiles than SMs, no mask);
// tiles without keys load Q only and store zeros; no descale tensors means scale 1; pitched inputs take the padded
// copy (1-byte elements).
TEST(CudaFp8Forward, PersistentTilesPaddedCopyAndNoDescale) {
  FLASHKV_REQUIRE_FP8();
  for (int d : {64, 128, 256}) {
    if (!fp8_compiled(d)) continue;
    Fp8Case c;
    c.head_dim = d, c.batch = 2, c.seqlen_q = 600, c.seqlen_k = 300, c.heads = 32, c.heads_kv = 8;
    check_fp8(c);
    EXPECT_TRUE(core::last_path().find(" persistent") != std::string::npos) << core::last_path();
    c.seqlen_k = 0, c.batch = 4, c.seqlen_q = 200;
    check_fp8(c);
    c = Fp8Case{};
    c.head_dim = d, c.with_descale = false, c.causal = true;
    check_fp8(c);
    c.with_descale = true, c.pitch_extra = 16;  // head stride d + 16: 16-byte aligned, goes straight to TMA
    check_fp8(c);
    c.pitch_extra = 3;  // not 16-byte aligned: the padded copy
    check_fp8(c);
    EXPECT_TRUE(core::last_path().find("padded-copy") != std::string::npos) << core::last_path();
  }
  if (fp8_compiled(128)) {  // head_dim 72 runs zero-padded on the 128 kernel (or the next compiled one)
    Fp8Case c;
    c.head_dim = 72, c.causal = true;
    check_fp8(c);
  }
}

// A NaN in the V row of a key that a causal row must not see: rows that do not see it are exact (the epilogue's
// exact rare path repairs the 0 * NaN of the boundary tile's P V), rows that see it are NaN.
TEST(CudaFp8Forward, NaNInMaskedKeyStaysMasked) {
  FLASHKV_REQUIRE_FP8();
  if (!fp8_compiled(128)) return;
  Fp8Case c;
  c.batch = 1, c.heads = c.heads_kv = 1, c.seqlen_q = c.seqlen_k = 150, c.causal = true;
  std::mt19937_64 rng(test_seed());
  Fp8Data r = make_data(c, rng);
  const int bad_key = 140;
  r.v.codes[static_cast<size_t>(bad_key) * c.head_dim + 5] = 0x7F;  // NaN
  Fp8Run d(c, r);
  d.forward(c);
  const Fp8Result got = download(c, r, d);
  r.v.deq[static_cast<size_t>(bad_key) * c.head_dim + 5] = 0.0;  // reference for the rows that do not see it
  std::vector<double> ref_out, ref_lse;
  reference_forward_varlen(ref_shape(c, r), ref_options(c), r.q.deq, r.k.deq, r.v.deq, ref_out, ref_lse);
  for (int i = 0; i < c.seqlen_q; ++i) {
    const double o5 = got.out[static_cast<size_t>(i) * c.head_dim + 5];
    if (i < bad_key) {
      EXPECT_TRUE(std::isfinite(o5)) << "row " << i << " does not see key " << bad_key;
      EXPECT_NEAR(o5, ref_out[static_cast<size_t>(i) * c.head_dim + 5], 0.1) << "row " << i;
    } else {
      EXPECT_TRUE(std::isnan(o5)) << "row " << i << " sees the NaN";
    }
  }
}

/// RMSE of the FP8 forward against float64 attention on the UNQUANTIZED values for the FA3 paper's outlier
/// distribution N(0, 1) + N(0, 100) * Bernoulli(0.001) (FA3 §4.3, Table 3), per-tensor scales, without and with
/// incoherent processing (q and k rotated by the same random-sign Walsh-Hadamard matrix along head_dim), pooled over
/// `batch` sequences of 1024 tokens x 4 heads. One 4-head sample is too noisy to judge a target by: a float64 host
/// emulation of this quantization gives 8.4e-3 +- 0.9e-3 (sd over seeds) at head_dim 128 with the rotation, because the
/// error is dominated by the few (unrotated) outliers of v; pooling 16 samples brings the sd to ~0.2e-3.
struct OutlierRmse {
  double plain = 0, rotated = 0;
};
OutlierRmse outlier_rmse(int d, int batch, std::mt19937_64& rng) {
  Fp8Case c;
  c.batch = batch, c.heads = c.heads_kv = 4, c.head_dim = d, c.seqlen_q = c.seqlen_k = 1024, c.per_head = false;
  const int64_t row = static_cast<int64_t>(c.heads) * d, rows = c.seqlen_q;
  const size_t n = static_cast<size_t>(batch * rows * row);
  auto outliers = [&](size_t m) {
    std::normal_distribution<double> g(0.0, 1.0), big(0.0, 10.0);
    std::bernoulli_distribution coin(0.001);
    std::vector<double> x(m);
    for (double& e : x) e = g(rng) + (coin(rng) ? big(rng) : 0.0);
    return x;
  };
  const std::vector<double> q = outliers(n), k = outliers(n), v = outliers(n);
  std::vector<int32_t> cu(static_cast<size_t>(batch + 1));
  for (int b = 0; b <= batch; ++b) cu[static_cast<size_t>(b)] = b * c.seqlen_q;
  // The float64 reference on the unquantized, unrotated values, one sequence per thread (independent sequences).
  std::vector<double> ref_out(n);
  const RefOptions ro = ref_options(c);
#pragma omp parallel for schedule(dynamic)
  for (int b = 0; b < batch; ++b) {
    const flashkv::testing::RefShape one{1, rows, rows, c.heads, c.heads_kv, d, d};
    const size_t off = static_cast<size_t>(b * rows * row), len = static_cast<size_t>(rows * row);
    auto part = [&](const std::vector<double>& x) { return std::vector<double>(x.begin() + off, x.begin() + off + len); };
    std::vector<double> o1, l1;
    reference_forward(one, ro, part(q), part(k), part(v), o1, l1);
    std::copy(o1.begin(), o1.end(), ref_out.begin() + static_cast<std::ptrdiff_t>(off));
  }
  auto rmse = [&](bool hadamard) {
    Fp8Data r;
    r.cu_q = r.cu_k = cu;
    std::vector<double> qr = q, kr = k;
    if (hadamard) {
      std::vector<double> sign(static_cast<size_t>(d));
      std::bernoulli_distribution coin(0.5);
      for (double& e : sign) e = coin(rng) ? 1.0 : -1.0;
      fp8::hadamard_rows(qr, d, sign);
      fp8::hadamard_rows(kr, d, sign);
    }
    r.q = fp8::quantize(qr, cu, c.heads, 1, d, false);
    r.k = fp8::quantize(kr, cu, c.heads, 1, d, false);
    r.v = fp8::quantize(v, cu, c.heads, 1, d, false);
    Fp8Run dev(c, r);
    dev.forward(c);
    const Fp8Result got = download(c, r, dev);
    double se = 0;
    for (size_t i = 0; i < ref_out.size(); ++i) se += (got.out[i] - ref_out[i]) * (got.out[i] - ref_out[i]);
    return std::sqrt(se / static_cast<double>(ref_out.size()));
  };
  OutlierRmse res;
  res.plain = rmse(false);
  res.rotated = rmse(true);
  return res;
}

// The FA3 paper's target (Table 3: 9.1e-3 with incoherent processing, against 2.4e-2 for per-tensor FP8) is checked at
// head dims 128 and 256 on 16 pooled samples (64 heads; the host emulation's mean 8.4e-3 is then ~3 sd below the
// bound at 128); at 64 the e4m3 rounding of q and k alone gives ~1.1e-2 after the rotation (a float64 host emulation
// of the same quantization: ~2.1e-2 without it), so there the numbers are reported only.
TEST(CudaFp8Forward, OutlierRmseWithAndWithoutHadamard) {
  FLASHKV_REQUIRE_FP8();
  constexpr int kSamples = 16;
  for (int d : {64, 128, 256}) {
    if (!fp8_compiled(d)) continue;
    std::mt19937_64 rng(test_seed() + static_cast<uint64_t>(d));
    const OutlierRmse e = outlier_rmse(d, kSamples, rng);
    std::printf("  [fp8 outlier RMSE] head_dim %d, %d x (seqlen 1024, 4 heads), per-tensor scales: %.3e without "
                "Hadamard, %.3e with (FA3 Table 3: 2.4e-2 / 9.1e-3)\n",
                d, kSamples, e.plain, e.rotated);
    if (d >= 128) {
      EXPECT_LE(e.rotated, 9.1e-3) << "the FA3 paper's FP8 RMSE with incoherent processing";
    }
    EXPECT_LE(e.rotated, 1.5e-2) << "incoherent processing at head_dim " << d;
    EXPECT_LT(e.rotated, e.plain) << "the rotation must lower the error on outliers";
  }
}

// Typed errors: FP8 runs on kernel family sm90ws only (UnsupportedError naming the family or the GPU), forward only;
// descales are float32 of shape [] / [1] / [batch, num_heads_kv] (Error / TypeError naming them) and only for FP8
// inputs; out must be bfloat16.
TEST(CudaFp8Forward, TypedErrors) {
  Fp8Case c;
  c.batch = 1, c.heads = c.heads_kv = 2, c.seqlen_q = c.seqlen_k = 16;
  std::mt19937_64 rng(3);
  const Fp8Data r = make_data(c, rng);
  Fp8Run d(c, r);
  for (KernelFamily f : {KernelFamily::sm80, KernelFamily::sm90}) {
    AttentionOptions o = d.options(c);
    o.kernel_family = f;
    try {
      run_forward(d.qv, d.kv, d.vv, d.ov, &d.lv, o);
      ADD_FAILURE() << "expected UnsupportedError for kernel_family " << kernel_family_name(f);
    } catch (const UnsupportedError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + kernel_family_name(f) + "'"), std::string::npos)
          << e.what();
    }
  }
  if (!hopper_sm90a()) {  // auto / sm90ws on another GPU or build: the UnsupportedError names what is missing
    AttentionOptions o = d.options(c);
    o.kernel_family = KernelFamily::automatic;
    try {
      run_forward(d.qv, d.kv, d.vv, d.ov, &d.lv, o);
      ADD_FAILURE() << "expected UnsupportedError without a Hopper GPU";
    } catch (const UnsupportedError& e) {
      std::printf("  %s\n", e.what());
      EXPECT_NE(std::string(e.what()).find("sm90"), std::string::npos) << e.what();
    }
  }
  {  // a descale of the wrong shape, dtype, or with 16-bit inputs
    AttentionOptions o = d.options(c);
    const TensorView bad_shape = dev_view(d.dq, DType::float32, {2});
    o.k_descale = &bad_shape;
    EXPECT_THROW(run_forward(d.qv, d.kv, d.vv, d.ov, &d.lv, o), Error);
    const TensorView bad_dtype = dev_view(d.dq, DType::bfloat16, {1});
    o.k_descale = &bad_dtype;
    EXPECT_THROW(run_forward(d.qv, d.kv, d.vv, d.ov, &d.lv, o), TypeError);
  }
  {  // out must be bfloat16
    TensorView o16 = d.ov;
    o16.dtype = DType::float16;
    EXPECT_THROW(run_forward(d.qv, d.kv, d.vv, o16, &d.lv, d.options(c)), TypeError);
  }
  {  // backward: forward-only
    TensorView dout = d.ov;
    EXPECT_THROW(run_backward(d.qv, d.kv, d.vv, d.ov, d.lv, dout, d.qv, d.kv, d.vv, d.options(c)),
                 UnsupportedError);
  }
}

}  // namespace
}  // namespace flashkv::cudatest
