// Engine forward pass vs an independent float64 reference of the Llama architecture (written here from the
// definition, explicit causal loop) on random GQA models; prefill vs decode vs batched decode; errors.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "flashkv/error.hpp"
#include "flashkv/kvcache.hpp"
#include "random_model.hpp"
#include "test_util.hpp"

using namespace flashkv;
using namespace flashkv::test;

namespace {

ModelConfig small_gqa() {
  ModelConfig c;
  c.dim = 64; c.hidden_dim = 48; c.n_layers = 2; c.num_heads = 4; c.num_heads_kv = 2; c.vocab_size = 50;
  c.seq_len = 40; c.head_dim = 16; c.shared_classifier = false; c.rope_theta = 10000.0f;
  return c;
}

/// float64 reference: logits [T, vocab] for tokens at positions 0..T-1 (full causal recomputation).
std::vector<double> reference_logits(const Model& m, const std::vector<int32_t>& tokens) {
  const ModelConfig& c = m.config;
  const int T = static_cast<int>(tokens.size()), D = c.dim, hd = c.head_dim, Hq = c.num_heads, Hk = c.num_heads_kv;
  const int Qd = Hq * hd, KVd = Hk * hd;
  std::vector<double> x(static_cast<std::size_t>(T) * D);
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < D; ++i) x[t * D + i] = m.token_embedding[static_cast<std::size_t>(tokens[t]) * D + i];
  auto norm = [&](const double* in, const float* w, double* out) {
    double ss = 0;
    for (int i = 0; i < D; ++i) ss += in[i] * in[i];
    const double r = 1.0 / std::sqrt(ss / D + c.norm_eps);
    for (int i = 0; i < D; ++i) out[i] = w[i] * in[i] * r;
  };
  auto mv = [](const float* w, const double* in, int out_n, int in_n, double* out) {
    for (int o = 0; o < out_n; ++o) {
      double s = 0;
      for (int i = 0; i < in_n; ++i) s += static_cast<double>(w[static_cast<std::size_t>(o) * in_n + i]) * in[i];
      out[o] = s;
    }
  };
  auto rope = [&](double* v, int heads, int pos) {
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < hd / 2; ++i) {
        const double ang = pos * std::pow(static_cast<double>(c.rope_theta), -2.0 * i / hd);
        double& a = v[h * hd + 2 * i];
        double& b = v[h * hd + 2 * i + 1];
        const double a0 = a, b0 = b;
        a = a0 * std::cos(ang) - b0 * std::sin(ang);
        b = a0 * std::sin(ang) + b0 * std::cos(ang);
      }
  };
  std::vector<double> xb(D), q(static_cast<std::size_t>(T) * Qd), k(static_cast<std::size_t>(T) * KVd),
      v(static_cast<std::size_t>(T) * KVd), att(Qd), o(D), h1(c.hidden_dim), h3(c.hidden_dim);
  for (const auto& L : m.layers) {
    for (int t = 0; t < T; ++t) {
      norm(&x[t * D], L.attn_norm, xb.data());
      mv(L.wq, xb.data(), Qd, D, &q[static_cast<std::size_t>(t) * Qd]);
      mv(L.wk, xb.data(), KVd, D, &k[static_cast<std::size_t>(t) * KVd]);
      mv(L.wv, xb.data(), KVd, D, &v[static_cast<std::size_t>(t) * KVd]);
      rope(&q[static_cast<std::size_t>(t) * Qd], Hq, t);
      rope(&k[static_cast<std::size_t>(t) * KVd], Hk, t);
    }
    std::vector<double> xn = x;
    for (int t = 0; t < T; ++t) {
      for (int h = 0; h < Hq; ++h) {
        const int kh = h / (Hq / Hk);
        std::vector<double> s(static_cast<std::size_t>(T), -INFINITY);
        double mx = -INFINITY;
        for (int j = 0; j < T; ++j) {
          if (j > t) continue;  // explicit causal mask
          double d = 0;
          for (int i = 0; i < hd; ++i) d += q[static_cast<std::size_t>(t) * Qd + h * hd + i] * k[static_cast<std::size_t>(j) * KVd + kh * hd + i];
          s[j] = d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int j = 0; j <= t; ++j) sum += std::exp(s[j] - mx);
        for (int i = 0; i < hd; ++i) {
          double acc = 0;
          for (int j = 0; j <= t; ++j) acc += std::exp(s[j] - mx) / sum * v[static_cast<std::size_t>(j) * KVd + kh * hd + i];
          att[h * hd + i] = acc;
        }
      }
      mv(L.wo, att.data(), D, Qd, o.data());
      for (int i = 0; i < D; ++i) xn[t * D + i] += o[i];
    }
    x = xn;
    for (int t = 0; t < T; ++t) {
      norm(&x[t * D], L.ffn_norm, xb.data());
      mv(L.w1, xb.data(), c.hidden_dim, D, h1.data());
      mv(L.w3, xb.data(), c.hidden_dim, D, h3.data());
      for (int i = 0; i < c.hidden_dim; ++i) h1[i] = h1[i] / (1.0 + std::exp(-h1[i])) * h3[i];
      mv(L.w2, h1.data(), D, c.hidden_dim, o.data());
      for (int i = 0; i < D; ++i) x[t * D + i] += o[i];
    }
  }
  std::vector<double> logits(static_cast<std::size_t>(T) * c.vocab_size);
  for (int t = 0; t < T; ++t) {
    norm(&x[t * D], m.final_norm, xb.data());
    mv(m.classifier, xb.data(), c.vocab_size, D, &logits[static_cast<std::size_t>(t) * c.vocab_size]);
  }
  return logits;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double e = 0;
  for (std::size_t i = 0; i < a.size(); ++i) e = std::max(e, std::fabs(a[i] - b[i]));
  return e;
}

