// Shared by the engine C ABI tests (test_capi_engine.cpp, test_capi_engine_errors.cpp): the shipped 260K model's
// paths (flashkv::shipped_models_dir(): FLASHKV_MODELS_DIR, else scripts/setup's models/aidreams260k, else
// ../shared/models), the test seed, the C++ reference runs and the fixture (an engine on the model; tests skip when it
// is missing).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "flashkv/engine.hpp"
#include "flashkv/flashkv_engine.h"

namespace capi_engine_test {

inline std::string models() { return flashkv::shipped_models_dir(); }
inline std::string model_bin() { return models() + "/aidreams260K.bin"; }
inline std::string tok_bin() { return models() + "/aidreams260K.tok512.bin"; }

inline uint64_t test_seed() {
  static const uint64_t seed = [] {
    const char* env = std::getenv("FLASHKV_TEST_SEED");
    const uint64_t s = env ? std::strtoull(env, nullptr, 10) : static_cast<uint64_t>(std::random_device{}());
    std::printf("[flashkv] FLASHKV_TEST_SEED=%llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

inline std::string last_error() { return flashkv_last_error(); }

/// Expects `status` == want and flashkv_last_error() to name `argument` ("argument 'x'" or the text given).
#define EXPECT_STATUS(call, want, needle)                                                     \
  do {                                                                                        \
    const flashkv_status s_ = (call);                                                         \
    EXPECT_EQ(s_, want) << #call << ": " << last_error();                                     \
    EXPECT_NE(last_error().find(needle), std::string::npos) << #call << ": " << last_error(); \
  } while (0)

inline std::string arg(const std::string& name) { return "argument '" + name + "'"; }

inline flashkv_engine_options engine_opts(const char* kv = nullptr) {
  flashkv_engine_options o;
  EXPECT_EQ(flashkv_engine_options_default(&o), FLASHKV_OK);
  o.tokenizer_path = nullptr;
  o.kv_cache_dtype = kv;
  return o;
}

inline flashkv_generate_options greedy(int32_t n) {
  flashkv_generate_options g;
  EXPECT_EQ(flashkv_generate_options_default(&g), FLASHKV_OK);
  g.temperature = 0.0f;
  g.max_new_tokens = n;
  return g;
}

/// The C++ engine's tokens for the same model, prompt and options (the reference).
inline std::vector<int32_t> cpp_generate(const std::string& model, const std::string& tok, const std::string& kv,
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
inline std::vector<float> cpp_step_logits(const std::vector<int32_t>& prompt, const std::vector<int32_t>& ref, size_t k) {
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
      GTEST_SKIP() << "shipped model not found in " << models() << ": run scripts/setup (or set FLASHKV_MODELS_DIR)";
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

}  // namespace capi_engine_test
