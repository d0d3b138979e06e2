// The real-model evaluation tools on the shipped 260K model (and on the same weights with a longer context for the
// passkey prompts): llama-perplexity statistics against hand-computed values, the protocol's chunking and scoring,
// fp32 against itself exactly, chunked prefill through the cache against the exact prefill, passkey prompts, keys,
// trials and heatmaps, the speed protocol, and the KIVI group fitting of generate/eval/demo.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "eval/demo.hpp"
#include "skip_without_models.hpp"
#include "eval/passkey.hpp"
#include "eval/perplexity.hpp"
#include "eval/prompt.hpp"
#include "eval/report.hpp"
#include "eval/serve.hpp"
#include "eval/speed.hpp"
#include "flashkv/error.hpp"

using namespace flashkv;
using namespace flashkv::eval;

namespace {
const LoadedModel& shipped() {
  static const LoadedModel lm =
      load_model_with_tokenizer(shipped_models_dir() + "/aidreams260K.bin",
                                shipped_models_dir() + "/aidreams260K.tok512.bin");
  return lm;
}
/// The shipped weights with the context raised to 1024 tokens (RoPE is defined at every position), so that passkey
/// prompts fit. Retrieval quality is meaningless here; the mechanics are what is tested.
const LoadedModel& long_context() {
  static LoadedModel lm = [] {
    LoadedModel l = load_model_with_tokenizer(shipped_models_dir() + "/aidreams260K.bin",
                                              shipped_models_dir() + "/aidreams260K.tok512.bin");
    l.model.config.seq_len = 1024;
    return l;
  }();
  return lm;
}
uint64_t seed() {
  static const uint64_t s = [] {
    const char* e = std::getenv("FLASHKV_TEST_SEED");
    const uint64_t v = e ? std::strtoull(e, nullptr, 10) : std::random_device{}();
    std::printf("FLASHKV_TEST_SEED=%llu\n", static_cast<unsigned long long>(v));
    return v;
  }();
  return s;
}
std::vector<int32_t> random_tokens(std::size_t n, int32_t vocab, uint64_t s) {
  std::mt19937_64 g(s);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(3 + g() % static_cast<uint64_t>(vocab - 3));
  return t;
}
}  // namespace

TEST(TextStats, HandComputed) {
  // 12 positions (llama.cpp reports uncertainties from n > 10 on).
  std::vector<double> nref, nfmt, kld, dp;
  std::vector<uint8_t> same;
  for (int i = 0; i < 12; ++i) {
    nref.push_back(1.0 + 0.1 * i);
    nfmt.push_back(1.0 + 0.1 * i + (i % 3 == 0 ? 0.2 : 0.0));
    kld.push_back(0.01 * i);
    dp.push_back(i % 2 ? 0.1 : -0.1);
    same.push_back(i < 9 ? 1 : 0);
  }
  const TextStats s = text_stats(nref, nfmt, kld, dp, same);
  double mf = 0, mr = 0;
  for (int i = 0; i < 12; ++i) mf += nfmt[i] / 12, mr += nref[i] / 12;
  EXPECT_NEAR(s.ppl, std::exp(mf), 1e-12);
  EXPECT_NEAR(s.delta_ppl, std::exp(mf) - std::exp(mr), 1e-12);
  EXPECT_NEAR(s.kld_mean, 0.055, 1e-12);
  EXPECT_NEAR(s.kld_max, 0.11, 1e-12);
  EXPECT_NEAR(s.kld_p99, 0.11 * 0.10 + 0.89 * 0.11, 1e-12);  // rank 0.99 * 11 = 10.89: between 0.10 and 0.11
  EXPECT_NEAR(s.kld_median, 0.055, 1e-12);
  EXPECT_NEAR(s.rms_dp, 0.1, 1e-12);
  EXPECT_NEAR(s.same_top1, 0.75, 1e-12);
  EXPECT_NEAR(s.same_top1_err, std::sqrt(0.75 * 0.25 / 11), 1e-12);
  double var = 0;
  for (double x : nfmt) var += (x - mf) * (x - mf) / 12;
  EXPECT_NEAR(s.ppl_err, s.ppl * std::sqrt(var / 11), 1e-12);
  EXPECT_THROW(text_stats(nref, nfmt, kld, dp, {}), Error);
}