std::vector<int32_t> random_tokens(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)));
  return t;
}

}  // namespace

TEST(Engine, PrefillMatchesFloat64ReferenceGqa) {
  const ModelConfig c = small_gqa();
  Model m = random_model(c, test_seed());
  const auto tokens = random_tokens(29, c.vocab_size, test_seed() + 1);
  const auto ref = reference_logits(m, tokens);
  Engine e(m, KVCacheSpec{}, 1);
  const int32_t s = e.add_sequence();
  std::vector<float> logits(tokens.size() * c.vocab_size);
  e.prefill(s, tokens, logits, true);
  EXPECT_LT(max_abs_diff(logits, ref), 2e-4);
  EXPECT_EQ(e.length(s), 29);
}

TEST(Engine, DecodeThroughFp32CacheMatchesReferenceAndBatchingIsInvisible) {
  const ModelConfig c = small_gqa();
  Model m = random_model(c, test_seed() + 7);
  const int n = 3, T = 33;
  std::vector<std::vector<int32_t>> toks;
  for (int b = 0; b < n; ++b) toks.push_back(random_tokens(T, c.vocab_size, test_seed() + 100 + b));
  Engine batched(m, KVCacheSpec{}, n);
  std::vector<int32_t> ids;
  for (int b = 0; b < n; ++b) ids.push_back(batched.add_sequence());
  std::vector<std::vector<float>> got(n);
  std::vector<float> logits(static_cast<std::size_t>(n) * c.vocab_size);
  for (int t = 0; t < T; ++t) {
    std::vector<int32_t> step;
    for (int b = 0; b < n; ++b) step.push_back(toks[b][t]);
    batched.decode(ids, step, logits);
    for (int b = 0; b < n; ++b)
      got[b].insert(got[b].end(), logits.begin() + b * c.vocab_size, logits.begin() + (b + 1) * c.vocab_size);
  }
  for (int b = 0; b < n; ++b) {
    EXPECT_LT(max_abs_diff(got[b], reference_logits(m, toks[b])), 2e-4) << "sequence " << b;
    // One sequence alone gives the same logits (to float32 rounding of a different BLAS blocking).
    Engine single(m, KVCacheSpec{}, 1);
    const int32_t s = single.add_sequence();
    std::vector<float> one(c.vocab_size);
    for (int t = 0; t < T; ++t) {
      single.decode(std::vector<int32_t>{s}, std::vector<int32_t>{toks[b][t]}, one);
      for (int v = 0; v < c.vocab_size; ++v) ASSERT_NEAR(one[v], got[b][t * c.vocab_size + v], 1e-4);
    }
  }
}

