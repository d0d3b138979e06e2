// Host-only checks of the FP8 GPU tests' naive baseline (tests/cuda/fp8_test_util.hpp; run here so that CI, which has
// no GPU, checks them): the zero padding and K-major packing for the cuBLASLt "TN" FP8 GEMM, and naive_fp8's layout,
// descale, GQA, varlen and mask handling — with the exact-sum GEMM emulation its lse must equal the float64 reference
// on the dequantized values up to float32 rounding, and its out up to the e4m3 rounding of P.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "common/reference.hpp"
#include "cuda/fp8_test_util.hpp"

namespace {

using namespace flashkv::cudatest;
using flashkv::testing::max_abs_diff;

TEST(Fp8NaiveBaseline, PackKMajorPadsWithZeroCodes) {
  // A 3 x 5 block read with strides (7, 2) from a buffer of distinct codes.
  std::vector<uint8_t> src(64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i + 1);
  const auto p = fp8::pack_kmajor(src.data(), 3, 5, 7, 2);
  ASSERT_EQ(p.size(), 16u * 16u);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      EXPECT_EQ(p[static_cast<size_t>(r) * 16 + c], r < 3 && c < 5 ? src[static_cast<size_t>(r) * 7 + c * 2] : 0)
          << r << "," << c;
  EXPECT_EQ(fp8::pad16(1), 16);
  EXPECT_EQ(fp8::pad16(16), 16);
  EXPECT_EQ(fp8::pad16(72), 80);
  EXPECT_EQ(fp8::e4m3_value(0), 0.0);  // the padding code adds exact zeros
}

TEST(Fp8NaiveBaseline, GemmExactIsTheTnProduct) {
  std::mt19937_64 rng(flashkv::testing::test_seed());
  std::uniform_int_distribution<int> code(0, 0x7E);
  const int m = 32, n = 16, k = 48;
  std::vector<uint8_t> a(static_cast<size_t>(m) * k), b(static_cast<size_t>(n) * k);
  for (auto& x : a) x = static_cast<uint8_t>(code(rng) | (rng() & 0x80));
  for (auto& x : b) x = static_cast<uint8_t>(code(rng) | (rng() & 0x80));
  std::vector<float> d(static_cast<size_t>(m) * n);
  fp8::gemm_exact(a.data(), b.data(), m, n, k, d.data());
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      double s = 0;
      for (int l = 0; l < k; ++l) s += fp8::e4m3_value(a[i * k + l]) * fp8::e4m3_value(b[j * k + l]);
      EXPECT_EQ(d[static_cast<size_t>(j) * m + i], static_cast<float>(s));
    }
}

struct Case {
  int heads, heads_kv, d;
  std::vector<int32_t> lq, lk;
  bool per_head, causal;
  int window_left = -1, window_right = -1;
  double softcap = 0;
};

