// CUDA graphs of the engine's decode steps (EngineOptions::cuda_graphs; issue 14; label gpu). Two CUDA engines, graphs
// on and graphs off, run the same seeded continuous-batching schedule in lockstep — admissions (prefill), extends,
// batched decode steps, retirements, refusals and preemptions under a tight page pool — with greedy and seeded
// (temperature / top-k / top-p) samplers; batch sizes, page-table strides and split counts change as sequences come,
// grow past page and bucket boundaries (lengths up to ~420 tokens: the split heuristic moves off 1 past 256 keys) and
// go. Every sampled token must be identical, and the logits downloaded on the way bit for bit identical: a replayed
// graph launches exactly the kernels and arguments of the eager path. The counters must show the graphs were used
// (replays, several captures, no failed capture) and not used with graphs off. Then the shipped 260K model (128-token
// context): greedy generate() with graphs on and off gives the same tokens (tok/s of both printed). Finally a model whose K overflows:
// the in-kernel check's error reaches sample() naming k and the layer, as the CPU engine's append does.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "common/reference.hpp"
#include "engine_compare.hpp"
#include "flashkv/error.hpp"
#include "../engine/random_model.hpp"
#include "../engine/test_util.hpp"

using namespace flashkv;

namespace {

EngineOptions cuda_engine(bool graphs, int64_t pages) {
  EngineOptions o;
  o.device = Device::cuda;
  o.cuda_graphs = graphs;
  o.kv_capacity_pages = pages;
  return o;
}

struct Live {
  std::unique_ptr<Sampler> on, off;  ///< the same config and seed, one per engine
  int32_t next = 0, produced = 0, target = 0;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST(CudaEngineGraphs, GraphsOnAndOffGiveIdenticalTokensUnderContinuousBatching) {
  ModelConfig c;
  c.dim = 256; c.hidden_dim = 384; c.n_layers = 2; c.num_heads = 4; c.num_heads_kv = 2; c.head_dim = 64;
  c.vocab_size = 512; c.seq_len = 512; c.rope_theta = 10000.0f;
  const uint64_t seed = flashkv::testing::test_seed();
  const Model m = test::random_model(c, seed + 21);
  const std::size_t V = static_cast<std::size_t>(c.vocab_size);
  for (const char* fmt : {"bf16", "fp16", "int8", "fp8_e4m3_dynamic"}) {
    KVCacheSpec spec;
    spec.kv_cache_dtype = fmt;
    spec.page_size = 16;
    const int32_t max_seqs = 5;
    const int64_t pages = 90;  // 1440 token slots for up to 5 sequences of up to 512: refusals and preemptions happen
    Engine on(m, spec, max_seqs, 0, cuda_engine(true, pages)), off(m, spec, max_seqs, 0, cuda_engine(false, pages));
    std::mt19937_64 rng(seed + 22);
    std::map<int32_t, Live> live;
    int admitted = 0, refused = 0, preempted = 0, extends = 0, steps = 0, compared_logits = 0;
    std::set<std::size_t> batches;
    int32_t longest = 0;
    auto remove_both = [&](int32_t id) {
      on.remove_sequence(id);
      off.remove_sequence(id);
      live.erase(id);
    };
    auto sample_both = [&](std::vector<Sampler*> a, std::vector<Sampler*> b, const char* what) {
      const std::vector<int32_t> ta = on.sample(a), tb = off.sample(b);
      EXPECT_EQ(ta, tb) << fmt << ": tokens differ after " << what << " (step " << steps << ")";
      return ta;
    };
    for (int iter = 0; iter < 260 && !::testing::Test::HasFailure(); ++iter) {
      // admit
      if (static_cast<int32_t>(live.size()) < max_seqs && (live.empty() || rng() % 3 == 0)) {
        const int n = 1 + static_cast<int>(rng() % 300);
        std::vector<int32_t> prompt(static_cast<std::size_t>(n));
        for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % V);
        SamplerConfig sc;
        if (rng() % 2) sc = SamplerConfig{0.8f, rng() % 2 ? 0.9f : 1.0f, rng() % 2 ? 20 : 0, rng()};
        const int32_t id = on.add_sequence();
        ASSERT_EQ(off.add_sequence(), id);
        bool fit_on = true, fit_off = true;
        try { on.prefill(id, prompt, {}); } catch (const CapacityError&) { fit_on = false; }
        try { off.prefill(id, prompt, {}); } catch (const CapacityError&) { fit_off = false; }
        ASSERT_EQ(fit_on, fit_off);
        if (!fit_on) {
          ++refused;
          on.remove_sequence(id), off.remove_sequence(id);
        } else {
          Live l;
          l.on = std::make_unique<Sampler>(sc), l.off = std::make_unique<Sampler>(sc);
          l.target = 1 + static_cast<int32_t>(rng() % 120);
          l.next = sample_both({l.on.get()}, {l.off.get()}, "a prefill")[0];
          live[id] = std::move(l);
          ++admitted;
        }
      }
      if (live.empty()) continue;
      // now and then an extend (eager, between graph steps) of one live sequence
      if (rng() % 11 == 0) {
        auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
        const int32_t room = on.max_context() - on.length(it->first);
        if (room > 5) {
          std::vector<int32_t> chunk = {it->second.next};
          for (int i = 0; i < 3; ++i) chunk.push_back(static_cast<int32_t>(rng() % V));
          bool ok_on = true, ok_off = true;
          try { on.extend(it->first, chunk, {}); } catch (const CapacityError&) { ok_on = false; }
          try { off.extend(it->first, chunk, {}); } catch (const CapacityError&) { ok_off = false; }
          ASSERT_EQ(ok_on, ok_off);
          if (ok_on) {
            ++extends;
            it->second.next = sample_both({it->second.on.get()}, {it->second.off.get()}, "an extend")[0];
          }
        }
      }
      // one decode step over every live sequence; every third step also downloads the logits
      std::vector<int32_t> ids, toks;
      std::vector<Sampler*> sa, sb;
      for (auto& [id, l] : live) {
        ids.push_back(id), toks.push_back(l.next);
        sa.push_back(l.on.get()), sb.push_back(l.off.get());
      }
      const bool download = iter % 3 == 0;
      std::vector<float> la(download ? ids.size() * V : 0), lb(la.size());
      bool ok_on = true, ok_off = true;
      try { on.decode(ids, toks, la); } catch (const CapacityError&) { ok_on = false; }
      try { off.decode(ids, toks, lb); } catch (const CapacityError&) { ok_off = false; }
      ASSERT_EQ(ok_on, ok_off);
      if (!ok_on) {  // preempt the longest sequence (nothing was written)
        auto victim = live.begin();
        for (auto j = live.begin(); j != live.end(); ++j)
          if (on.length(j->first) > on.length(victim->first)) victim = j;
        remove_both(victim->first);
        ++preempted;
        continue;
      }
      ++steps;
      batches.insert(ids.size());
      if (download) {
        ++compared_logits;
        EXPECT_TRUE(same_bits(la, lb)) << fmt << ": decode logits differ (graphs on vs off) at step " << steps;
      }
      const std::vector<int32_t> next = sample_both(sa, sb, "a decode step");
      for (std::size_t i = 0; i < ids.size(); ++i) {
        Live& l = live[ids[i]];
        l.next = next[i];
        ++l.produced;
        longest = std::max(longest, on.length(ids[i]));
      }
      for (auto it = live.begin(); it != live.end();) {
        if (it->second.produced >= it->second.target || on.length(it->first) >= on.max_context()) {
          const int32_t id = it->first;
          ++it;
          remove_both(id);
        } else {
          ++it;
        }
      }
    }
    const CudaGraphStats g_on = on.cuda_graph_stats(), g_off = off.cuda_graph_stats();
    std::printf("[engine-graphs] %-17s %d decode steps (batch sizes %zu..%zu, longest sequence %d tokens), %d admitted, "
                "%d refused, %d preempted, %d extends; logits compared bit for bit at %d steps\n"
                "  graphs on: %lld replayed, %lld eager, %lld captures, %d graphs held | graphs off: %lld eager\n",
                fmt, steps, batches.empty() ? 0 : *batches.begin(), batches.empty() ? 0 : *batches.rbegin(), longest,
                admitted, refused, preempted, extends, compared_logits, static_cast<long long>(g_on.graph_steps),
                static_cast<long long>(g_on.eager_steps), static_cast<long long>(g_on.captures), g_on.graphs,
                static_cast<long long>(g_off.eager_steps));
    EXPECT_GE(batches.size(), 3u) << "the schedule must visit several batch sizes";
    EXPECT_GT(longest, 300) << "lengths must cross the split heuristic's 256-key threshold";
    EXPECT_GT(refused + preempted, 0) << "the tight pool must refuse or preempt";
    EXPECT_EQ(g_on.capture_failures, 0) << g_on.last_capture_error;
    EXPECT_EQ(g_on.graph_steps + g_on.eager_steps, steps);
    EXPECT_EQ(g_on.eager_steps, 0);
    EXPECT_GE(g_on.captures, 4) << "several buckets (batch, stride, splits)";
    EXPECT_LT(g_on.captures, steps / 2) << "buckets must be reused";
    EXPECT_EQ(g_off.graph_steps, 0);
    EXPECT_EQ(g_off.captures, 0);
    EXPECT_EQ(g_off.eager_steps, steps);
  }
}

TEST(CudaEngineGraphs, ShippedModelGreedyGenerationSameWithAndWithoutGraphs) {
  FLASHKV_SKIP_WITHOUT_MODELS();
  LoadedModel lm = load_model_with_tokenizer(test::model_path(), test::tokenizer_path());
  GenerateOptions go;
  go.steps = 200;  // to the context end (128 tokens): the page-table stride bucket grows 1 -> 2 -> 4 on the way
  go.ignore_stop_tokens = true;
  const std::vector<int32_t> bos{1};
  std::vector<int32_t> tokens[2];
  double tps[2] = {0, 0};
  for (int graphs = 0; graphs < 2; ++graphs) {
    KVCacheSpec spec;
    spec.kv_cache_dtype = "bf16";
    Engine e(lm.model, spec, 1, 0, cuda_engine(graphs == 1, 0));
    for (int warm = 0; warm < 2; ++warm) {  // the second run reuses the first one's graphs
      Sampler greedy(SamplerConfig{});
      const GenerationResult r = generate(e, bos, greedy, go);
      tokens[graphs] = r.tokens;
      tps[graphs] = r.decode_seconds > 0 ? r.decode_steps / r.decode_seconds : 0;
    }
    const CudaGraphStats s = e.cuda_graph_stats();
    std::printf("[engine-graphs] aidreams260K greedy, graphs %s: %.0f decode tok/s (%lld replayed, %lld eager, %lld "
                "captures)\n", graphs ? "on " : "off", tps[graphs], static_cast<long long>(s.graph_steps),
                static_cast<long long>(s.eager_steps), static_cast<long long>(s.captures));
    if (graphs) {
      EXPECT_EQ(s.capture_failures, 0) << s.last_capture_error;
      EXPECT_GT(s.graph_steps, s.captures);
    }
  }
  EXPECT_EQ(tokens[0], tokens[1]) << "greedy tokens differ with graphs on vs off";
}

TEST(CudaEngineGraphs, NonFiniteKeysAreReportedLikeTheCpuEngine) {
  ModelConfig c;
  c.dim = 128; c.hidden_dim = 128; c.n_layers = 2; c.num_heads = 2; c.num_heads_kv = 1; c.head_dim = 64;
  c.vocab_size = 64; c.seq_len = 64;
  Model m = test::random_model(c, 9);
  // layer 1's Wk of 1e38: its products overflow float32, so K is ±inf / NaN there
  float* wk = const_cast<float*>(m.layers[1].wk);
  for (std::size_t i = 0; i < static_cast<std::size_t>(c.kv_dim()) * c.dim; ++i) wk[i] = 1e38f;
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  {
    Engine cpu(m, KVCacheSpec{}, 1);
    const int32_t s = cpu.add_sequence();
    try {
      cpu.prefill(s, prompt, {});
      ADD_FAILURE() << "the CPU engine accepted a non-finite K";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "k") << e.what();
    }
  }
  for (const char* fmt : {"bf16", "int8"}) {
    KVCacheSpec spec;
    spec.kv_cache_dtype = fmt;
    for (bool graphs : {false, true}) {
      Engine gpu(m, spec, 2, 0, cuda_engine(graphs, 0));
      const int32_t s = gpu.add_sequence();
      Sampler greedy(SamplerConfig{});
      Sampler* sp[1] = {&greedy};
      try {
        gpu.prefill(s, prompt, {});
        (void)gpu.sample(sp);
        ADD_FAILURE() << fmt << ": the CUDA engine accepted a non-finite K";
      } catch (const Error& e) {
        EXPECT_EQ(e.argument(), "k") << e.what();
        EXPECT_NE(std::string(e.what()).find("layer 1"), std::string::npos) << e.what();
        std::printf("[engine-graphs] %s: %s\n", fmt, e.what());
      }
      gpu.remove_sequence(s);  // the engine goes on: another sequence's decode reports the same again
      const int32_t t = gpu.add_sequence();
      gpu.prefill(t, std::vector<int32_t>{7}, {});
      EXPECT_THROW((void)gpu.sample(sp), Error);
      const int32_t ids[1] = {t}, toks[1] = {3};
      EXPECT_NO_THROW(gpu.decode(ids, toks, {}));  // the error was reported and cleared
      EXPECT_THROW((void)gpu.sample(sp), Error) << "the decode step wrote a non-finite K again";
    }
  }
}