TEST(Engine, QuantizedCacheChangesLogitsBoundedly) {
  const ModelConfig c = small_gqa();
  Model m = random_model(c, test_seed() + 3);
  const auto tokens = random_tokens(32, c.vocab_size, test_seed() + 4);
  const auto ref = reference_logits(m, tokens);
  double ref_max = 0;
  for (float x : ref) ref_max = std::max(ref_max, std::fabs(static_cast<double>(x)));
  double prev = 0;
  // Bounds relative to the logits' scale, loose enough for any seed of this random model (seeds 1-300: int8 <= 0.9%,
  // int4 <= 12.6%, int2 <= 44.6% of max|logit|), tight enough to catch a broken codec (errors of the order of max|logit|).
  const std::pair<const char*, double> formats[] = {{"int8", 0.02}, {"int4", 0.2}, {"int2_kivi_g16", 0.6}};
  for (const auto& [fmt, rel_bound] : formats) {
    KVCacheSpec spec;
    spec.kv_cache_dtype = fmt;
    Engine e(m, spec, 1);
    const int32_t s = e.add_sequence();
    std::vector<float> all, one(c.vocab_size);
    for (int32_t t : tokens) {
      e.decode(std::vector<int32_t>{s}, std::vector<int32_t>{t}, one);
      all.insert(all.end(), one.begin(), one.end());
    }
    const double err = max_abs_diff(all, ref);
    EXPECT_GT(err, 1e-5) << fmt << ": a quantized cache must change the logits";
    EXPECT_LT(err, rel_bound * ref_max) << fmt << " (max |logit| " << ref_max << ")";
    EXPECT_GE(err, prev * 0.5) << fmt;
    prev = err;
    const KVMemory mem = e.memory();
    EXPECT_EQ(mem.tokens, 32u);
    EXPECT_GT(mem.bytes, 0u);
  }
}

TEST(Engine, ShippedModelGreedyFromBos) {
  FLASHKV_SKIP_WITHOUT_MODELS();
  LoadedModel lm = load_model_with_tokenizer(model_path(), tokenizer_path());
  Engine e(lm.model, KVCacheSpec{}, 1);
  Sampler greedy(SamplerConfig{});
  const std::vector<int32_t> bos{1};
  std::string streamed;
  auto g = generate(e, bos, 40, greedy, [&](int32_t p, int32_t t) { streamed += lm.tokenizer->decode_piece(p, t); });
  EXPECT_EQ(g.tokens.size(), 40u);
  EXPECT_EQ(g.stop, StopReason::steps);
  EXPECT_EQ(streamed, lm.tokenizer->decode(g.tokens));
  EXPECT_EQ(streamed.rfind("\"Echoes of vectors unfold", 0), 0u) << streamed;
  EXPECT_EQ(g.kv.tokens, 40u);  // BOS + 39 decoded tokens (the last sampled token is never fed)
  // fp32 codes, plus page slack: 40 tokens occupy two 32-token pages.
  EXPECT_NEAR(g.kv.effective_bits, 32.0 * 64 / 40, 1e-9);
  // Sampling: same seed → same text.
  Sampler s1(SamplerConfig{0.9f, 0.9f, 0, 5}), s2(SamplerConfig{0.9f, 0.9f, 0, 5});
  EXPECT_EQ(generate(e, bos, 30, s1).tokens, generate(e, bos, 30, s2).tokens);
  // Context end: a prompt of seq_len − 1 tokens leaves room for 2 generated tokens.
  std::vector<int32_t> long_prompt(127, 300);
  long_prompt[0] = 1;
  auto g2 = generate(e, long_prompt, 50, greedy);
  EXPECT_EQ(g2.stop, StopReason::context);
  EXPECT_EQ(g2.tokens.size(), 2u);
}

