// Engine::append_synthetic (the benchmark's context fill): the cache then holds exactly the documented values, so a
// decode after it equals a float64 reference whose history IS those values (K post-RoPE, as the cache stores it);
// errors and the page budget are checked before anything is written.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <set>
#include <vector>

#include "engine/synthetic_kv.hpp"
#include "flashkv/engine.hpp"
#include "flashkv/error.hpp"
#include "random_model.hpp"
#include "test_util.hpp"

using namespace flashkv;
using namespace flashkv::test;
using engine_detail::synthetic_kv_value;

namespace {

ModelConfig small() {
  ModelConfig c;
  c.dim = 64; c.hidden_dim = 48; c.n_layers = 2; c.num_heads = 4; c.num_heads_kv = 2; c.vocab_size = 50;
  c.seq_len = 64; c.head_dim = 16; c.shared_classifier = false; c.rope_theta = 10000.0f;
  return c;
}

/// float64 logits of `token` decoded at position n after a history of n synthetic tokens (seed) in every layer,
/// from the model's definition (rmsnorm, GQA attention over the history plus the token's own rotated k / v, SwiGLU).
std::vector<double> reference_after_synthetic(const Model& m, int n, uint64_t seed, int32_t token) {
  const ModelConfig& c = m.config;
  const int D = c.dim, hd = c.head_dim, Hq = c.num_heads, Hk = c.num_heads_kv, L = c.n_layers;
  std::vector<double> x(D), xb(D), q(Hq * hd), k(Hk * hd), v(Hk * hd), att(Hq * hd), o(D), h1(c.hidden_dim),
      h3(c.hidden_dim);
  for (int i = 0; i < D; ++i) x[i] = m.token_embedding[static_cast<std::size_t>(token) * D + i];
  auto norm = [&](const std::vector<double>& in, const float* w, std::vector<double>& out) {
    double ss = 0;
    for (int i = 0; i < D; ++i) ss += in[i] * in[i];
    const double r = 1.0 / std::sqrt(ss / D + c.norm_eps);
    for (int i = 0; i < D; ++i) out[i] = w[i] * in[i] * r;
  };
  auto mv = [](const float* w, const double* in, int out_n, int in_n, double* out) {
    for (int r = 0; r < out_n; ++r) {
      double s = 0;
      for (int i = 0; i < in_n; ++i) s += static_cast<double>(w[static_cast<std::size_t>(r) * in_n + i]) * in[i];
      out[r] = s;
    }
  };
  auto rope = [&](std::vector<double>& vec, int heads) {
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < hd / 2; ++i) {
        const double ang = n * std::pow(static_cast<double>(c.rope_theta), -2.0 * i / hd);
        const double a = vec[h * hd + 2 * i], b = vec[h * hd + 2 * i + 1];
        vec[h * hd + 2 * i] = a * std::cos(ang) - b * std::sin(ang);
        vec[h * hd + 2 * i + 1] = a * std::sin(ang) + b * std::cos(ang);
      }
  };
  for (int l = 0; l < L; ++l) {
    const LayerWeights& W = m.layers[static_cast<std::size_t>(l)];
    norm(x, W.attn_norm, xb);
    mv(W.wq, xb.data(), Hq * hd, D, q.data());
    mv(W.wk, xb.data(), Hk * hd, D, k.data());
    mv(W.wv, xb.data(), Hk * hd, D, v.data());
    rope(q, Hq);
    rope(k, Hk);
    for (int h = 0; h < Hq; ++h) {
      const int kh = h / (Hq / Hk);
      auto key = [&](int j, int e) { return j < n ? synthetic_kv_value(seed, 0, l, j, kh, e, L, Hk, hd) : k[kh * hd + e]; };
      auto val = [&](int j, int e) { return j < n ? synthetic_kv_value(seed, 1, l, j, kh, e, L, Hk, hd) : v[kh * hd + e]; };
      std::vector<double> s(static_cast<std::size_t>(n + 1));
      double mx = -INFINITY;
      for (int j = 0; j <= n; ++j) {
        double d = 0;
        for (int e = 0; e < hd; ++e) d += q[h * hd + e] * key(j, e);
        s[j] = d / std::sqrt(static_cast<double>(hd));
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (int j = 0; j <= n; ++j) sum += std::exp(s[j] - mx);
      for (int e = 0; e < hd; ++e) {
        double acc = 0;
        for (int j = 0; j <= n; ++j) acc += std::exp(s[j] - mx) / sum * val(j, e);
        att[h * hd + e] = acc;
      }
    }
    mv(W.wo, att.data(), D, Hq * hd, o.data());
    for (int i = 0; i < D; ++i) x[i] += o[i];
    norm(x, W.ffn_norm, xb);
    mv(W.w1, xb.data(), c.hidden_dim, D, h1.data());
    mv(W.w3, xb.data(), c.hidden_dim, D, h3.data());
    for (int i = 0; i < c.hidden_dim; ++i) h1[i] = h1[i] / (1.0 + std::exp(-h1[i])) * h3[i];
    mv(W.w2, h1.data(), D, c.hidden_dim, o.data());
    for (int i = 0; i < D; ++i) x[i] += o[i];
  }
  std::vector<double> logits(static_cast<std::size_t>(c.vocab_size));
  norm(x, m.final_norm, xb);
  mv(m.classifier, xb.data(), c.vocab_size, D, logits.data());
  return logits;
}

double max_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double e = 0;
  for (std::size_t i = 0; i < a.size(); ++i) e = std::max(e, std::fabs(a[i] - b[i]));
  return e;
}

}  // namespace

