// The FA3 paper's FP8 outlier study (FA3 §4.3, Table 3) on the sm90ws FP8 forward: RMSE against float64 attention on
// the unquantized values, per-tensor scales, with and without incoherent processing (a random-sign Walsh-Hadamard
// rotation of q and k, fp8_test_util.hpp). The cases and the device call: fp8_attention_case.hpp (shared with
// test_attention_fp8_cuda.cpp). Skipped (exit 77) without a GPU; needs a Hopper GPU running sm_90a code.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda_test_util.hpp"
#include "fp8_attention_case.hpp"
#include "fp8_test_util.hpp"

namespace flashkv::cudatest {
namespace {

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

}  // namespace
}  // namespace flashkv::cudatest
