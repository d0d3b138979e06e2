// C ABI of the generation engine (include/flashkv/flashkv_engine.h), linked against libflashkv.so only (what a C
// caller sees; the C++ API used as the reference comes from the same library): generation equals flashkv::generate
// token for token (greedy and sampled, llama2.c and GGUF, fp32 and quantized caches), the seed stream, tokenize /
// detokenize, the stats, continuous batching (add / step / retire equals each request run alone; capacity refusals
// change nothing), and every bad argument (test_capi_engine_errors.cpp). The 260K model comes from
// flashkv::shipped_models_dir() (FLASHKV_MODELS_DIR, else models/aidreams260k from scripts/setup, else
// ../shared/models); tests skip when it is missing. Random prompts and sampler seeds come from FLASHKV_TEST_SEED
// (printed; random when unset).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "capi_engine_fixture.hpp"

namespace {
using namespace capi_engine_test;

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

}  // namespace