TEST(Engine, Errors) {
  const ModelConfig c = small_gqa();
  Model m = random_model(c, 1);
  KVCacheSpec bad;
  bad.kv_cache_dtype = "int3";
  EXPECT_THROW(Engine(m, bad, 1), Error);
  EXPECT_THROW(Engine(m, KVCacheSpec{}, 0), Error);
  Engine e(m, KVCacheSpec{}, 2);
  const int32_t a = e.add_sequence();
  const int32_t b = e.add_sequence();
  EXPECT_THROW(e.add_sequence(), CapacityError);
  std::vector<float> l(c.vocab_size), l2(2 * c.vocab_size);
  EXPECT_THROW(e.prefill(a, std::vector<int32_t>{1, 50}, l), Error);  // token out of range
  EXPECT_THROW(e.prefill(a, std::vector<int32_t>{}, l), Error);
  EXPECT_THROW(e.prefill(a, std::vector<int32_t>(41, 1), l), Error);  // longer than seq_len
  EXPECT_THROW(e.prefill(a, std::vector<int32_t>{1, 2}, std::span<float>(l2.data(), 7)), Error);
  e.prefill(a, std::vector<int32_t>{1, 2}, l);
  EXPECT_THROW(e.prefill(a, std::vector<int32_t>{1}, l), Error);  // not empty
  EXPECT_THROW(e.decode(std::vector<int32_t>{a, a}, std::vector<int32_t>{1, 1}, l2), Error);
  EXPECT_THROW(e.decode(std::vector<int32_t>{a, 7}, std::vector<int32_t>{1, 1}, l2), Error);
  EXPECT_THROW(e.decode(std::vector<int32_t>{a}, std::vector<int32_t>{-1}, l), Error);
  EXPECT_THROW(e.remove_sequence(9), Error);
  e.remove_sequence(b);
  // Fill a sequence to the context end, then one more decode is rejected.
  const int32_t f = e.add_sequence();
  e.prefill(f, std::vector<int32_t>(40, 3), {});
  EXPECT_THROW(e.decode(std::vector<int32_t>{f}, std::vector<int32_t>{3}, l), Error);
  Sampler s(SamplerConfig{});
  EXPECT_THROW(generate(e, std::vector<int32_t>{1}, 0, s), Error);
  EXPECT_THROW(generate(e, std::vector<int32_t>(41, 1), 3, s), Error);
}

TEST(Engine, ChunkedExtendThroughTheCacheMatchesReference) {
  const ModelConfig c = small_gqa();
  Model m = random_model(c, test_seed() + 11);
  const auto tokens = random_tokens(37, c.vocab_size, test_seed() + 12);
  const auto ref = reference_logits(m, tokens);
  // fp32 cache: any chunking (first chunk through extend or prefill) computes the same function.
  for (const std::vector<int>& chunks : {std::vector<int>{37}, {5, 13, 1, 18}, {1, 1, 35}}) {
    for (bool first_prefill : {false, true}) {
      Engine e(m, KVCacheSpec{}, 2);
      const int32_t other = e.add_sequence();  // a second, unrelated sequence in the same cache
      e.prefill(other, random_tokens(9, c.vocab_size, 5), {});
      const int32_t s = e.add_sequence();
      std::vector<float> got;
      std::size_t at = 0;
      for (std::size_t k = 0; k < chunks.size(); ++k) {
        const std::span<const int32_t> chunk(tokens.data() + at, static_cast<std::size_t>(chunks[k]));
        std::vector<float> l(chunk.size() * c.vocab_size);
        if (k == 0 && first_prefill) e.prefill(s, chunk, l, true);
        else e.extend(s, chunk, l, true);
        got.insert(got.end(), l.begin(), l.end());
        at += chunk.size();
      }
      EXPECT_EQ(e.length(s), 37);
      EXPECT_EQ(e.length(other), 9);
      EXPECT_LT(max_abs_diff(got, ref), 2e-4) << chunks.size() << " chunks, prefill first " << first_prefill;
      // last-token logits only
      std::vector<float> last(c.vocab_size);
      e.extend(s, std::vector<int32_t>{tokens[0]}, last);
      EXPECT_EQ(e.length(s), 38);
    }
  }
}

