// C ABI of the generation engine (include/flashkv/flashkv_engine.h), linked against libflashkv.so only (what a C
// caller sees; the C++ API used as the reference comes from the same library): generation equals flashkv::generate
// token for token (greedy and sampled, llama2.c and GGUF, fp32 and quantized caches), the seed stream, tokenize /
// detokenize, the stats, continuous batching (add / step / retire equals each request run alone; capacity refusals
// change nothing), and every bad argument → its status + a message naming the argument. The 260K model comes from
// FLASHKV_MODELS_DIR (default ../shared/models); tests skip when it is missing. Random prompts and sampler seeds come
// from FLASHKV_TEST_SEED (printed; random when unset).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "flashkv/engine.hpp"
#include "flashkv/flashkv_engine.h"

namespace {

std::string models() { return flashkv::models_dir(FLASHKV_DEFAULT_MODELS_DIR); }
std::string model_bin() { return models() + "/aidreams260K.bin"; }
std::string tok_bin() { return models() + "/aidreams260K.tok512.bin"; }

uint64_t test_seed() {
  static const uint64_t seed = [] {
    const char* env = std::getenv("FLASHKV_TEST_SEED");
    const uint64_t s = env ? std::strtoull(env, nullptr, 10) : static_cast<uint64_t>(std::random_device{}());
    std::printf("[flashkv] FLASHKV_TEST_SEED=%llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

std::string last_error() { return flashkv_last_error(); }

/// Expects `status` == want and flashkv_last_error() to name `argument` ("argument 'x'" or the text given).
#define EXPECT_STATUS(call, want, needle)                                                     \
  do {                                                                                        \
    const flashkv_status s_ = (call);                                                         \
    EXPECT_EQ(s_, want) << #call << ": " << last_error();                                     \
    EXPECT_NE(last_error().find(needle), std::string::npos) << #call << ": " << last_error(); \
  } while (0)

std::string arg(const std::string& name) { return "argument '" + name + "'"; }

flashkv_engine_options engine_opts(const char* kv = nullptr) {
  flashkv_engine_options o;
  EXPECT_EQ(flashkv_engine_options_default(&o), FLASHKV_OK);
  o.tokenizer_path = nullptr;
  o.kv_cache_dtype = kv;
  return o;
}

flashkv_generate_options greedy(int32_t n) {
  flashkv_generate_options g;
  EXPECT_EQ(flashkv_generate_options_default(&g), FLASHKV_OK);
  g.temperature = 0.0f;
  g.max_new_tokens = n;
  return g;
}

/// The C++ engine's tokens for the same model, prompt and options (the reference).
std::vector<int32_t> cpp_generate(const std::string& model, const std::string& tok, const std::string& kv,
                                  const std::vector<int32_t>& prompt, const flashkv::SamplerConfig& sc, int32_t steps,
                                  bool ignore_eos = false) {
  flashkv::LoadedModel lm = flashkv::load_model_with_tokenizer(model, tok);
  flashkv::KVCacheSpec spec;
  spec.kv_cache_dtype = kv;
  flashkv::Engine engine(lm.model, spec, 1, 0);
  flashkv::Sampler sampler(sc);
  flashkv::GenerateOptions go;
  go.steps = steps;
  go.ignore_stop_tokens = ignore_eos;
  return flashkv::generate(engine, prompt, sampler, go).tokens;
}

/// The reference (C++ engine, fp32, greedy) logits of step k of a generation after `prompt` whose tokens are `ref`.
std::vector<float> cpp_step_logits(const std::vector<int32_t>& prompt, const std::vector<int32_t>& ref, size_t k) {
  flashkv::LoadedModel lm = flashkv::load_model_with_tokenizer(model_bin(), tok_bin());
  flashkv::Engine engine(lm.model, flashkv::KVCacheSpec{}, 1, 0);
  flashkv::Sampler sampler({0.0f, 1.0f, 0, 42});
  flashkv::GenerateOptions go;
  go.steps = static_cast<int32_t>(k + 1);
  go.keep_logits = true;
  go.ignore_stop_tokens = true;
  const flashkv::GenerationResult g = flashkv::generate(engine, prompt, sampler, go);
  EXPECT_EQ(std::vector<int32_t>(g.tokens.begin(), g.tokens.begin() + static_cast<long>(k)),
            std::vector<int32_t>(ref.begin(), ref.begin() + static_cast<long>(k)));
  return g.logits.at(k);
}

class CapiEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::is_regular_file(model_bin()) || !std::filesystem::is_regular_file(tok_bin()))
      GTEST_SKIP() << "shipped model not found in " << models() << ": set FLASHKV_MODELS_DIR";
    e_ = open();
    ASSERT_NE(e_, nullptr);
  }
  void TearDown() override { EXPECT_EQ(flashkv_engine_destroy(e_), FLASHKV_OK); }

  static flashkv_engine* open(const char* kv = nullptr, int32_t max_sequences = 1, int64_t pages = 0,
                              uint64_t seed = 42) {
    flashkv_engine_options o = engine_opts(kv);
    const std::string tok = tok_bin();
    o.tokenizer_path = tok.c_str();
    o.max_sequences = max_sequences;
    o.kv_capacity_pages = pages;
    o.seed = seed;
    flashkv_engine* e = nullptr;
    EXPECT_EQ(flashkv_engine_create(model_bin().c_str(), &o, &e), FLASHKV_OK) << last_error();
    return e;
  }

  std::vector<int32_t> tokenize(flashkv_engine* e, const std::string& text) {
    int64_t n = 0;
    EXPECT_EQ(flashkv_engine_tokenize(e, text.data(), text.size(), -1, nullptr, 0, &n), FLASHKV_OK) << last_error();
    std::vector<int32_t> ids(static_cast<size_t>(n));
    EXPECT_EQ(flashkv_engine_tokenize(e, text.data(), text.size(), -1, ids.data(), n, &n), FLASHKV_OK);
    return ids;
  }

  std::vector<int32_t> generate(flashkv_engine* e, const std::vector<int32_t>& prompt,
                                const flashkv_generate_options& g, flashkv_generation_stats* st = nullptr) {
    std::vector<int32_t> out(static_cast<size_t>(g.max_new_tokens));
    int64_t n = -1;
    EXPECT_EQ(flashkv_engine_generate(e, prompt.data(), static_cast<int64_t>(prompt.size()), &g, out.data(),
                                      static_cast<int64_t>(out.size()), &n, st),
              FLASHKV_OK)
        << last_error();
    out.resize(static_cast<size_t>(std::max<int64_t>(n, 0)));
    return out;
  }

  std::vector<int32_t> random_prompt(std::mt19937_64& rng, int len) {
    std::uniform_int_distribution<int32_t> id(3, 511);  // not BOS / EOS
    std::vector<int32_t> p{1};
    for (int i = 1; i < len; ++i) p.push_back(id(rng));
    return p;
  }

  flashkv_engine* e_ = nullptr;
};

TEST_F(CapiEngine, GreedyAndSampledEqualTheCppEngine) {
  std::mt19937_64 rng(test_seed());
  for (const char* kv : {"fp32", "int8", "int4_kivi"}) {  // int4_kivi: the group fitted to head_dim 16, as the CLI
    flashkv_engine* e = open(kv);
    ASSERT_NE(e, nullptr);
    flashkv_engine_info info{};
    info.struct_size = sizeof info;
    ASSERT_EQ(flashkv_engine_get_info(e, &info), FLASHKV_OK);
    const std::string label = info.kv_cache_dtype;
    for (const std::string text : {"The machine", "Once upon a time", ""}) {
      const std::vector<int32_t> prompt = tokenize(e, text);
      ASSERT_GE(prompt.size(), 1u);
      EXPECT_EQ(prompt[0], 1) << "llama2.c prompts start with BOS";
      const std::vector<int32_t> ref = cpp_generate(model_bin(), tok_bin(), label, prompt, {0.0f, 1.0f, 0, 42}, 60);
      EXPECT_EQ(generate(e, prompt, greedy(60)), ref) << kv << " '" << text << "'";
      // text prompt: the same encoding
      std::vector<int32_t> out(60);
      int64_t n = 0;
      const flashkv_generate_options g = greedy(60);
      ASSERT_EQ(flashkv_engine_generate_text(e, text.data(), text.size(), &g, out.data(), 60, &n, nullptr),
                FLASHKV_OK) << last_error();
      out.resize(static_cast<size_t>(n));
      EXPECT_EQ(out, ref);
      // sampled: temperature, top-k, top-p with an explicit seed
      flashkv_generate_options s;
      flashkv_generate_options_default(&s);
      s.max_new_tokens = 40;
      s.temperature = 0.8f;
      s.top_k = 40;
      s.top_p = 0.9f;
      s.has_seed = 1;
      s.seed = rng();
      const flashkv::SamplerConfig sc{0.8f, 0.9f, 40, s.seed};
      EXPECT_EQ(generate(e, prompt, s), cpp_generate(model_bin(), tok_bin(), label, prompt, sc, 40))
          << kv << " seed " << s.seed;
    }
    EXPECT_EQ(flashkv_engine_destroy(e), FLASHKV_OK);
  }
}

TEST_F(CapiEngine, GgufWithItsEmbeddedVocabularyGivesTheSameTokens) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("flashkv_capi_" + std::to_string(getpid()))).string();
  std::filesystem::create_directories(dir);
  const std::string gguf = dir + "/model.gguf";
  {
    flashkv::LoadedModel lm = flashkv::load_model_with_tokenizer(model_bin(), tok_bin());
    flashkv::write_gguf(lm.model, *lm.tokenizer, gguf, flashkv::GgufType::f32);
  }
  flashkv_engine* g = nullptr;
  ASSERT_EQ(flashkv_engine_create(gguf.c_str(), nullptr, &g), FLASHKV_OK) << last_error();
  flashkv_engine_info info{};
  info.struct_size = sizeof info;
  ASSERT_EQ(flashkv_engine_get_info(g, &info), FLASHKV_OK);
  EXPECT_STREQ(info.model_format, "gguf");
  EXPECT_EQ(info.vocab_size, 512);
  const std::vector<int32_t> prompt = tokenize(e_, "The machine");
  EXPECT_EQ(tokenize(g, "The machine"), prompt);
  EXPECT_EQ(generate(g, prompt, greedy(50)), generate(e_, prompt, greedy(50)));
  EXPECT_EQ(flashkv_engine_destroy(g), FLASHKV_OK);
  std::filesystem::remove_all(dir);
}