TEST(Fp8NaiveBaseline, ExactGemmNaiveMatchesFloat64Reference) {
  const std::vector<Case> cases = {
      {4, 2, 72, {5, 0, 33, 1, 20}, {17, 9, 0, 40, 20}, true, false},  // GQA, varlen, empty, head_dim padded 72 -> 80
      {4, 1, 64, {19, 7}, {23, 31}, false, true},                      // MQA, causal, per-tensor
      {2, 2, 128, {17}, {50}, true, false, 9, 3, 20.0},                // window + softcap
  };
  std::mt19937_64 rng(flashkv::testing::test_seed() + 15);
  std::normal_distribution<double> g(0.0, 1.0);
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  for (const Case& c : cases) {
    std::vector<int32_t> cu_q = {0}, cu_k = {0};
    for (size_t b = 0; b < c.lq.size(); ++b) cu_q.push_back(cu_q.back() + c.lq[b]), cu_k.push_back(cu_k.back() + c.lk[b]);
    const int G = c.heads / c.heads_kv;
    auto make = [&](int rows, int heads) {
      std::vector<double> x(static_cast<size_t>(rows) * heads * c.d);
      const double f = std::exp2(u(rng));  // not unit scale: the descales matter
      for (double& e : x) e = g(rng) * f;
      return x;
    };
    const auto qx = make(cu_q.back(), c.heads), kx = make(cu_k.back(), c.heads_kv),
               vx = make(cu_k.back(), c.heads_kv);
    const auto q = fp8::quantize(qx, cu_q, c.heads, G, c.d, c.per_head);
    const auto k = fp8::quantize(kx, cu_k, c.heads_kv, 1, c.d, c.per_head);
    const auto v = fp8::quantize(vx, cu_k, c.heads_kv, 1, c.d, c.per_head);
    fp8::NaiveShape ns;
    ns.cu_q = cu_q, ns.cu_k = cu_k, ns.heads = c.heads, ns.heads_kv = c.heads_kv, ns.d = c.d;
    ns.softmax_scale = 1.0 / std::sqrt(static_cast<double>(c.d)), ns.softcap = c.softcap;
    ns.window_left = c.window_left, ns.window_right = c.causal ? 0 : c.window_right;
    std::vector<double> out, lse;
    fp8::naive_fp8(ns, q, k, v, fp8::gemm_exact, out, lse);

    flashkv::testing::RefVarlenShape rs;
    rs.cu_seqlens_q.assign(cu_q.begin(), cu_q.end());
    rs.cu_seqlens_k.assign(cu_k.begin(), cu_k.end());
    rs.num_heads = c.heads, rs.num_heads_kv = c.heads_kv, rs.head_dim = rs.head_dim_v = c.d;
    flashkv::testing::RefOptions ro;
    ro.softmax_scale = ns.softmax_scale, ro.causal = c.causal, ro.softcap = c.softcap;
    ro.window_size_left = c.window_left, ro.window_size_right = c.window_right;
    std::vector<double> ref_out, ref_lse;
    flashkv::testing::reference_forward_varlen(rs, ro, q.deq, k.deq, v.deq, ref_out, ref_lse);
    ASSERT_EQ(lse.size(), ref_lse.size());
    double lse_err = 0, vmax = 0;
    for (size_t i = 0; i < lse.size(); ++i) {
      if (std::isinf(ref_lse[i]) || std::isinf(lse[i])) {
        EXPECT_EQ(lse[i], ref_lse[i]) << "row " << i << " (no visible key: -inf in both)";
        continue;
      }
      lse_err = std::max(lse_err, std::fabs(lse[i] - ref_lse[i]));
    }
    for (double x : v.deq) vmax = std::max(vmax, std::fabs(x));
    // Exact sums: only float32 (scores, exp, the sum l) separates the naive's lse from float64.
    EXPECT_LE(lse_err, 1e-5) << "heads " << c.heads << "/" << c.heads_kv << " d " << c.d;
    // out: P rounded to e4m3 (relative error <= 2^-4 per element), accumulated exactly, then bfloat16.
    EXPECT_LE(max_abs_diff(out, ref_out), 0.04 * vmax) << "heads " << c.heads << "/" << c.heads_kv << " d " << c.d;
    // A wrong descale (k's applied twice) is far outside that (>= 100x the bound above, on every seed: scores of
    // inputs scaled by 2^-2 move by ~2e-2 at least): the check the GPU tests make can fail.
    auto k2 = k;
    for (float& s : k2.descale) s *= 2.f;
    std::vector<double> out2, lse2;
    fp8::naive_fp8(ns, q, k2, v, fp8::gemm_exact, out2, lse2);
    double bad = 0;
    for (size_t i = 0; i < lse2.size(); ++i)
      if (std::isfinite(ref_lse[i])) bad = std::max(bad, std::fabs(lse2[i] - ref_lse[i]));
    EXPECT_GT(bad, 1e-3);
  }
}

}  // namespace
