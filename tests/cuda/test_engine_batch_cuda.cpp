// Continuous batching on the CUDA engine: a seeded random schedule admits sequences (prefill of a random prompt),
// decodes every live sequence in one batched step, retires finished ones, and refuses a prompt that does not fit the
// page pool with CapacityError before anything is written. Every sequence's logits must equal those of the same
// sequence run alone (its own engine, batch 1) — within the rounding of a different cuBLAS kernel / split-KV count for
// another batch size (bounded by the bf16 error scale of the model: no cross-sequence leak can hide under it), and with
// identical argmax wherever the margin decides it.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>

#include "common/reference.hpp"
#include "engine_compare.hpp"
#include "flashkv/error.hpp"
#include "../engine/random_model.hpp"

using namespace flashkv;
using namespace flashkv::enginetest;

TEST(CudaEngineBatch, RandomScheduleEqualsEachSequenceAlone) {
  ModelConfig c;
  c.dim = 576; c.hidden_dim = 384; c.n_layers = 2; c.num_heads = 9; c.num_heads_kv = 3; c.head_dim = 64;
  c.vocab_size = 700; c.seq_len = 160; c.rope_theta = 100000.0f;
  const uint64_t seed = flashkv::testing::test_seed();
  Model m = test::random_model(c, seed + 3);
  std::mt19937_64 rng(seed);
  KVCacheSpec spec;
  spec.kv_cache_dtype = "bf16";
  spec.page_size = 16;
  EngineOptions o;
  o.device = Device::cuda;
  o.kv_capacity_pages = 24;  // 384 token slots for up to 6 sequences of up to 160 tokens: admission must wait
  Engine e(m, spec, 6, 0, o);

  struct Seq {
    std::vector<int32_t> prompt, fed;  // fed: tokens decoded after the prompt
    std::vector<std::vector<float>> logits;
    int32_t target = 0;
  };
  std::map<int32_t, Seq> live;
  std::vector<Seq> done;
  const std::size_t V = static_cast<std::size_t>(c.vocab_size);
  int refused = 0, admitted = 0;
  for (int step = 0; step < 90; ++step) {
    // Admit a new request now and then.
    if (live.size() < 6 && rng() % 3 == 0) {
      Seq s;
      const int n = 5 + static_cast<int>(rng() % 60);
      for (int i = 0; i < n; ++i) s.prompt.push_back(static_cast<int32_t>(rng() % V));
      s.target = 4 + static_cast<int32_t>(rng() % 40);
      const int32_t id = e.add_sequence();
      std::vector<float> l(V);
      const std::size_t bytes_before = e.memory().bytes;
      try {
        e.prefill(id, s.prompt, l);
        s.logits.push_back(l);
        live[id] = std::move(s);
        ++admitted;
      } catch (const CapacityError&) {
        ++refused;
        EXPECT_EQ(e.length(id), 0);
        EXPECT_EQ(e.memory().bytes, bytes_before);
        e.remove_sequence(id);
      }
    }
    if (live.empty()) continue;
    // One batched decode step over every live sequence (ids in map order), fed a random token each.
    std::vector<int32_t> ids, toks;
    for (auto& [id, s] : live) {
      ids.push_back(id);
      toks.push_back(static_cast<int32_t>(rng() % V));
    }
    std::vector<float> l(ids.size() * V);
    try {
      e.decode(ids, toks, l);
    } catch (const CapacityError&) {  // pool full: retire the longest sequence and go on (nothing was written)
      ++refused;
      auto it = live.begin();
      for (auto j = live.begin(); j != live.end(); ++j)
        if (e.length(j->first) > e.length(it->first)) it = j;
      e.remove_sequence(it->first);
      done.push_back(std::move(it->second));
      live.erase(it);
      continue;
    }
    for (std::size_t i = 0; i < ids.size(); ++i) {
      Seq& s = live[ids[i]];
      s.fed.push_back(toks[i]);
      s.logits.emplace_back(l.begin() + i * V, l.begin() + (i + 1) * V);
    }
    // Retire sequences that reached their length or the context.
    for (auto it = live.begin(); it != live.end();) {
      if (static_cast<int32_t>(it->second.fed.size()) >= it->second.target || e.length(it->first) >= e.max_context()) {
        e.remove_sequence(it->first);
        done.push_back(std::move(it->second));
        it = live.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& [id, s] : live) done.push_back(std::move(s));
  std::printf("[engine-cuda] schedule: %d admitted, %d refusals (CapacityError), %zu sequences checked\n", admitted,
              refused, done.size());
  EXPECT_GT(admitted, 5);
  // The error scale: the bf16-weight twin vs float32 on one sequence of this model (CPU).
  Comparison scale;
  {
    const Model twin = bf16_weight_copy(m);
    Engine cpu(m, KVCacheSpec{}, 1), tw(twin, KVCacheSpec{}, 1);
    const Seq& s = done.front();
    std::vector<int32_t> forced = s.fed;
    forced.push_back(0);
    scale = compare_logits(teacher_forced(cpu, s.prompt, forced), teacher_forced(tw, s.prompt, forced));
  }
  Engine alone(m, spec, 1, 0, EngineOptions{Device::cuda, 0, 0});
  double worst = 0;
  for (const Seq& s : done) {
    std::vector<int32_t> forced = s.fed;
    forced.push_back(0);  // teacher_forced returns fed.size() + 1 rows: after the prompt and after each fed token
    const Comparison cmp = compare_logits(teacher_forced(alone, s.prompt, forced), s.logits);
    worst = std::max(worst, cmp.max_diff);
    EXPECT_EQ(cmp.decided_agree, cmp.decided);
    EXPECT_LE(cmp.max_diff, scale.max_diff) << "batched vs alone: " << cmp.describe();
  }
  std::printf("[engine-cuda] batched vs alone: max |dlogit| %.3g (bf16-weight scale %.3g)\n", worst, scale.max_diff);
}