TEST_F(CapiEngine, InfoDescribesTheModelAndEngine) {
  flashkv_engine_info info{};
  info.struct_size = sizeof info;
  ASSERT_EQ(flashkv_engine_get_info(e_, &info), FLASHKV_OK);
  EXPECT_EQ(info.vocab_size, 512);
  EXPECT_EQ(info.dim, 64);
  EXPECT_EQ(info.num_layers, 4);
  EXPECT_EQ(info.head_dim, info.dim / info.num_heads);
  EXPECT_EQ(info.max_sequences, 1);
  EXPECT_GT(info.max_context, 0);
  EXPECT_EQ(info.bos_id, 1);
  EXPECT_EQ(info.eos_id, 2);
  EXPECT_EQ(info.add_bos, 1);
  EXPECT_EQ(info.device, FLASHKV_DEVICE_CPU);
  EXPECT_STREQ(info.kv_cache_dtype, "fp32");  // the CPU default, as the CLI
  EXPECT_EQ(std::string(info.model_path), model_bin());
}

TEST_F(CapiEngine, SeedStreamAdvancesPerCallAndOnlyOnSuccess) {
  const std::vector<int32_t> prompt = tokenize(e_, "The machine");
  flashkv_generate_options g;
  flashkv_generate_options_default(&g);  // temperature 1, top_p 0.9: sampled
  g.max_new_tokens = 30;
  flashkv_generation_stats st{};
  st.struct_size = sizeof st;
  const std::vector<int32_t> first = generate(e_, prompt, g, &st);
  EXPECT_EQ(st.seed, 42u);
  // a rejected call does not consume a seed
  flashkv_generate_options bad = g;
  bad.top_p = 2.0f;
  int32_t buf[30];
  int64_t n = 0;
  EXPECT_STATUS(flashkv_engine_generate(e_, prompt.data(), 8, &bad, buf, 30, &n, nullptr),
                FLASHKV_ERROR_INVALID_ARGUMENT, arg("top_p"));
  const std::vector<int32_t> second = generate(e_, prompt, g, &st);
  EXPECT_EQ(st.seed, 43u);
  flashkv_generate_options fixed = g;
  fixed.has_seed = 1;
  fixed.seed = 42;
  EXPECT_EQ(generate(e_, prompt, fixed, &st), first);
  EXPECT_EQ(st.seed, 42u);
  fixed.seed = 43;
  EXPECT_EQ(generate(e_, prompt, fixed), second);
  EXPECT_EQ(generate(e_, prompt, g, &st).size(), 30u);
  EXPECT_EQ(st.seed, 44u) << "explicit seeds do not advance the stream";
  EXPECT_EQ(first, cpp_generate(model_bin(), tok_bin(), "fp32", prompt, {1.0f, 0.9f, 0, 42}, 30));
}