TEST(CompareRows, ExactForIdenticalAndHandMadeKl) {
  const std::vector<float> a = {std::log(0.5f), std::log(0.25f), std::log(0.25f)};
  const std::vector<float> b = {std::log(0.25f), std::log(0.5f), std::log(0.25f)};
  RowCompare r = compare_rows(a.data(), a.data(), 3, 1);
  EXPECT_EQ(r.kld, 0.0);
  EXPECT_TRUE(r.same_top1);
  r = compare_rows(a.data(), b.data(), 3, 1);
  EXPECT_NEAR(r.kld, 0.25 * std::log(2.0), 1e-7);
  EXPECT_FALSE(r.same_top1);
  EXPECT_NEAR(r.logp_next, std::log(0.25), 1e-6);
  EXPECT_NEAR(r.logq_next, std::log(0.5), 1e-6);
}

TEST(Extend, OneTokenEqualsDecodeAndChunksMatchExactPrefill) {
  FLASHKV_SKIP_WITHOUT_MODELS();
  const Model& m = shipped().model;
  const std::size_t V = static_cast<std::size_t>(m.config.vocab_size);
  const auto toks = random_tokens(100, m.config.vocab_size, seed());
  for (const char* fmt : {"fp32", "int4", "int2_kivi_g16"}) {
    KVCacheSpec spec = parse_format_item(fmt);
    Engine a(m, spec, 1), b(m, spec, 1);
    const int32_t sa = a.add_sequence(), sb = b.add_sequence();
    std::vector<float> la(V), lb(V);
    for (int32_t t : toks) {
      const int32_t one[1] = {t}, sq[1] = {sb};
      a.extend(sa, one, la, false);
      b.decode(sq, one, lb);
      ASSERT_EQ(la, lb) << fmt;  // the same computation, bit for bit
    }
  }
  // fp32 cache: chunked extend (ubatch 16) vs one exact prefill of all tokens: same function, different order.
  Engine p(m, KVCacheSpec{}, 1), e(m, KVCacheSpec{}, 1);
  const int32_t sp = p.add_sequence(), se = e.add_sequence();
  std::vector<float> lp(toks.size() * V), le(toks.size() * V), part(16 * V);
  p.prefill(sp, toks, lp, true);
  for (std::size_t u = 0; u < toks.size(); u += 16) {
    const std::size_t n = std::min<std::size_t>(16, toks.size() - u);
    part.resize(n * V);
    e.extend(se, std::span<const int32_t>(toks.data() + u, n), part, true);
    std::copy(part.begin(), part.end(), le.begin() + static_cast<std::ptrdiff_t>(u * V));
  }
  double worst = 0;
  for (std::size_t i = 0; i < lp.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(lp[i]) - le[i]));
  EXPECT_LT(worst, 2e-4);
  // the context limit is checked before anything is appended
  const std::vector<int32_t> many(29, 5);
  EXPECT_THROW(e.extend(se, many, {}, false), Error);
  EXPECT_EQ(e.length(se), 100);
}