TEST(EngineSynthetic, ValuesAreTheDocumentedSetAndDeterministic) {
  std::set<float> seen;
  double mean = 0;
  const int n = 1 << 16;
  for (int i = 0; i < n; ++i) {
    const float x = synthetic_kv_value(7, i & 1, (i >> 1) % 3, i / 97, (i >> 3) % 2, i % 16, 3, 2, 16);
    EXPECT_EQ(x, synthetic_kv_value(7, i & 1, (i >> 1) % 3, i / 97, (i >> 3) % 2, i % 16, 3, 2, 16));
    EXPECT_TRUE(x >= -2.0f && x <= 127.0f / 64.0f && std::ldexp(x, 6) == std::nearbyint(std::ldexp(x, 6))) << x;
    seen.insert(x);
    mean += x / n;
  }
  EXPECT_EQ(seen.size(), 256u);           // every one of the 256 values occurs
  EXPECT_NEAR(mean, -1.0 / 128.0, 0.02);  // uniform over (k − 128) / 64: mean −1/128
  int differ = 0;  // another seed, another stream
  for (int i = 0; i < 1000; ++i)
    differ += synthetic_kv_value(1, 0, 0, i, 0, 0, 1, 1, 16) != synthetic_kv_value(2, 0, 0, i, 0, 0, 1, 1, 16);
  EXPECT_GT(differ, 950);
}

TEST(EngineSynthetic, DecodeAfterTheFillMatchesTheFloat64Reference) {
  const ModelConfig c = small();
  const uint64_t seed = test_seed();
  Model m = random_model(c, seed + 5);
  KVCacheSpec spec;  // fp32: the cache holds the values exactly
  spec.page_size = 16;
  Engine e(m, spec, 2);
  const int32_t s = e.add_sequence(), other = e.add_sequence();
  e.append_synthetic(other, 9, seed + 1);  // another sequence: must not leak into s
  e.append_synthetic(s, 21, seed);         // 21 tokens: two pages, the second partly filled
  EXPECT_EQ(e.length(s), 21);
  std::vector<float> logits(static_cast<std::size_t>(c.vocab_size));
  const int32_t tok = static_cast<int32_t>(seed % c.vocab_size);
  e.decode(std::vector<int32_t>{s}, std::vector<int32_t>{tok}, logits);
  const double err = max_diff(logits, reference_after_synthetic(m, 21, seed, tok));
  std::printf("[engine] decode after 21 synthetic tokens vs float64: max |dlogit| %.3g\n", err);
  EXPECT_LT(err, 2e-4);
  // A second fill continues the positions (22 .. 30) with the same seed's values: as one fill of 31 tokens.
  Engine one(m, spec, 1);
  const int32_t t = one.add_sequence();
  one.append_synthetic(t, 31, seed);
  e.remove_sequence(s);
  const int32_t s2 = e.add_sequence();
  e.append_synthetic(s2, 20, seed);
  e.append_synthetic(s2, 11, seed);
  std::vector<float> a(logits.size()), b(logits.size());
  e.decode(std::vector<int32_t>{s2}, std::vector<int32_t>{tok}, a);
  one.decode(std::vector<int32_t>{t}, std::vector<int32_t>{tok}, b);
  EXPECT_EQ(a, b);
  EXPECT_LT(max_diff(b, reference_after_synthetic(m, 31, seed, tok)), 2e-4);
}

TEST(EngineSynthetic, ErrorsAndThePageBudgetComeBeforeAnyWrite) {
  const ModelConfig c = small();
  Model m = random_model(c, test_seed() + 9);
  KVCacheSpec spec;
  spec.kv_cache_dtype = "int8";
  spec.page_size = 16;
  EngineOptions o;
  o.kv_capacity_pages = 2;  // 32 token slots
  Engine e(m, spec, 2, 0, o);
  const int32_t s = e.add_sequence();
  auto names = [](const std::function<void()>& f, const char* arg) {
    try {
      f();
      ADD_FAILURE() << "no error for " << arg;
    } catch (const CapacityError&) {
      ADD_FAILURE() << "CapacityError instead of an argument error for " << arg;
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find(arg), std::string::npos) << err.what();
    }
  };
  names([&] { e.append_synthetic(s, 0); }, "n_tokens");
  names([&] { e.append_synthetic(s, 65); }, "n_tokens");  // the model's context is 64
  names([&] { e.append_synthetic(5, 4); }, "seq");
  e.append_synthetic(s, 20);
  const std::size_t bytes = e.memory().bytes;
  EXPECT_THROW(e.append_synthetic(s, 13), CapacityError);  // 33 tokens need a third page
  EXPECT_EQ(e.length(s), 20);
  EXPECT_EQ(e.memory().bytes, bytes);
  e.append_synthetic(s, 12);  // 32 fit
  EXPECT_EQ(e.length(s), 32);
  Sampler greedy(SamplerConfig{});
  Sampler* p[1] = {&greedy};
  EXPECT_THROW(e.sample(p), Error);  // the fill computed no logits
}