TEST_F(CapiEngine, StatsAreTheCliNumbers) {
  const std::vector<int32_t> prompt = tokenize(e_, "Once upon a time");
  flashkv_generate_options g = greedy(25);
  g.stop_at_eos = 0;
  flashkv_generation_stats st{};
  st.struct_size = sizeof st;
  const std::vector<int32_t> out = generate(e_, prompt, g, &st);
  ASSERT_EQ(out.size(), 25u);
  EXPECT_EQ(st.stop_reason, FLASHKV_STOP_STEPS);
  EXPECT_EQ(st.stop_token, -1);
  EXPECT_EQ(st.prompt_tokens, static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(st.generated_tokens, 25);
  EXPECT_EQ(st.decode_steps, 24);
  EXPECT_GT(st.prefill_seconds, 0.0);
  EXPECT_GT(st.decode_seconds, 0.0);
  EXPECT_NEAR(st.prefill_tokens_per_s, static_cast<double>(prompt.size()) / st.prefill_seconds, 1e-6 * st.prefill_tokens_per_s);
  EXPECT_NEAR(st.decode_tokens_per_s, 24.0 / st.decode_seconds, 1e-6 * st.decode_tokens_per_s);
  EXPECT_EQ(st.kv_tokens, st.prompt_tokens + st.decode_steps);
  EXPECT_GT(st.kv_bytes, 0);
  EXPECT_NEAR(st.kv_bytes_per_token, static_cast<double>(st.kv_bytes) / static_cast<double>(st.kv_tokens), 1e-9);
  EXPECT_DOUBLE_EQ(st.kv_bf16_bytes_per_token, 2.0 * 4 * 4 * 16 * 2);  // 4 layers, 4 kv heads of 16 (260K model)
  EXPECT_GT(st.kv_effective_bits, 32.0) << "fp32 plus page slack";
  // with the stop rule: the stop token is reported, not returned
  g.stop_at_eos = 1;
  g.max_new_tokens = 256;
  const std::vector<int32_t> stopped = generate(e_, {1}, g, &st);
  if (st.stop_reason == FLASHKV_STOP_BOS || st.stop_reason == FLASHKV_STOP_EOS) {
    EXPECT_TRUE(st.stop_token == 1 || st.stop_token == 2);
    for (int32_t t : stopped) EXPECT_TRUE(t != 1 && t != 2);
  } else {
    EXPECT_TRUE(st.stop_reason == FLASHKV_STOP_STEPS || st.stop_reason == FLASHKV_STOP_CONTEXT);
  }
  EXPECT_EQ(st.generated_tokens, static_cast<int64_t>(stopped.size()));
}

TEST_F(CapiEngine, TheContextEndStopsAndBoundsTheOutput) {
  const std::vector<int32_t> p = tokenize(e_, "Once upon a time");
  const int64_t np = static_cast<int64_t>(p.size()), most = 128 - np + 1;  // context 128: the last token is not fed
  flashkv_generate_options g = greedy(1 << 30);
  g.stop_at_eos = 0;
  std::vector<int32_t> out(static_cast<size_t>(most));
  int64_t n = 0;
  EXPECT_STATUS(flashkv_engine_generate(e_, p.data(), np, &g, out.data(), most - 1, &n, nullptr),
                FLASHKV_ERROR_INVALID_ARGUMENT, arg("capacity"));
  flashkv_generation_stats st{};
  st.struct_size = sizeof st;
  ASSERT_EQ(flashkv_engine_generate(e_, p.data(), np, &g, out.data(), most, &n, &st), FLASHKV_OK) << last_error();
  EXPECT_EQ(n, most);
  EXPECT_EQ(st.stop_reason, FLASHKV_STOP_CONTEXT);
  EXPECT_EQ(st.kv_tokens, 128);
  EXPECT_EQ(out, cpp_generate(model_bin(), tok_bin(), "fp32", p, {0.0f, 1.0f, 0, 42}, 1 << 30, true));
  // the batch API stops the request at the context too
  flashkv_engine_event ev{};
  ASSERT_EQ(flashkv_engine_add(e_, p.data(), np, &g, &ev), FLASHKV_OK) << last_error();
  int64_t count = 1;
  while (ev.stop == FLASHKV_STOP_NONE) {
    int32_t k = 0;
    ASSERT_EQ(flashkv_engine_step(e_, &ev, 1, &k), FLASHKV_OK) << last_error();
    ASSERT_EQ(k, 1);
    ++count;
  }
  EXPECT_EQ(ev.stop, FLASHKV_STOP_CONTEXT);
  EXPECT_EQ(count, most);
  EXPECT_EQ(flashkv_engine_retire(e_, ev.seq), FLASHKV_OK);
}

TEST_F(CapiEngine, TokenizeDetokenizeRoundTripAndBuffers) {
  const std::string text = "Hello, machine dreams \xe2\x9c\xa8 of light";
  std::vector<int32_t> ids = tokenize(e_, text);
  ASSERT_GT(ids.size(), 2u);
  int64_t n = 0;
  // no BOS / forced BOS
  std::vector<int32_t> nobos(ids.size());
  ASSERT_EQ(flashkv_engine_tokenize(e_, text.data(), text.size(), 0, nobos.data(), ids.size(), &n), FLASHKV_OK);
  EXPECT_EQ(n, static_cast<int64_t>(ids.size()) - 1);
  EXPECT_EQ(std::vector<int32_t>(ids.begin() + 1, ids.end()), std::vector<int32_t>(nobos.begin(), nobos.begin() + n));
  // too small: CAPACITY, the count reported, nothing written
  std::vector<int32_t> small(2, -7);
  EXPECT_STATUS(flashkv_engine_tokenize(e_, text.data(), text.size(), -1, small.data(), 2, &n), FLASHKV_ERROR_CAPACITY,
                arg("capacity"));
  EXPECT_EQ(n, static_cast<int64_t>(ids.size()));
  EXPECT_EQ(small, std::vector<int32_t>(2, -7));
  // empty text: BOS only
  ASSERT_EQ(flashkv_engine_tokenize(e_, nullptr, 0, -1, small.data(), 2, &n), FLASHKV_OK);
  EXPECT_EQ(n, 1);
  EXPECT_EQ(small[0], 1);
  // detokenize (BOS is the predecessor of the first token: decode of the ids after BOS gives the text back)
  size_t len = 0;
  const int64_t m = static_cast<int64_t>(ids.size()) - 1;
  ASSERT_EQ(flashkv_engine_detokenize(e_, ids.data() + 1, m, nullptr, 0, &len), FLASHKV_OK);
  EXPECT_EQ(len, text.size());
  std::string back(len + 1, 'x');
  ASSERT_EQ(flashkv_engine_detokenize(e_, ids.data() + 1, m, back.data(), back.size(), &len), FLASHKV_OK);
  EXPECT_EQ(back[len], '\0');
  back.resize(len);
  EXPECT_EQ(back, text);
  std::string tiny(len, 'x');  // no room for the NUL
  EXPECT_STATUS(flashkv_engine_detokenize(e_, ids.data() + 1, m, tiny.data(), tiny.size(), &len), FLASHKV_ERROR_CAPACITY,
                arg("capacity"));
  EXPECT_EQ(tiny, std::string(len, 'x'));
  ASSERT_EQ(flashkv_engine_detokenize(e_, nullptr, 0, nullptr, 0, &len), FLASHKV_OK);
  EXPECT_EQ(len, 0u);
}

TEST_F(CapiEngine, BatchEqualsEachRequestAlone) {
  std::mt19937_64 rng(test_seed() + 1);
  flashkv_engine* b = open("fp32", 4);
  ASSERT_NE(b, nullptr);
  struct Req {
    std::vector<int32_t> prompt;
    flashkv_generate_options g;
    std::vector<int32_t> got, ref;
    int32_t seq = -1;
    bool done = false;
  };
  std::vector<Req> reqs(7);
  std::uniform_int_distribution<int> plen(1, 40), olen(1, 50);
  for (size_t i = 0; i < reqs.size(); ++i) {
    Req& r = reqs[i];
    r.prompt = random_prompt(rng, plen(rng));
    flashkv_generate_options_default(&r.g);
    r.g.max_new_tokens = olen(rng);
    r.g.stop_at_eos = static_cast<int32_t>(i % 2);
    r.g.temperature = i % 3 == 0 ? 0.0f : 0.9f;
    r.g.has_seed = 1;
    r.g.seed = rng();
    r.ref = generate(e_, r.prompt, r.g);
  }
  // admit up to 4 at a time; admit the next when one retires (a seeded random schedule of arrivals)
  size_t next = 0;
  int live = 0, steps = 0;
  auto admit = [&](Req& r) {
    flashkv_engine_event ev{};
    ASSERT_EQ(flashkv_engine_add(b, r.prompt.data(), static_cast<int64_t>(r.prompt.size()), &r.g, &ev), FLASHKV_OK)
        << last_error();
    r.seq = ev.seq;
    if (ev.stop == FLASHKV_STOP_NONE || ev.stop == FLASHKV_STOP_STEPS || ev.stop == FLASHKV_STOP_CONTEXT)
      r.got.push_back(ev.token);
    r.done = ev.stop != FLASHKV_STOP_NONE;
    ++live;
  };
  auto retire_done = [&] {
    for (Req& r : reqs)
      if (r.done && r.seq >= 0) {
        ASSERT_EQ(flashkv_engine_retire(b, r.seq), FLASHKV_OK) << last_error();
        r.seq = -1;
        --live;
      }
  };
  std::bernoulli_distribution arrive(0.5);
  while (true) {
    while (next < reqs.size() && live < 4 && (live == 0 || arrive(rng))) admit(reqs[next++]);
    retire_done();
    if (next == reqs.size() && live == 0) break;
    flashkv_engine_event ev[4];
    int32_t n = -1;
    ASSERT_EQ(flashkv_engine_step(b, ev, 4, &n), FLASHKV_OK) << last_error();
    ++steps;
    for (int i = 1; i < n; ++i) EXPECT_LT(ev[i - 1].seq, ev[i].seq) << "events in increasing seq order";
    for (int i = 0; i < n; ++i) {
      Req* r = nullptr;
      for (Req& q : reqs)
        if (q.seq == ev[i].seq) r = &q;
      ASSERT_NE(r, nullptr);
      ASSERT_FALSE(r->done) << "a finished request must not be stepped";
      if (ev[i].stop != FLASHKV_STOP_BOS && ev[i].stop != FLASHKV_STOP_EOS) r->got.push_back(ev[i].token);
      r->done = ev[i].stop != FLASHKV_STOP_NONE;
    }
    retire_done();
    ASSERT_LT(steps, 1000);
  }
  // Batched rows sum in another order than a single row (sgemm vs sgemv: float32 rounding, ~1e-5 in the logits).
  // Token-exact, except that a greedy request may part from its reference at a near-tie (top-2 margin of the
  // reference logits < 1e-4, the batch taking the runner-up); the prefix before it must be equal.
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Req& r = reqs[i];
    if (r.got == r.ref) continue;
    size_t k = 0;
    while (k < r.got.size() && k < r.ref.size() && r.got[k] == r.ref[k]) ++k;
    ASSERT_TRUE(r.g.temperature == 0.0f && k < r.got.size() && k < r.ref.size())
        << "request " << i << " (temperature " << r.g.temperature << ") differs from its reference at token " << k;
    const std::vector<float> logits = cpp_step_logits(r.prompt, r.ref, k);
    std::vector<float> sorted = logits;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    EXPECT_LT(sorted[0] - sorted[1], 1e-4f) << "request " << i << " token " << k << ": not a near-tie";
    EXPECT_EQ(logits[static_cast<size_t>(r.got[k])], sorted[1]) << "the batch took the runner-up";
    std::printf("request %zu: near-tie at token %zu (margin %.2g); prefix equal\n", i, k, sorted[0] - sorted[1]);
  }
  int32_t n = -1;
  EXPECT_EQ(flashkv_engine_step(b, nullptr, 0, &n), FLASHKV_OK) << "nothing running: no events";
  EXPECT_EQ(n, 0);
  EXPECT_EQ(flashkv_engine_destroy(b), FLASHKV_OK);
}