TEST(Perplexity, ProtocolChunksScoresAndReference) {
  FLASHKV_SKIP_WITHOUT_MODELS();
  const LoadedModel& lm = shipped();
  const Model& m = lm.model;
  const auto toks = random_tokens(300, m.config.vocab_size, seed() + 1);
  PerplexityOptions o;
  o.n_ctx = 64;
  o.ubatch = 24;  // ubatches straddle the scored half
  o.bos_id = 1;
  const std::vector<KVCacheSpec> specs = {parse_format_item("fp32"), parse_format_item("bf16"), parse_format_item("int4")};
  int64_t last = 0, total = 0;
  const TextResult r = evaluate_text(m, specs, toks, o, [&](int64_t d, int64_t t) { last = d, total = t; });
  EXPECT_EQ(r.chunks, 4);  // 300 / 64, partial chunk dropped
  EXPECT_EQ(r.reference.scored, 4 * (64 / 2 - 1));
  EXPECT_EQ(last, total);
  EXPECT_EQ(total, 4 * 64 * 4);
  ASSERT_EQ(r.rows.size(), 3u);
  const TextStats& self = r.rows[0].stats;
  EXPECT_EQ(self.kld_mean, 0.0);
  EXPECT_EQ(self.kld_max, 0.0);
  EXPECT_EQ(self.same_top1, 1.0);
  EXPECT_EQ(self.delta_ppl, 0.0);
  EXPECT_EQ(self.ppl, r.reference.ppl);
  EXPECT_GT(r.rows[1].stats.kld_mean, 0.0);
  EXPECT_LT(r.rows[1].stats.kld_mean, r.rows[2].stats.kld_mean);
  EXPECT_DOUBLE_EQ(r.rows[0].bytes_per_token, 2 * r.rows[1].bytes_per_token);
  // Reference PPL from an independent computation: exact prefill of each chunk (BOS first), log-softmax in double.
  const std::size_t V = static_cast<std::size_t>(m.config.vocab_size);
  double nll = 0;
  int n = 0;
  for (int c = 0; c < 4; ++c) {
    std::vector<int32_t> chunk(toks.begin() + c * 64, toks.begin() + (c + 1) * 64);
    chunk[0] = 1;
    Engine e(m, KVCacheSpec{}, 1);
    const int32_t s = e.add_sequence();
    std::vector<float> l(64 * V);
    e.prefill(s, chunk, l, true);
    for (int j = 32; j < 63; ++j) {
      const float* x = l.data() + static_cast<std::size_t>(j) * V;
      double mx = -INFINITY, sum = 0;
      for (std::size_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(x[v]));
      for (std::size_t v = 0; v < V; ++v) sum += std::exp(x[v] - mx);
      nll += -(x[chunk[static_cast<std::size_t>(j + 1)]] - mx - std::log(sum));
      ++n;
    }
  }
  EXPECT_NEAR(r.reference.ppl, std::exp(nll / n), 1e-4 * r.reference.ppl);
  // ubatch does not change the fp32 reference beyond float rounding
  PerplexityOptions o2 = o;
  o2.ubatch = 64;
  const TextResult r2 = evaluate_text(m, {}, toks, o2);
  EXPECT_NEAR(r2.reference.ppl, r.reference.ppl, 1e-4 * r.reference.ppl);
  const std::string table = text_table(r);
  EXPECT_NE(table.find("| fp32 (reference)"), std::string::npos);
  EXPECT_NE(table.find("| int4"), std::string::npos);
  EXPECT_EQ(text_to_json(r)["formats"].size(), 3u);
  o.n_ctx = 400;
  EXPECT_THROW(evaluate_text(m, specs, toks, o), Error);  // > the model's context
  o.n_ctx = 64;
  EXPECT_THROW(evaluate_text(m, specs, std::vector<int32_t>(toks.begin(), toks.begin() + 63), o), Error);
  o.ubatch = 0;
  EXPECT_THROW(evaluate_text(m, specs, toks, o), Error);
}

