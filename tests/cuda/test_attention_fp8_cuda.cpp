// FP8 (float8_e4m3fn q/k/v, bfloat16 out) forward of the sm90ws family (sm90/mainloop_fwd_tma_ws_fp8.cuh) against
// a float64 reference on the dequantized values (tolerance: 2x the error of the naive same-precision computation,
// fp8_test_util.hpp naive_fp8 with the device's own FP8 GEMM through cuBLASLt, fp8_gemm_cublaslt.hpp; lse too) for
// head dims 64/128/256 (those compiled: FLASHKV_CUDA_FP8_HEADDIMS) x causal / window / softcap / GQA-MQA / varlen x
// descales per tensor / per (batch, kv head) (incl. strided descale views), persistent tiles, padded copies, a NaN in
// a masked key; and the typed errors. The cases: fp8_attention_case.hpp; the FA3-paper outlier study (RMSE vs float64
// on unquantized values, with and without Hadamard incoherent processing): test_attention_fp8_outlier_cuda.cpp.
// Skipped (exit 77) without a GPU; the suites need a Hopper GPU running sm_90a code, else they check the
// UnsupportedError.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/path_log.hpp"
#include "core/validate.hpp"
#include "cuda/attention_cuda.hpp"
#include "cuda_test_util.hpp"
#include "flashkv/attention.hpp"
#include "flashkv/error.hpp"
#include "fp8_attention_case.hpp"
#include "fp8_gemm_cublaslt.hpp"
#include "fp8_test_util.hpp"

namespace flashkv::cudatest {
namespace {

using flashkv::testing::full_tests;

/// The backward's validation and CUDA backend (FP8 is forward-only: TypedErrors).
void run_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                  const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                  const TensorView& dv, const AttentionOptions& o) {
  cuda::attention_backward_cuda(core::make_backward_problem(q, k, v, out, lse, dout, dq, dk, dv, o), nullptr);
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