TEST_F(CapiEngine, BatchCapacityRefusalsChangeNothing) {
  // 2 sequences; a pool of 3 pages of 32 tokens: one 40-token prompt takes 2 pages
  flashkv_engine* b = open("fp32", 2, 3);
  ASSERT_NE(b, nullptr);
  std::mt19937_64 rng(test_seed() + 2);
  const std::vector<int32_t> p40 = random_prompt(rng, 40), p20 = random_prompt(rng, 20), p5 = random_prompt(rng, 5);
  flashkv_generate_options g = greedy(40);
  g.stop_at_eos = 0;
  flashkv_engine_event a{}, c{}, x{-5, -5, -5};
  ASSERT_EQ(flashkv_engine_add(b, p40.data(), 40, &g, &a), FLASHKV_OK) << last_error();
  EXPECT_STATUS(flashkv_engine_add(b, p40.data(), 40, &g, &x), FLASHKV_ERROR_CAPACITY, "");  // 2 more pages: 1 free
  EXPECT_EQ(x.seq, -5) << "nothing written on refusal";
  ASSERT_EQ(flashkv_engine_add(b, p20.data(), 20, &g, &c), FLASHKV_OK) << last_error();
  EXPECT_STATUS(flashkv_engine_add(b, p5.data(), 5, &g, &x), FLASHKV_ERROR_CAPACITY, "maximum of 2 sequences");
  std::vector<int32_t> got_a{a.token}, got_c{c.token};
  // step until a step needs a 4th page: sequence a reaches 64 tokens after 24 more steps, c reaches 32 after 12
  bool refused = false;
  for (int i = 0; i < 60 && !refused; ++i) {
    flashkv_engine_event ev[2];
    int32_t n = 0;
    const flashkv_status s = flashkv_engine_step(b, ev, 2, &n);
    if (s == FLASHKV_ERROR_CAPACITY) {
      refused = true;
      EXPECT_EQ(n, 0);
      break;
    }
    ASSERT_EQ(s, FLASHKV_OK) << last_error();
    for (int k = 0; k < n; ++k) (ev[k].seq == a.seq ? got_a : got_c).push_back(ev[k].token);
  }
  ASSERT_TRUE(refused) << "3 pages cannot hold 40 + 20 growing tokens";
  // preempt c; a continues exactly where it was (the refused step wrote nothing)
  ASSERT_EQ(flashkv_engine_retire(b, c.seq), FLASHKV_OK);
  EXPECT_STATUS(flashkv_engine_retire(b, c.seq), FLASHKV_ERROR_INVALID_ARGUMENT, arg("seq"));
  for (;;) {
    flashkv_engine_event ev[2];
    int32_t n = 0;
    ASSERT_EQ(flashkv_engine_step(b, ev, 2, &n), FLASHKV_OK) << last_error();
    if (n == 0) break;
    ASSERT_EQ(n, 1);
    got_a.push_back(ev[0].token);
  }
  EXPECT_EQ(got_a, generate(e_, p40, g));
  std::vector<int32_t> ref_c = generate(e_, p20, g);
  ASSERT_GE(ref_c.size(), got_c.size());
  ref_c.resize(got_c.size());
  EXPECT_EQ(got_c, ref_c) << "the preempted request's tokens so far";
  EXPECT_EQ(flashkv_engine_destroy(b), FLASHKV_OK);
}

