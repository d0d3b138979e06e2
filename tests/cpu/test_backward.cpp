// Backward: the FA2 backward (src/cpu/backward.cpp) against float64 reference gradients over a sampled grid
// (FLASHKV_FULL_TESTS=1: larger), the reference gradients themselves against central finite differences of the
// reference forward, determinism (bit-identical across runs and thread counts), varlen, GQA/MQA accumulation.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "attention_harness.hpp"
#include "common/reference.hpp"
#include "flashkv/attention.hpp"

using namespace flashkv;
using namespace flashkv::testing;

namespace {

std::vector<AttnCase> grid() {
  std::vector<AttnCase> cases;
  const bool full = full_tests();
  const int64_t dims_default[] = {8, 32, 59, 64, 128, 256};
  const int64_t dims_full[] = {8, 16, 32, 59, 64, 96, 128, 256};
  struct Pair { int64_t q, k; };
  const Pair pairs_default[] = {{1, 1}, {113, 203}, {203, 113}, {128, 217}};
  const Pair pairs_full[] = {{1, 1}, {113, 203}, {203, 113}, {128, 217}, {1, 4096}, {1023, 1024}, {1024, 1023}};
  const DType dtypes[] = {DType::float32, DType::float16, DType::bfloat16};
  int idx = 0;
  for (DType t : dtypes) {
    for (int64_t d : full ? std::vector<int64_t>(std::begin(dims_full), std::end(dims_full))
                          : std::vector<int64_t>(std::begin(dims_default), std::end(dims_default))) {
      const auto& pairs = full ? std::vector<Pair>(std::begin(pairs_full), std::end(pairs_full))
                               : std::vector<Pair>(std::begin(pairs_default), std::end(pairs_default));
      for (const Pair& pr : pairs) {
        ++idx;
        if (!full && d == 256 && pr.q > 1 && pr.k > 1 && idx % 2 == 0) continue;  // keep the default run short
        AttnCase c;
        c.dtype = t;
        c.head_dim = d;
        c.seqlen_q = pr.q;
        c.seqlen_k = pr.k;
        c.batch = pr.q * pr.k > 100000 ? 1 : 2;
        switch (idx % 4) {
          case 0: break;
          case 1: c.causal = true; break;
          case 2: c.window_size_left = 31; c.window_size_right = 0; break;
          case 3: c.window_size_left = 17; c.window_size_right = 9; break;
        }
        c.softcap = (idx / 4) % 2 ? 30.0f : 0.0f;
        switch (idx % 3) {
          case 0: c.num_heads = 2; c.num_heads_kv = 2; break;
          case 1: c.num_heads = 4; c.num_heads_kv = 2; break;
          case 2: c.num_heads = 3; c.num_heads_kv = 1; break;
        }
        if (pr.q * pr.k > 100000) c.num_heads = c.num_heads / c.num_heads_kv, c.num_heads_kv = 1;
        cases.push_back(c);
      }
    }
  }
  return cases;
}

class BackwardGrid : public ::testing::TestWithParam<AttnCase> {};

TEST_P(BackwardGrid, MatchesFloat64ReferenceGradients) {
  const AttnCase& c = GetParam();
  const CheckResult r = check_backward(c, 0x2000 + static_cast<uint64_t>(c.head_dim * 977 + c.seqlen_k));
  if (std::getenv("FLASHKV_TEST_VERBOSE") != nullptr) std::fprintf(stderr, "%s", r.report.c_str());
  EXPECT_TRUE(r.ok) << r.report;
}

INSTANTIATE_TEST_SUITE_P(Cpu, BackwardGrid, ::testing::ValuesIn(grid()),
                         [](const ::testing::TestParamInfo<AttnCase>& info) {
                           const AttnCase& c = info.param;
                           return std::string(dtype_name(c.dtype)) + "_d" + std::to_string(c.head_dim) + "_q" +
                                  std::to_string(c.seqlen_q) + "_k" + std::to_string(c.seqlen_k) + "_" +
                                  std::to_string(info.index);
                         });

// ---- features the grid samples only once, each checked explicitly ---------------------------------------------------

TEST(Backward, VarlenWithEmptySequences) {
  for (DType t : {DType::float32, DType::bfloat16}) {
    AttnCase c;
    c.dtype = t;
    c.head_dim = 40;
    c.num_heads = 4;
    c.num_heads_kv = 2;
    c.causal = true;
    c.varlen_q = {5, 0, 70, 1, 0, 33};
    c.varlen_k = {9, 4, 70, 0, 0, 100};
    const CheckResult r = check_backward(c, 0x2101 + static_cast<int>(t));
    EXPECT_TRUE(r.ok) << r.report;
  }
}

TEST(Backward, MqaSoftcapLargeLogitsAndPaddedStrides) {
  AttnCase c;
  c.head_dim = 24;
  c.head_dim_v = 40;
  c.num_heads = 4;
  c.num_heads_kv = 1;
  c.seqlen_q = 70;
  c.seqlen_k = 90;
  c.softcap = 5.0f;
  c.input_std = 3.0;  // logits far into the tanh saturation
  c.pad = 3;
  const CheckResult r = check_backward(c, 0x2102);
  EXPECT_TRUE(r.ok) << r.report;
}

TEST(Backward, DeterministicAcrossRunsAndThreadCounts) {
  std::mt19937_64 rng = make_rng(0x2103);
  HostTensor q(DType::float32, {2, 150, 4, 32}), k(DType::float32, {2, 170, 2, 32}), v(DType::float32, {2, 170, 2, 32});
  HostTensor out(DType::float32, {2, 150, 4, 32}), lse(DType::float32, {2, 4, 150}), dout = out;
  q.randn(rng);
  k.randn(rng);
  v.randn(rng);
  dout.randn(rng);
  AttentionOptions o;
  o.causal = true;
  attention_forward(q.view, k.view, v.view, out.view, &lse.view, o);
  std::vector<std::vector<unsigned char>> results;
  for (int threads : {1, 2, 3, 1}) {
    HostTensor dq = q, dk = k, dv = v;
    o.num_threads = threads;
    attention_backward(q.view, k.view, v.view, out.view, lse.view, dout.view, dq.view, dk.view, dv.view, o);
    std::vector<unsigned char> all = dq.bytes;
    all.insert(all.end(), dk.bytes.begin(), dk.bytes.end());
    all.insert(all.end(), dv.bytes.begin(), dv.bytes.end());
    results.push_back(all);
  }
  for (std::size_t i = 1; i < results.size(); ++i) EXPECT_EQ(results[i], results[0]) << "run " << i;
}

// The float64 reference gradients (which the kernel is checked against) must themselves match central finite
// differences of the float64 reference forward, for L = Σ out∘dout, including softcap, GQA and a window.
TEST(Backward, ReferenceGradientsMatchFiniteDifferences) {
  std::mt19937_64 rng = make_rng(0x2104);
  RefShape s{1, 5, 7, 4, 2, 3, 2};
  for (int variant = 0; variant < 3; ++variant) {
    RefOptions o;
    o.softmax_scale = 0.7;
    if (variant == 1) o.causal = true;
    if (variant == 2) o.softcap = 1.5, o.window_size_left = 2, o.window_size_right = 1;
    std::normal_distribution<double> n01(0.0, 1.0);
    auto randv = [&](std::size_t n) {
      std::vector<double> x(n);
      for (double& e : x) e = n01(rng);
      return x;
    };
    std::vector<double> q = randv(1 * 5 * 4 * 3), k = randv(1 * 7 * 2 * 3), v = randv(1 * 7 * 2 * 2);
    const std::vector<double> dout = randv(1 * 5 * 4 * 2);
    std::vector<double> dq, dk, dv, out, lse;
    reference_backward(s, o, q, k, v, dout, dq, dk, dv);
    auto loss = [&]() {
      reference_forward(s, o, q, k, v, out, lse);
      double l = 0.0;
      for (std::size_t i = 0; i < out.size(); ++i) l += out[i] * dout[i];
      return l;
    };
    const double h = 1e-6;
    auto check = [&](std::vector<double>& x, const std::vector<double>& g, const char* name) {
      for (std::size_t i = 0; i < x.size(); ++i) {
        const double x0 = x[i];
        x[i] = x0 + h;
        const double lp = loss();
        x[i] = x0 - h;
        const double lm = loss();
        x[i] = x0;
        EXPECT_NEAR(g[i], (lp - lm) / (2 * h), 1e-6) << name << "[" << i << "] variant " << variant;
      }
    };
    check(q, dq, "dq");
    check(k, dk, "dk");
    check(v, dv, "dv");
  }
}

// The kernel's own gradients against central finite differences of the kernel's own float32 forward (tiny shape,
// step 1e-2: truncation O(h²) and float32 noise O(eps·|L|/h) are both ~1e-4), with softcap, GQA and a window.
TEST(Backward, KernelGradientsMatchFiniteDifferencesOfKernelForward) {
  std::mt19937_64 rng = make_rng(0x2105);
  HostTensor q(DType::float32, {1, 5, 2, 4}), k(DType::float32, {1, 7, 1, 4}), v(DType::float32, {1, 7, 1, 3});
  HostTensor out(DType::float32, {1, 5, 2, 3}), lse(DType::float32, {1, 2, 5});
  q.randn(rng);
  k.randn(rng);
  v.randn(rng);
  HostTensor dout = out;
  dout.randn(rng);
  AttentionOptions o;
  o.softcap = 2.0f;
  o.window_size_left = 3;
  o.window_size_right = 1;
  attention_forward(q.view, k.view, v.view, out.view, &lse.view, o);
  HostTensor dq = q, dk = k, dv = v;
  attention_backward(q.view, k.view, v.view, out.view, lse.view, dout.view, dq.view, dk.view, dv.view, o);
  auto loss = [&]() {
    HostTensor o2 = out;
    attention_forward(q.view, k.view, v.view, o2.view, nullptr, o);
    double l = 0.0;
    for (int64_t i = 0; i < o2.numel(); ++i) l += o2.get(i) * dout.get(i);
    return l;
  };
  const double h = 1e-2;
  auto check = [&](HostTensor& x, const HostTensor& g, const char* name) {
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double x0 = x.get(i);
      x.set(i, x0 + h);
      const double lp = loss();
      x.set(i, x0 - h);
      const double lm = loss();
      x.set(i, x0);
      EXPECT_NEAR(g.get(i), (lp - lm) / (2 * h), 2e-3) << name << "[" << i << "]";
    }
  };
  check(q, dq, "dq");
  check(k, dk, "dk");
  check(v, dv, "dv");
}

}  // namespace
