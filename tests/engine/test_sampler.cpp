// Sampler: greedy ties, determinism per seed, temperature, and top-k / top-p on hand-made distributions (exact kept
// sets and empirical frequencies vs the renormalized target).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "flashkv/error.hpp"
#include "test_util.hpp"

using namespace flashkv;
using namespace flashkv::test;

namespace {
std::vector<float> logits_of(const std::vector<double>& p) {
  std::vector<float> l;
  for (double x : p) l.push_back(static_cast<float>(std::log(x)));
  return l;
}
std::vector<double> frequencies(Sampler& s, const std::vector<float>& logits, int n) {
  std::vector<double> f(logits.size(), 0.0);
  for (int i = 0; i < n; ++i) f[static_cast<std::size_t>(s.sample(logits))] += 1.0 / n;
  return f;
}
}  // namespace

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
  Sampler s({});
  EXPECT_EQ(s.sample(std::vector<float>{0.1f, 3.0f, -1.0f, 3.0f}), 1);
  EXPECT_EQ(s.sample(std::vector<float>{-5.0f}), 0);
  EXPECT_THROW(s.sample(std::vector<float>{}), Error);
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferentTokens) {
  std::mt19937_64 rng(test_seed());
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> logits(512);
  for (auto& l : logits) l = nd(rng);
  SamplerConfig c{1.0f, 0.9f, 40, test_seed() | 1};
  Sampler a(c), b(c);
  c.seed += 1;
  Sampler d(c);
  std::vector<int32_t> ta, tb, td;
  for (int i = 0; i < 200; ++i) {
    ta.push_back(a.sample(logits));
    tb.push_back(b.sample(logits));
    td.push_back(d.sample(logits));
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, td);
}

TEST(Sampler, TopKKeepsExactlyKMostProbable) {
  Sampler s({1.0f, 1.0f, 2, 7});
  auto p = s.distribution(logits_of({0.1, 0.4, 0.2, 0.3}));
  EXPECT_DOUBLE_EQ(p[0], 0.0);
  EXPECT_DOUBLE_EQ(p[2], 0.0);
  EXPECT_NEAR(p[1], 0.4 / 0.7, 1e-6);
  EXPECT_NEAR(p[3], 0.3 / 0.7, 1e-6);
  auto f = frequencies(s, logits_of({0.1, 0.4, 0.2, 0.3}), 20000);
  EXPECT_EQ(f[0], 0.0);
  EXPECT_EQ(f[2], 0.0);
  EXPECT_NEAR(f[1], 0.4 / 0.7, 0.02);
}

TEST(Sampler, TopPKeepsSmallestNucleus) {
  // Sorted: 0.5 (id 2), 0.3 (id 0), 0.15 (id 3), 0.05 (id 1). top_p 0.7 → {2, 0}; 0.9 → {2, 0, 3}; 0.4 → {2}.
  const auto l = logits_of({0.3, 0.05, 0.5, 0.15});
  auto p = Sampler({1.0f, 0.7f, 0, 1}).distribution(l);
  EXPECT_NEAR(p[2], 0.5 / 0.8, 1e-6);
  EXPECT_NEAR(p[0], 0.3 / 0.8, 1e-6);
  EXPECT_EQ(p[1], 0.0);
  EXPECT_EQ(p[3], 0.0);
  p = Sampler({1.0f, 0.9f, 0, 1}).distribution(l);
  EXPECT_NEAR(p[3], 0.15 / 0.95, 1e-6);
  EXPECT_EQ(p[1], 0.0);
  p = Sampler({1.0f, 0.4f, 0, 1}).distribution(l);
  EXPECT_EQ(p[2], 1.0);
  Sampler s({1.0f, 0.7f, 0, test_seed() | 1});
  auto f = frequencies(s, l, 20000);
  EXPECT_EQ(f[1], 0.0);
  EXPECT_EQ(f[3], 0.0);
  EXPECT_NEAR(f[2], 0.625, 0.02);
}

TEST(Sampler, TopKThenTopP) {
  // top_k 3 → {2, 0, 3} with mass 0.95; top_p 0.8 of that mass (0.76) → {2, 0} (0.8 >= 0.76).
  auto p = Sampler({1.0f, 0.8f, 3, 1}).distribution(logits_of({0.3, 0.05, 0.5, 0.15}));
  EXPECT_NEAR(p[2], 0.625, 1e-6);
  EXPECT_NEAR(p[0], 0.375, 1e-6);
  EXPECT_EQ(p[3], 0.0);
}

TEST(Sampler, TemperatureSharpensAndFlattens) {
  const auto l = logits_of({0.6, 0.3, 0.1});
  auto cold = Sampler({0.5f, 1.0f, 0, 1}).distribution(l);
  auto hot = Sampler({2.0f, 1.0f, 0, 1}).distribution(l);
  EXPECT_NEAR(cold[0], 0.36 / (0.36 + 0.09 + 0.01), 1e-6);
  EXPECT_GT(cold[0], 0.6);
  EXPECT_LT(hot[0], 0.6);
  Sampler s({1.0f, 1.0f, 0, test_seed() | 1});
  auto f = frequencies(s, l, 20000);
  EXPECT_NEAR(f[0], 0.6, 0.02);
  EXPECT_NEAR(f[2], 0.1, 0.015);
}

TEST(Sampler, InvalidConfigs) {
  EXPECT_THROW(Sampler({-1.0f, 1.0f, 0, 1}), Error);
  EXPECT_THROW(Sampler({NAN, 1.0f, 0, 1}), Error);
  EXPECT_THROW(Sampler({1.0f, 0.0f, 0, 1}), Error);
  EXPECT_THROW(Sampler({1.0f, 1.5f, 0, 1}), Error);
  EXPECT_THROW(Sampler({1.0f, 1.0f, -3, 1}), Error);
}