TEST_F(CapiEngine, CallsFromSeveralThreadsAreSerialized) {
  const std::vector<std::string> texts = {"The machine", "Once upon", "Echoes of light", "A quiet lab"};
  std::vector<std::vector<int32_t>> want;
  for (const std::string& t : texts) want.push_back(generate(e_, tokenize(e_, t), greedy(30)));
  std::vector<std::vector<int32_t>> got(texts.size() * 3);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i)
    threads.emplace_back([&, i] {
      const std::string& t = texts[i % texts.size()];
      const flashkv_generate_options g = greedy(30);
      std::vector<int32_t> out(30);
      int64_t n = 0;
      if (flashkv_engine_generate_text(e_, t.data(), t.size(), &g, out.data(), 30, &n, nullptr) == FLASHKV_OK)
        got[i].assign(out.begin(), out.begin() + n);
    });
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i % texts.size()]) << "thread " << i;
}

TEST_F(CapiEngine, BadCreateArgumentsAreNamed) {
  flashkv_engine* e = reinterpret_cast<flashkv_engine*>(0x1);
  const std::string tok = tok_bin();
  auto create = [&](const char* model, flashkv_engine_options o) {
    o.tokenizer_path = o.tokenizer_path ? o.tokenizer_path : tok.c_str();
    e = reinterpret_cast<flashkv_engine*>(0x1);
    const flashkv_status s = flashkv_engine_create(model, &o, &e);
    EXPECT_EQ(e, nullptr) << "*out is NULL after a failure";
    return s;
  };
  const std::string m = model_bin();
  flashkv_engine_options o = engine_opts();
  EXPECT_STATUS(flashkv_engine_create(m.c_str(), &o, nullptr), FLASHKV_ERROR_INVALID_ARGUMENT, arg("out"));
  EXPECT_STATUS(create(nullptr, o), FLASHKV_ERROR_INVALID_ARGUMENT, arg("model"));
  EXPECT_STATUS(create("", o), FLASHKV_ERROR_INVALID_ARGUMENT, arg("model"));
  EXPECT_STATUS(create("no-such-alias", o), FLASHKV_ERROR_INVALID_ARGUMENT, arg("model"));
  EXPECT_STATUS(create("/nonexistent/model.bin", o), FLASHKV_ERROR_IO, "/nonexistent/model.bin");
  o.tokenizer_path = "/nonexistent/tok.bin";
  EXPECT_STATUS(create(m.c_str(), o), FLASHKV_ERROR_IO, "/nonexistent/tok.bin");
  o = engine_opts();
  o.tokenizer_path = m.c_str();  // a model file is no tokenizer
  EXPECT_NE(create(m.c_str(), o), FLASHKV_OK);
  EXPECT_EQ(flashkv_engine_create(m.c_str(), nullptr, &e), FLASHKV_ERROR_IO)
      << "a llama2.c checkpoint needs its tokenizer file: " << last_error();
  auto with = [&](auto set) {
    flashkv_engine_options x = engine_opts();
    set(x);
    return create(m.c_str(), x);
  };
  EXPECT_STATUS(with([](auto& x) { x.struct_size = 8; }), FLASHKV_ERROR_INVALID_ARGUMENT, arg("opts.struct_size"));
  EXPECT_STATUS(with([](auto& x) { x.struct_size += 8; }), FLASHKV_ERROR_INVALID_ARGUMENT, arg("opts.struct_size"));
  EXPECT_STATUS(with([](auto& x) { x.device = "gpu"; }), FLASHKV_ERROR_INVALID_ARGUMENT, arg("device"));
  EXPECT_STATUS(with([](auto& x) { x.device = "cuda:x"; }), FLASHKV_ERROR_INVALID_ARGUMENT, arg("device"));
  EXPECT_STATUS(with([](auto& x) { x.kv_cache_dtype = "int3"; }), FLASHKV_ERROR_INVALID_ARGUMENT, "int3");
  EXPECT_STATUS(with([](auto& x) { x.page_size = 24; }), FLASHKV_ERROR_INVALID_ARGUMENT, "page_size");
  EXPECT_STATUS(with([](auto& x) { x.residual_tokens = -1; }), FLASHKV_ERROR_INVALID_ARGUMENT, arg("residual_tokens"));
  EXPECT_STATUS(with([](auto& x) { x.sink_tokens = -3; }), FLASHKV_ERROR_INVALID_ARGUMENT, arg("sink_tokens"));
  EXPECT_STATUS(with([](auto& x) { x.rotation = 7; }), FLASHKV_ERROR_INVALID_ARGUMENT, arg("opts.rotation"));
  EXPECT_STATUS(with([](auto& x) { x.max_sequences = 0; }), FLASHKV_ERROR_INVALID_ARGUMENT, arg("max_sequences"));
  EXPECT_STATUS(with([](auto& x) { x.max_context = -1; }), FLASHKV_ERROR_INVALID_ARGUMENT, arg("max_context"));
  EXPECT_STATUS(with([](auto& x) { x.max_context = 1 << 20; }), FLASHKV_ERROR_INVALID_ARGUMENT, arg("max_context"));
  EXPECT_STATUS(with([](auto& x) { x.kv_capacity_pages = -1; }), FLASHKV_ERROR_INVALID_ARGUMENT,
                arg("options.kv_capacity_pages"));
  // CUDA: UNSUPPORTED where the build or machine has no CUDA engine (never a silent CPU fallback)
  const flashkv_status cuda = with([](auto& x) { x.device = "cuda"; });
  if (cuda == FLASHKV_OK) {
    flashkv_engine_destroy(e);
  } else {
    EXPECT_EQ(cuda, FLASHKV_ERROR_UNSUPPORTED) << last_error();
  }
  EXPECT_STATUS(flashkv_engine_options_default(nullptr), FLASHKV_ERROR_INVALID_ARGUMENT, arg("opts"));
  EXPECT_STATUS(flashkv_generate_options_default(nullptr), FLASHKV_ERROR_INVALID_ARGUMENT, arg("opts"));
  EXPECT_EQ(flashkv_engine_destroy(nullptr), FLASHKV_OK);
}