TEST(Engine, ExtendReadsTheQuantizedHistory) {
  // With a quantized cache, extend() attends over the quantized values (prefill() over the fresh float32 ones): the
  // chunked logits must equal token-by-token decode through the same cache, and differ from prefill's.
  // One layer: with two, a code that one path rounds to its neighbour (below) changes the next layer's inputs, whose
  // codes then flip too, and a random model amplifies that chaotically (0.675 of 2.5 at one seed in ten).
  ModelConfig c = small_gqa();
  c.n_layers = 1;
  Model m = random_model(c, test_seed() + 21);
  const auto tokens = random_tokens(24, c.vocab_size, test_seed() + 22);
  KVCacheSpec spec;
  spec.kv_cache_dtype = "int4";
  Engine e(m, spec, 3);
  const int32_t a = e.add_sequence(), b = e.add_sequence(), p = e.add_sequence();
  std::vector<float> chunked(tokens.size() * c.vocab_size), stepped, prefilled(tokens.size() * c.vocab_size);
  e.extend(a, std::span<const int32_t>(tokens).subspan(0, 10), std::span<float>(chunked).subspan(0, 10 * c.vocab_size), true);
  e.extend(a, std::span<const int32_t>(tokens).subspan(10), std::span<float>(chunked).subspan(10 * c.vocab_size), true);
  std::vector<float> one(c.vocab_size);
  for (int32_t t : tokens) {
    e.decode(std::vector<int32_t>{b}, std::vector<int32_t>{t}, one);
    stepped.insert(stepped.end(), one.begin(), one.end());
  }
  e.prefill(p, tokens, prefilled, true);
  double d_step = 0, d_prefill = 0;
  for (std::size_t i = 0; i < chunked.size(); ++i) {
    d_step = std::max(d_step, static_cast<double>(std::fabs(chunked[i] - stepped[i])));
    d_prefill = std::max(d_prefill, static_cast<double>(std::fabs(chunked[i] - prefilled[i])));
  }
  // The two paths compute each token's K/V with different matmul shapes (float32 rounding ~1e-6); int4 codes are a
  // step function of those values, so a value on a rounding boundary can take the neighbouring code in one path
  // (typically d_step ~1e-5; with one flipped code up to 0.17 of d_prefill in 300 seeds). Reading the quantized
  // history keeps the two paths at least 4x closer to each other than to prefill's fresh float32 values (an extend
  // that attended over float32 history would sit at ~1x), which is what the test is for.
  std::printf("[extend] chunked vs stepped %.3g, chunked vs prefill %.3g\n", d_step, d_prefill);
  EXPECT_LT(d_step, 0.25 * d_prefill);
  EXPECT_GT(d_prefill, 1e-3);
}