TEST(Passkey, PromptsKeysAndTrials) {
  FLASHKV_SKIP_WITHOUT_MODELS();
  const LoadedModel& lm = long_context();
  const std::string k = passkey_key(7, 1024, 2, 1);
  EXPECT_EQ(k.size(), 5u);
  EXPECT_EQ(k, passkey_key(7, 1024, 2, 1));
  EXPECT_NE(k, passkey_key(7, 1024, 2, 2));
  const std::string msg = passkey_user_message(4, 1, "12345");
  const auto at = msg.find("The pass key is 12345. Remember it. 12345 is the pass key.");
  const auto first = msg.find("The grass is green.");
  ASSERT_NE(at, std::string::npos);
  EXPECT_LT(first, at);                                            // one filler repetition before the needle
  EXPECT_EQ(msg.find("The grass is green.", first + 1) > at, true);  // and the next one after it
  EXPECT_EQ(msg.rfind("What is the pass key?"), msg.size() - std::string("What is the pass key?").size());
  // the prompt fills the budget: one more repetition would not fit
  const auto p = passkey_prompt(lm, 600, 0.5, "55555", 12);
  EXPECT_LE(p.size(), 588u);
  EXPECT_GT(p.size(), 588u - 40u);
  EXPECT_THROW(passkey_prompt(lm, 100, 0.5, "55555", 12), Error);
  EXPECT_THROW(passkey_prompt(lm, 2000, 0.5, "55555", 12), Error);

  PasskeyOptions o;
  o.contexts = {400, 700};
  o.depths = {0.0, 1.0};
  o.keys = 2;
  o.answer_tokens = 6;
  o.ubatch = 128;
  int64_t last = 0, total = 0;
  const PasskeyResult r = run_passkey(lm, {parse_format_item("fp32"), parse_format_item("int4")}, o,
                                      [&](int64_t d, int64_t t) { last = d, total = t; });
  EXPECT_EQ(last, total);
  ASSERT_EQ(r.formats.size(), 2u);  // fp32 once (the reference), int4
  for (const auto& f : r.formats) {
    ASSERT_EQ(f.trials.size(), 8u);
    for (const auto& t : f.trials) {
      EXPECT_LE(t.prompt_tokens + o.answer_tokens, t.context);
      EXPECT_LE(t.answer.size(), 6u);
      EXPECT_EQ(t.success, t.answer_text.find(t.key) != std::string::npos);
    }
  }
  EXPECT_EQ(r.formats[0].identical_answers(), 8);
  EXPECT_EQ(r.formats[0].trials[3].key, r.formats[1].trials[3].key);
  const std::string svg = passkey_heatmap_svg(r.formats[1], o, "m");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("/2</text>"), std::string::npos);
  EXPECT_NE(passkey_table(r).find("| int4"), std::string::npos);
  EXPECT_EQ(passkey_to_json(r)["formats"][1]["trials"].size(), 8u);
  o.depths = {1.5};
  EXPECT_THROW(run_passkey(lm, {}, o), Error);
  o.depths = {0.5};
  o.keys = 0;
  EXPECT_THROW(run_passkey(lm, {}, o), Error);
}

TEST(Speed, ProtocolDepthsAndRates) {
  FLASHKV_SKIP_WITHOUT_MODELS();
  const Model& m = shipped().model;
  SpeedOptions o;
  o.contexts = {128};
  o.n_prompt = 32;
  o.n_gen = 8;
  o.repeats = 2;
  const auto rows = run_speed(m, {parse_format_item("bf16"), parse_format_item("int8")}, o);
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& r : rows) {
    EXPECT_EQ(r.depth, 128 - 40);
    ASSERT_EQ(r.pp.size(), 2u);
    EXPECT_GT(r.pp_mean, 0);
    EXPECT_GT(r.tg_mean, 0);
    EXPECT_GT(r.bytes_per_token, 0);
  }
  EXPECT_NE(speed_table(rows).find("| int8"), std::string::npos);
  o.contexts = {20};
  EXPECT_THROW(run_speed(m, {parse_format_item("bf16")}, o), Error);
}

TEST(Serve, ReplayCompletesEveryRequestUnderDeferralAndPreemption) {
  FLASHKV_SKIP_WITHOUT_MODELS();
  const Model& m = shipped().model;  // context 128
  ServeOptions o;
  o.requests = 10;
  o.prompt_min = 8, o.prompt_max = 40;
  o.output_min = 4, o.output_max = 60;
  o.max_batch = 4;
  o.seed = 3;
  KVCacheSpec spec = parse_format_item("bf16");
  spec.page_size = 16;
  const ServeResult roomy = run_serve(m, {spec}, o).at(0);  // pool for 4 sequences of 100 tokens: nothing waits
  EXPECT_EQ(roomy.preemptions, 0);
  EXPECT_EQ(roomy.deferred_admissions, 0);
  EXPECT_EQ(roomy.max_batch_seen, 4);
  o.kv_capacity_pages = 9;  // 144 token slots for up to 4 sequences of up to 100 tokens
  const ServeResult tight = run_serve(m, {spec}, o).at(0);
  EXPECT_GT(tight.preemptions + tight.deferred_admissions, 0);
  for (const ServeResult& r : {roomy, tight}) {
    EXPECT_EQ(r.requests, 10);
    EXPECT_GT(r.generated_tokens, 10 * 4 - 1);
    EXPECT_LE(r.generated_tokens, 10 * 60);
    EXPECT_GT(r.decode_tokens_per_s, 0);
    EXPECT_LE(r.itl_ms_p50, r.itl_ms_p90);
    EXPECT_LE(r.itl_ms_p90, r.itl_ms_p99);
    EXPECT_LE(r.itl_ms_p99, r.itl_ms_max);
    EXPECT_LE(r.mean_batch, 4.0);
    EXPECT_GT(r.mean_batch, 0.0);
  }
  // The same seeded requests whatever the pool: every request finished its full output in both runs.
  EXPECT_EQ(roomy.generated_tokens, tight.generated_tokens);
  EXPECT_EQ(roomy.prompt_tokens, tight.prompt_tokens);
  EXPECT_NE(serve_table({roomy, tight}).find("| bf16 |"), std::string::npos);
  o.kv_capacity_pages = 1;  // 16 slots: the longest sequence can never fit
  EXPECT_THROW(run_serve(m, {spec}, o), Error);
  o.kv_capacity_pages = 0;
  o.output_max = 100;  // 40 + 100 > 128
  EXPECT_THROW(run_serve(m, {spec}, o), Error);
  EXPECT_EQ(percentile({3, 1, 2, 4}, 50), 2);
  EXPECT_EQ(percentile({3, 1, 2, 4}, 100), 4);
  EXPECT_EQ(percentile({}, 50), 0);
}