TEST_F(CapiEngine, BadCallArgumentsAreNamedAndChangeNothing) {
  const std::vector<int32_t> p = tokenize(e_, "The machine");
  const int64_t np = static_cast<int64_t>(p.size());
  int32_t out[300];
  int64_t n = 0;
  auto gen = [&](auto set, int64_t cap = 300) {
    flashkv_generate_options g = greedy(20);
    set(g);
    return flashkv_engine_generate(e_, p.data(), np, &g, out, cap, &n, nullptr);
  };
  const flashkv_generate_options g0 = greedy(20);
  EXPECT_STATUS(flashkv_engine_generate(nullptr, p.data(), np, &g0, out, 20, &n, nullptr),
                FLASHKV_ERROR_INVALID_ARGUMENT, arg("engine"));
  EXPECT_STATUS(flashkv_engine_generate(e_, nullptr, np, &g0, out, 20, &n, nullptr), FLASHKV_ERROR_INVALID_ARGUMENT,
                arg("prompt"));
  EXPECT_STATUS(flashkv_engine_generate(e_, p.data(), 0, &g0, out, 20, &n, nullptr), FLASHKV_ERROR_INVALID_ARGUMENT,
                arg("prompt"));
  EXPECT_STATUS(flashkv_engine_generate(e_, p.data(), -4, &g0, out, 20, &n, nullptr), FLASHKV_ERROR_INVALID_ARGUMENT,
                arg("prompt"));
  std::vector<int32_t> longp(1000, 5);
  EXPECT_STATUS(flashkv_engine_generate(e_, longp.data(), 1000, &g0, out, 20, &n, nullptr),
                FLASHKV_ERROR_INVALID_ARGUMENT, arg("prompt"));
  std::vector<int32_t> badtok = p;
  badtok[2] = 512;
  EXPECT_STATUS(flashkv_engine_generate(e_, badtok.data(), np, &g0, out, 20, &n, nullptr),
                FLASHKV_ERROR_INVALID_ARGUMENT, arg("tokens[2]"));
  badtok[2] = -1;
  EXPECT_STATUS(flashkv_engine_generate(e_, badtok.data(), np, &g0, out, 20, &n, nullptr),
                FLASHKV_ERROR_INVALID_ARGUMENT, arg("tokens[2]"));
  EXPECT_STATUS(flashkv_engine_generate(e_, p.data(), np, &g0, out, 19, &n, nullptr), FLASHKV_ERROR_INVALID_ARGUMENT,
                arg("capacity"));
  EXPECT_STATUS(flashkv_engine_generate(e_, p.data(), np, &g0, nullptr, 20, &n, nullptr),
                FLASHKV_ERROR_INVALID_ARGUMENT, arg("tokens_out"));
  EXPECT_STATUS(flashkv_engine_generate(e_, p.data(), np, &g0, out, 20, nullptr, nullptr),
                FLASHKV_ERROR_INVALID_ARGUMENT, arg("n_out"));
  flashkv_generation_stats st{};
  st.struct_size = 4;
  EXPECT_STATUS(flashkv_engine_generate(e_, p.data(), np, &g0, out, 20, &n, &st), FLASHKV_ERROR_INVALID_ARGUMENT,
                arg("stats.struct_size"));
  EXPECT_STATUS(gen([](auto& g) { g.struct_size = 3; }), FLASHKV_ERROR_INVALID_ARGUMENT, arg("opts.struct_size"));
  EXPECT_STATUS(gen([](auto& g) { g.max_new_tokens = 0; }), FLASHKV_ERROR_INVALID_ARGUMENT, arg("max_new_tokens"));
  EXPECT_STATUS(gen([](auto& g) { g.max_new_tokens = -2; }), FLASHKV_ERROR_INVALID_ARGUMENT, arg("max_new_tokens"));
  EXPECT_STATUS(gen([](auto& g) { g.temperature = -0.5f; }), FLASHKV_ERROR_INVALID_ARGUMENT, arg("temperature"));
  EXPECT_STATUS(gen([](auto& g) { g.temperature = std::nanf(""); }), FLASHKV_ERROR_INVALID_ARGUMENT,
                arg("temperature"));
  EXPECT_STATUS(gen([](auto& g) { g.temperature = std::numeric_limits<float>::infinity(); }),
                FLASHKV_ERROR_INVALID_ARGUMENT, arg("temperature"));
  EXPECT_STATUS(gen([](auto& g) { g.top_p = 0.0f; }), FLASHKV_ERROR_INVALID_ARGUMENT, arg("top_p"));
  EXPECT_STATUS(gen([](auto& g) { g.top_p = 1.5f; }), FLASHKV_ERROR_INVALID_ARGUMENT, arg("top_p"));
  EXPECT_STATUS(gen([](auto& g) { g.top_p = std::nanf(""); }), FLASHKV_ERROR_INVALID_ARGUMENT, arg("top_p"));
  EXPECT_STATUS(gen([](auto& g) { g.top_k = -1; }), FLASHKV_ERROR_INVALID_ARGUMENT, arg("top_k"));
  const flashkv_generate_options g1 = greedy(20);
  EXPECT_STATUS(flashkv_engine_generate_text(e_, nullptr, 5, &g1, out, 20, &n, nullptr),
                FLASHKV_ERROR_INVALID_ARGUMENT, arg("prompt"));
  // tokenize / detokenize / info / batch
  EXPECT_STATUS(flashkv_engine_tokenize(e_, "ab", 2, -1, out, 10, nullptr), FLASHKV_ERROR_INVALID_ARGUMENT,
                arg("n_tokens"));
  EXPECT_STATUS(flashkv_engine_tokenize(e_, "ab", 2, 2, out, 10, &n), FLASHKV_ERROR_INVALID_ARGUMENT, arg("add_bos"));
  EXPECT_STATUS(flashkv_engine_tokenize(e_, nullptr, 2, -1, out, 10, &n), FLASHKV_ERROR_INVALID_ARGUMENT, arg("text"));
  EXPECT_STATUS(flashkv_engine_tokenize(e_, "ab", 2, -1, out, -1, &n), FLASHKV_ERROR_INVALID_ARGUMENT, arg("capacity"));
  EXPECT_STATUS(flashkv_engine_tokenize(e_, "ab", 2, -1, nullptr, 10, &n), FLASHKV_ERROR_INVALID_ARGUMENT, arg("tokens"));
  EXPECT_STATUS(flashkv_engine_tokenize(nullptr, "ab", 2, -1, out, 10, &n), FLASHKV_ERROR_INVALID_ARGUMENT,
                arg("engine"));
  size_t len = 0;
  char text[64];
  const int32_t bad[2] = {5, 9999};
  EXPECT_STATUS(flashkv_engine_detokenize(e_, bad, 2, text, 64, &len), FLASHKV_ERROR_INVALID_ARGUMENT, arg("token"));
  EXPECT_STATUS(flashkv_engine_detokenize(e_, bad, -1, text, 64, &len), FLASHKV_ERROR_INVALID_ARGUMENT,
                arg("n_tokens"));
  EXPECT_STATUS(flashkv_engine_detokenize(e_, nullptr, 2, text, 64, &len), FLASHKV_ERROR_INVALID_ARGUMENT,
                arg("tokens"));
  EXPECT_STATUS(flashkv_engine_detokenize(e_, bad, 1, text, 64, nullptr), FLASHKV_ERROR_INVALID_ARGUMENT,
                arg("text_len"));
  EXPECT_STATUS(flashkv_engine_detokenize(e_, bad, 1, nullptr, 64, &len), FLASHKV_ERROR_INVALID_ARGUMENT, arg("text"));
  flashkv_engine_info info{};
  info.struct_size = 12;
  EXPECT_STATUS(flashkv_engine_get_info(e_, &info), FLASHKV_ERROR_INVALID_ARGUMENT, arg("info.struct_size"));
  EXPECT_STATUS(flashkv_engine_get_info(e_, nullptr), FLASHKV_ERROR_INVALID_ARGUMENT, arg("info"));
  EXPECT_STATUS(flashkv_engine_get_info(nullptr, &info), FLASHKV_ERROR_INVALID_ARGUMENT, arg("engine"));
  flashkv_engine_event ev{};
  EXPECT_STATUS(flashkv_engine_add(e_, p.data(), np, &g0, nullptr), FLASHKV_ERROR_INVALID_ARGUMENT, arg("first"));
  EXPECT_STATUS(flashkv_engine_add(e_, badtok.data(), np, &g0, &ev), FLASHKV_ERROR_INVALID_ARGUMENT, arg("tokens[2]"));
  EXPECT_STATUS(flashkv_engine_add(nullptr, p.data(), np, &g0, &ev), FLASHKV_ERROR_INVALID_ARGUMENT, arg("engine"));
  int32_t ne = 0;
  EXPECT_STATUS(flashkv_engine_step(e_, &ev, 1, nullptr), FLASHKV_ERROR_INVALID_ARGUMENT, arg("n_events"));
  EXPECT_STATUS(flashkv_engine_retire(e_, 0), FLASHKV_ERROR_INVALID_ARGUMENT, arg("seq"));
  EXPECT_STATUS(flashkv_engine_retire(nullptr, 0), FLASHKV_ERROR_INVALID_ARGUMENT, arg("engine"));
  // the rejected add took no sequence: the engine's only slot is free for a request, whose step needs room for 1 event
  ASSERT_EQ(flashkv_engine_add(e_, p.data(), np, &g0, &ev), FLASHKV_OK) << last_error();
  EXPECT_STATUS(flashkv_engine_step(e_, nullptr, 1, &ne), FLASHKV_ERROR_INVALID_ARGUMENT, arg("events"));
  EXPECT_STATUS(flashkv_engine_step(e_, &ev, 0, &ne), FLASHKV_ERROR_INVALID_ARGUMENT, arg("capacity"));
  // the only sequence is taken: generate is refused with CAPACITY until the request retires
  EXPECT_STATUS(flashkv_engine_generate(e_, p.data(), np, &g0, out, 20, &n, nullptr), FLASHKV_ERROR_CAPACITY, "");
  ASSERT_EQ(flashkv_engine_retire(e_, ev.seq), FLASHKV_OK);
  EXPECT_EQ(generate(e_, p, g0).size(), 20u);
}

}  // namespace