TEST(Engine, MaxContextAndExtendErrors) {
  const ModelConfig c = small_gqa();
  Model m = random_model(c, 2);
  EXPECT_THROW(Engine(m, KVCacheSpec{}, 1, c.seq_len + 1), Error);
  EXPECT_THROW(Engine(m, KVCacheSpec{}, 1, -1), Error);
  Engine e(m, KVCacheSpec{}, 1, 16);
  EXPECT_EQ(e.max_context(), 16);
  const int32_t s = e.add_sequence();
  std::vector<float> l(c.vocab_size);
  e.extend(s, std::vector<int32_t>(10, 1), l);
  EXPECT_THROW(e.extend(s, std::vector<int32_t>(7, 1), l), Error);  // 10 + 7 > 16
  EXPECT_THROW(e.extend(s, std::vector<int32_t>{}, l), Error);
  EXPECT_THROW(e.extend(s, std::vector<int32_t>{99}, l), Error);
  EXPECT_THROW(e.extend(s, std::vector<int32_t>{1, 2}, std::span<float>(l.data(), 3)), Error);
  e.extend(s, std::vector<int32_t>(6, 1), l);
  EXPECT_THROW(e.decode(std::vector<int32_t>{s}, std::vector<int32_t>{1}, l), Error);  // full
  // generate_in on a full sequence, generate with a prompt over the context: errors naming the prompt
  Sampler g(SamplerConfig{});
  EXPECT_THROW(generate_in(e, s, std::vector<int32_t>{1}, g, GenerateOptions{}), Error);
  EXPECT_THROW(generate(e, std::vector<int32_t>(17, 1), 2, g), Error);
}

TEST(Engine, GenerateInContinuesAConversationAndStopTokens) {
  const ModelConfig c = small_gqa();
  Model m = random_model(c, test_seed() + 31);
  // Make every token a stop token except the prompt: generation stops at once; ignore_stop_tokens runs all steps.
  m.stop_tokens.clear();
  for (int32_t t = 0; t < c.vocab_size; ++t) m.stop_tokens.push_back(t);
  m.bos_token = -1;
  Engine e(m, KVCacheSpec{}, 1);
  const int32_t s = e.add_sequence();
  Sampler g(SamplerConfig{});
  GenerateOptions o;
  o.steps = 5;
  GenerationResult r = generate_in(e, s, std::vector<int32_t>{1, 2, 3}, g, o);
  EXPECT_EQ(r.stop, StopReason::eos);
  EXPECT_TRUE(r.tokens.empty());
  EXPECT_GE(r.stop_token, 0);
  EXPECT_EQ(e.length(s), 3);
  o.ignore_stop_tokens = true;
  o.keep_logits = true;
  r = generate_in(e, s, std::vector<int32_t>{4}, g, o);  // continues the same sequence through extend()
  EXPECT_EQ(r.tokens.size(), 5u);
  EXPECT_EQ(r.logits.size(), 5u);
  EXPECT_EQ(r.stop, StopReason::steps);
  EXPECT_EQ(e.length(s), 3 + 1 + 4);  // the last sampled token is not fed
}

TEST(Engine, SmolLM2ConfigAndChunkedPrefill) {
  FLASHKV_REQUIRE_SMOLLM2();
  LoadedModel lm = load_named_model("smollm2-135m");
  const ModelConfig& c = lm.model.config;
  EXPECT_EQ(lm.alias, "smollm2-135m");
  EXPECT_EQ(lm.model.format, CheckpointFormat::gguf);
  EXPECT_EQ(c.dim, 576);
  EXPECT_EQ(c.hidden_dim, 1536);
  EXPECT_EQ(c.n_layers, 30);
  EXPECT_EQ(c.num_heads, 9);
  EXPECT_EQ(c.num_heads_kv, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.seq_len, 8192);
  EXPECT_EQ(c.rope_theta, 100000.0f);
  EXPECT_EQ(c.norm_eps, 1e-5f);
  EXPECT_TRUE(c.shared_classifier);
  EXPECT_EQ(lm.model.classifier, lm.model.token_embedding);
  EXPECT_EQ(lm.model.stop_tokens, (std::vector<int32_t>{0, 2}));
  int q41 = 0, q80 = 0, f32 = 0;
  for (const auto& [name, type] : lm.model.tensor_types) {
    q41 += type == "Q4_1";
    q80 += type == "Q8_0";
    f32 += type == "F32";
  }
  EXPECT_EQ(q41, 210);
  EXPECT_EQ(q80, 1);
  EXPECT_EQ(f32, 61);
  // Prefill vs extend in chunks of 16 + the rest through an fp32 cache: the same function.
  const std::vector<int32_t> tokens = lm.tokenizer->encode_prompt(
      "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs, then count 1 2 3.");
  ASSERT_GT(tokens.size(), 24u);
  Engine e(lm.model, KVCacheSpec{}, 2, 256);
  const int32_t a = e.add_sequence(), b = e.add_sequence();
  std::vector<float> pre(tokens.size() * c.vocab_size), ext(tokens.size() * c.vocab_size);
  e.prefill(a, tokens, pre, true);
  const std::size_t h = 16;
  e.extend(b, std::span<const int32_t>(tokens).subspan(0, h), std::span<float>(ext).subspan(0, h * c.vocab_size), true);
  e.extend(b, std::span<const int32_t>(tokens).subspan(h), std::span<float>(ext).subspan(h * c.vocab_size), true);
  double d = 0;
  for (std::size_t i = 0; i < pre.size(); ++i) d = std::max(d, static_cast<double>(std::fabs(pre[i] - ext[i])));
  EXPECT_LT(d, 1e-3);
}