TEST(FitKvSpec, KiviGroupFollowsHeadDimAndExplicitGroupsSayWhatWorks) {
  FLASHKV_SKIP_WITHOUT_MODELS();
  auto fit = [](const std::string& s, int32_t d) { return fit_kv_spec(parse_format_item(s), d).kv_cache_dtype; };
  EXPECT_EQ(fit("int4_kivi", 16), "int4_kivi_g16");
  EXPECT_EQ(fit("int2_kivi+r32", 16), "int2_kivi_g16");
  EXPECT_EQ(fit("int4_kivi", 64), "int4_kivi");
  EXPECT_EQ(fit("int4_kivi_g64+p64", 64), "int4_kivi_g64");
  EXPECT_THROW(fit("int4_kivi_g64", 64), Error);  // a key group must not straddle a 32-token page
  EXPECT_EQ(fit("k:int4_kivi,v:bf16", 16), "k:int4_kivi,v:bf16");  // keys group over tokens: 32 fits the page
  EXPECT_EQ(fit("k:int8,v:int2_kivi", 16), "k:int8,v:int2_kivi_g16");
  EXPECT_EQ(fit("fp8", 16), "fp8_e4m3");
  try {
    fit("int4_kivi_g32", 16);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("int4_kivi_g16"), std::string::npos) << e.what();
  }
  try {
    fit("int4_g32", 16);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("use int4 "), std::string::npos) << e.what();
  }
  // every fitted spec constructs an engine on the shipped model (head_dim 16)
  for (const auto& s : demo_formats(16)) EXPECT_NO_THROW(Engine(shipped().model, s, 1)) << s.label();
}

TEST(Demo, ShippedModelTableJsonAndTexts) {
  FLASHKV_SKIP_WITHOUT_MODELS();
  const LoadedModel& lm = shipped();
  DemoOptions o;
  o.steps = 20;
  const DemoResult r = run_demo(lm, o);
  EXPECT_EQ(r.context, 128);
  EXPECT_FALSE(r.passkey_note.empty());  // the 128-token context cannot hold the passkey prompt
  ASSERT_EQ(r.rows.size(), 7u);
  EXPECT_EQ(r.rows[0].label, "fp32");
  EXPECT_EQ(r.rows[0].quality.kld_mean, 0.0);
  for (std::size_t i = 1; i < r.rows.size(); ++i) EXPECT_GT(r.rows[i].quality.kld_mean, 0.0) << r.rows[i].label;
  EXPECT_EQ(r.rows[1].greedy_divergence, -1);  // bf16 keeps the greedy text on this model
  EXPECT_EQ(r.rows[0].greedy_text.rfind("\"Echoes of vectors unfold", 0), 0u);
  const std::string t = demo_table(r);
  EXPECT_NE(t.find("| int2_kivi_g16 r32"), std::string::npos);
  EXPECT_EQ(t.find("passkey"), std::string::npos);
  EXPECT_EQ(demo_to_json(r)["formats"].size(), 7u);
  DemoOptions bad;
  bad.text_path = "/nonexistent/text";
  EXPECT_THROW(run_demo(lm, bad), IoError);
}
