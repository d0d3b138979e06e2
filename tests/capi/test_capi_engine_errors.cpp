// The engine C ABI's typed errors: every bad argument of create and of each call → its status and a message naming
// the argument (expected vs actual); a rejected call changes nothing. (Behaviour: test_capi_engine.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "capi_engine_fixture.hpp"

namespace {
using namespace capi_engine_test;

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