TEST(Engine, KvCapacityPagesAdmitOnDemandAndRefuseBeforeWriting) {
  const ModelConfig c = small_gqa();  // seq_len 40
  Model m = random_model(c, test_seed() + 21);
  KVCacheSpec spec;
  spec.page_size = 16;
  EngineOptions o;
  o.kv_capacity_pages = 3;  // 48 token slots shared by all sequences
  Engine e(m, spec, 3, 0, o);
  const int32_t a = e.add_sequence(), b = e.add_sequence();
  std::vector<float> l(c.vocab_size);
  e.prefill(a, random_tokens(20, c.vocab_size, 1), l);  // 2 pages
  // 17 tokens need 2 pages, 1 is free: refused before anything runs; the sequence stays empty and usable.
  EXPECT_THROW(e.prefill(b, random_tokens(17, c.vocab_size, 2), l), CapacityError);
  EXPECT_EQ(e.length(b), 0);
  e.prefill(b, random_tokens(16, c.vocab_size, 3), l);  // exactly the last page
  // b's next token starts a new page: none free. a's stays inside its second page.
  std::vector<float> two(2 * c.vocab_size);
  EXPECT_THROW(e.decode(std::vector<int32_t>{a, b}, std::vector<int32_t>{5, 6}, two), CapacityError);
  EXPECT_EQ(e.length(a), 20);
  EXPECT_EQ(e.length(b), 16);
  // a alone decodes; its logits equal a fresh engine's (nothing of the refused step was written).
  e.decode(std::vector<int32_t>{a}, std::vector<int32_t>{5}, l);
  Engine fresh(m, spec, 1);
  const int32_t f = fresh.add_sequence();
  std::vector<float> lf(c.vocab_size);
  fresh.prefill(f, random_tokens(20, c.vocab_size, 1), lf);
  fresh.decode(std::vector<int32_t>{f}, std::vector<int32_t>{5}, lf);
  EXPECT_EQ(l, lf);
  // Retiring a frees its pages for b.
  e.remove_sequence(a);
  e.decode(std::vector<int32_t>{b}, std::vector<int32_t>{6}, l);
  EXPECT_EQ(e.length(b), 17);
  EXPECT_THROW(Engine(m, spec, 1, 0, EngineOptions{Device::cpu, 0, -1}), Error);
}

TEST(Engine, SampleDrawsFromTheLastCallsLogits) {
  const ModelConfig c = small_gqa();
  Model m = random_model(c, test_seed() + 22);
  Engine e(m, KVCacheSpec{}, 2);
  Sampler g(SamplerConfig{});
  Sampler* one[1] = {&g};
  EXPECT_THROW(e.sample(one), Error);  // no logits yet
  const int32_t a = e.add_sequence(), b = e.add_sequence();
  std::vector<float> all(5 * c.vocab_size);
  const auto toks = random_tokens(5, c.vocab_size, 7);
  e.prefill(a, toks, all, /*all_logits=*/true);
  // prefill: one row, the last token's
  const std::vector<float> last(all.end() - c.vocab_size, all.end());
  EXPECT_EQ(e.sample(one)[0], Sampler(SamplerConfig{}).sample(last));
  e.prefill(b, toks, {});  // no logits requested: still kept for sample()
  EXPECT_EQ(e.sample(one)[0], Sampler(SamplerConfig{}).sample(last));
  std::vector<float> two(2 * c.vocab_size);
  e.decode(std::vector<int32_t>{a, b}, std::vector<int32_t>{3, 4}, two);
  Sampler s1(SamplerConfig{0.9f, 0.8f, 10, 3}), s2(SamplerConfig{1.1f, 1.0f, 0, 4});
  Sampler r1(SamplerConfig{0.9f, 0.8f, 10, 3}), r2(SamplerConfig{1.1f, 1.0f, 0, 4});
  Sampler* pair[2] = {&s1, &s2};
  const std::vector<int32_t> got = e.sample(pair);
  EXPECT_EQ(got[0], r1.sample(std::span<const float>(two).subspan(0, c.vocab_size)));
  EXPECT_EQ(got[1], r2.sample(std::span<const float>(two).subspan(c.vocab_size)));
  EXPECT_THROW(e.sample(one), Error);  // two rows, one sampler
  Sampler* null_one[2] = {&s1, nullptr};
  EXPECT_THROW(e.sample(null_one), Error);
}

TEST(Engine, CudaDeviceWithoutTheCudaEngineIsUnsupported) {
  const ModelConfig c = small_gqa();
  Model m = random_model(c, 1);
  EngineOptions o;
  o.device = Device::cuda;  // this test binary never links the CUDA engine backend
  KVCacheSpec spec;
  spec.kv_cache_dtype = "bf16";
  EXPECT_THROW(Engine(m, spec, 1, 0, o), UnsupportedError);
}

// The page rule the engine's up-front CapacityError check uses (kvcache.hpp, TOKENS AND WINDOWS): a sequence of n tokens
// holds ceil(n_q / page_size) pages, n_q = round_down(max(0, n − sinks − residual), Gq), Gq = the KIVI group or 1.
TEST(Engine, PageRuleOfTheCapacityCheckMatchesTheCache) {
  struct Case {
    const char* dtype;
    int32_t sinks, residual, group;
  };
  for (const Case& k : {Case{"fp32", 0, 0, 1}, Case{"int8", 4, 16, 1}, Case{"int4_kivi_g16", 0, 16, 16},
                        Case{"int2_kivi_g16", 3, 0, 16}, Case{"k:int4_kivi_g16,v:int8", 2, 8, 16}}) {
    KVCacheConfig c;
    c.num_layers = 2;
    c.num_heads_kv = 2;
    c.head_dim = 16;
    c.with_kv_cache_dtype(k.dtype);
    c.page_size = 16;
    c.sink_tokens = k.sinks;
    c.residual_tokens = k.residual;
    PagedKVCache cache(c);
    cache.add_sequence(0);
    std::vector<float> row(2 * 16, 0.5f);
    for (int64_t n = 1; n <= 90; ++n) {
      for (int32_t l = 0; l < 2; ++l) {
        auto kv = TensorView::contiguous(row.data(), DType::float32, {1, 2, 16});
        cache.append(0, l, kv, kv);
      }
      int64_t nq = std::max<int64_t>(0, n - k.sinks - k.residual);
      nq -= nq % k.group;
      ASSERT_EQ(cache.memory_report().pages_used, (nq + 15) / 16) << k.dtype << " after " << n << " tokens";
    }
  }
}
