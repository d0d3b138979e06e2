// CUDA graphs of the engine's decode steps (EngineOptions::cuda_graphs; issue 14; label gpu). Two CUDA engines, graphs
// on and graphs off, run the same seeded continuous-batching schedule in lockstep, for each of bf16 / fp16 / int8 /
// fp8_e4m3_dynamic caches — admissions (prefill), extends, batched decode steps, retirements, refusals and preemptions
// under a tight page pool — with greedy and seeded (temperature / top-k / top-p) samplers; batch sizes, page-table
// strides and split counts change as sequences come, grow past page and bucket boundaries (lengths past 300 tokens: the
// split heuristic moves off 1 past 256 keys) and go. A random phase is followed by a pressure phase that is the same for
// every seed (a refusal, then a preemption, guaranteed). Every sampled token must be identical, and the logits
// downloaded on the way bit for bit identical: a replayed graph launches exactly the kernels and arguments of the eager
// path. Each format must have run its decode steps (counted: a format that ran none fails), and the counters must show
// the graphs were used (replays, several captures, no failed capture) and not used with graphs off. Then the shipped
// 260K model (128-token context): greedy generate() with graphs on and off gives the same tokens (tok/s of both
// printed). Finally a model whose K overflows:
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

/// What one lockstep schedule did (both engines did the same; counted once).
struct Schedule {
  int admitted = 0, refused = 0, preempted = 0, extends = 0, compared_logits = 0;
  int random_steps = 0, pressure_steps = 0;  ///< decode steps of the random phase / of the pressure phase
  std::set<std::size_t> batches;
  int32_t longest = 0;
  int steps() const { return random_steps + pressure_steps; }
};

/// Two engines `on` / `off` (same model, spec, pool) through the same schedule in lockstep, every sampled token and
/// every downloaded logit row compared (token for token; logits bit for bit). Phase 1: 260 iterations of a seeded
/// random schedule (admissions of 1..300-token prompts with greedy or seeded samplers, extends, batched decode steps of
/// every live sequence, retirements after 1..120 tokens, preemption of the longest sequence when a step lacks pages).
/// Phase 2 (pressure; the same for every seed): everything retired, then 300-token prompts admitted until the pool
/// refuses one (page_size 16, 90 pages: four fit, the fifth is refused), then decode steps of all of them until a step
/// lacks pages (at 353 tokens each: a preemption), then steps of the rest. Stops at the first divergence or
/// disagreement of the engines (their states differ from there on); the caller goes on with the next format.
void run_lockstep(Engine& on, Engine& off, int32_t max_seqs, std::size_t V, uint64_t seed, const char* fmt,
                  Schedule& s) {
  std::mt19937_64 rng(seed);
  std::map<int32_t, Live> live;
  bool diverged = false;  ///< tokens / logits differ, or one engine refused what the other took: stop
  int steps = 0;
  auto remove_both = [&](int32_t id) {
    on.remove_sequence(id);
    off.remove_sequence(id);
    live.erase(id);
  };
  auto sample_both = [&](std::vector<Sampler*> a, std::vector<Sampler*> b, const char* what) {
    const std::vector<int32_t> ta = on.sample(a), tb = off.sample(b);
    EXPECT_EQ(ta, tb) << fmt << ": tokens differ after " << what << " (step " << steps << ")";
    if (ta != tb) diverged = true;
    return ta;
  };
  // admits `prompt` in both engines; fit = false when both refused it (CapacityError); a disagreement stops
  auto admit = [&](const std::vector<int32_t>& prompt, const SamplerConfig& sc, int32_t target, bool& fit) {
    const int32_t id = on.add_sequence();
    if (off.add_sequence() != id) {
      ADD_FAILURE() << fmt << ": the engines gave different sequence ids";
      diverged = true;
      return;
    }
    bool fit_on = true, fit_off = true;
    try { on.prefill(id, prompt, {}); } catch (const CapacityError&) { fit_on = false; }
    try { off.prefill(id, prompt, {}); } catch (const CapacityError&) { fit_off = false; }
    if (fit_on != fit_off) {
      ADD_FAILURE() << fmt << ": one engine refused a " << prompt.size() << "-token prompt";
      diverged = true;
      return;
    }
    fit = fit_on;
    if (!fit) {
      ++s.refused;
      on.remove_sequence(id), off.remove_sequence(id);
      return;
    }
    Live l;
    l.on = std::make_unique<Sampler>(sc), l.off = std::make_unique<Sampler>(sc);
    l.target = target;
    l.next = sample_both({l.on.get()}, {l.off.get()}, "a prefill")[0];
    live[id] = std::move(l);
    ++s.admitted;
  };
  // one decode step over every live sequence; stepped = false when both engines lacked pages (nothing was written)
  auto step = [&](bool download, bool& stepped) {
    std::vector<int32_t> ids, toks;
    std::vector<Sampler*> sa, sb;
    for (auto& [id, l] : live) {
      ids.push_back(id), toks.push_back(l.next);
      sa.push_back(l.on.get()), sb.push_back(l.off.get());
    }
    std::vector<float> la(download ? ids.size() * V : 0), lb(la.size());
    bool ok_on = true, ok_off = true;
    try { on.decode(ids, toks, la); } catch (const CapacityError&) { ok_on = false; }
    try { off.decode(ids, toks, lb); } catch (const CapacityError&) { ok_off = false; }
    if (ok_on != ok_off) {
      ADD_FAILURE() << fmt << ": one engine lacked pages for a decode step";
      diverged = true;
      return;
    }
    stepped = ok_on;
    if (!ok_on) return;
    ++steps;
    s.batches.insert(ids.size());
    if (download) {
      ++s.compared_logits;
      EXPECT_TRUE(same_bits(la, lb)) << fmt << ": decode logits differ (graphs on vs off) at step " << steps;
      if (!same_bits(la, lb)) diverged = true;
    }
    const std::vector<int32_t> next = sample_both(sa, sb, "a decode step");
    for (std::size_t i = 0; i < ids.size(); ++i) {
      Live& l = live[ids[i]];
      l.next = next[i];
      ++l.produced;
      s.longest = std::max(s.longest, on.length(ids[i]));
    }
  };
  auto preempt_longest = [&] {
    auto victim = live.begin();
    for (auto j = live.begin(); j != live.end(); ++j)
      if (on.length(j->first) > on.length(victim->first)) victim = j;
    remove_both(victim->first);
    ++s.preempted;
  };

  // ---- phase 1: the seeded random schedule
  for (int iter = 0; iter < 260 && !diverged; ++iter) {
    if (static_cast<int32_t>(live.size()) < max_seqs && (live.empty() || rng() % 3 == 0)) {
      const int n = 1 + static_cast<int>(rng() % 300);
      std::vector<int32_t> prompt(static_cast<std::size_t>(n));
      for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % V);
      SamplerConfig sc;
      if (rng() % 2) sc = SamplerConfig{0.8f, rng() % 2 ? 0.9f : 1.0f, rng() % 2 ? 20 : 0, rng()};
      bool fit = false;
      admit(prompt, sc, 1 + static_cast<int32_t>(rng() % 120), fit);
    }
    if (live.empty() || diverged) continue;
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
        if (ok_on != ok_off) {
          ADD_FAILURE() << fmt << ": one engine lacked pages for an extend";
          diverged = true;
        } else if (ok_on) {
          ++s.extends;
          it->second.next = sample_both({it->second.on.get()}, {it->second.off.get()}, "an extend")[0];
        }
      }
    }
    if (diverged) break;
    bool stepped = false;
    step(iter % 3 == 0, stepped);  // every third step also downloads the logits
    if (diverged) break;
    if (!stepped) {
      preempt_longest();
      continue;
    }
    for (auto it = live.begin(); it != live.end();) {
      const int32_t id = it->first;
      ++it;
      if (live[id].produced >= live[id].target || on.length(id) >= on.max_context()) remove_both(id);
    }
  }
  s.random_steps = steps;
  if (diverged) return;

  // ---- phase 2: pressure (the same for every seed)
  while (!live.empty()) remove_both(live.begin()->first);
  for (int k = 0; k < max_seqs; ++k) {
    std::vector<int32_t> prompt(300);
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % V);
    const SamplerConfig sc = k % 2 ? SamplerConfig{0.8f, 0.9f, 20, rng()} : SamplerConfig{};
    bool fit = false;
    admit(prompt, sc, 1 << 30, fit);
    if (diverged) return;
    if (!fit) break;
  }
  bool preempted = false;
  for (int i = 0; i < 120 && !diverged && !live.empty(); ++i) {
    bool stepped = false;
    step(true, stepped);
    if (diverged) return;
    if (stepped) {
      s.pressure_steps = steps - s.random_steps;
      if (preempted && s.pressure_steps >= 80) break;  // a few steps after the preemption
    } else {
      EXPECT_FALSE(preempted) << fmt << ": a step lacked pages again right after a preemption";
      if (preempted) return;
      preempt_longest();
      preempted = true;
    }
  }
  while (!live.empty()) remove_both(live.begin()->first);
}

}  // namespace

TEST(CudaEngineGraphs, GraphsOnAndOffGiveIdenticalTokensUnderContinuousBatching) {
  ModelConfig c;
  c.dim = 256; c.hidden_dim = 384; c.n_layers = 2; c.num_heads = 4; c.num_heads_kv = 2; c.head_dim = 64;
  c.vocab_size = 512; c.seq_len = 512; c.rope_theta = 10000.0f;
  const uint64_t seed = flashkv::testing::test_seed();
  const Model m = test::random_model(c, seed + 21);
  const std::size_t V = static_cast<std::size_t>(c.vocab_size);
  // every format runs its own schedule: a failure in one does not stop the next
  for (const char* fmt : {"bf16", "fp16", "int8", "fp8_e4m3_dynamic"}) {
    SCOPED_TRACE(fmt);
    KVCacheSpec spec;
    spec.kv_cache_dtype = fmt;
    spec.page_size = 16;
    const int32_t max_seqs = 5;
    const int64_t pages = 90;  // 1440 token slots for up to 5 sequences of up to 512: refusals and preemptions happen
    Engine on(m, spec, max_seqs, 0, cuda_engine(true, pages)), off(m, spec, max_seqs, 0, cuda_engine(false, pages));
    Schedule s;
    run_lockstep(on, off, max_seqs, V, seed + 22, fmt, s);
    const int steps = s.steps();
    const CudaGraphStats g_on = on.cuda_graph_stats(), g_off = off.cuda_graph_stats();
    std::printf("[engine-graphs] %-17s %d decode steps (%d random, %d under pressure; batch sizes %zu..%zu, longest "
                "sequence %d tokens), %d admitted, %d refused, %d preempted, %d extends; logits compared bit for bit at "
                "%d steps\n"
                "  graphs on: %lld replayed, %lld eager, %lld captures, %d graphs held | graphs off: %lld eager\n",
                fmt, steps, s.random_steps, s.pressure_steps, s.batches.empty() ? 0 : *s.batches.begin(),
                s.batches.empty() ? 0 : *s.batches.rbegin(), s.longest, s.admitted, s.refused, s.preempted, s.extends,
                s.compared_logits, static_cast<long long>(g_on.graph_steps), static_cast<long long>(g_on.eager_steps),
                static_cast<long long>(g_on.captures), g_on.graphs, static_cast<long long>(g_off.eager_steps));
    // the schedule really ran for this format (it cannot pass having compared nothing)
    EXPECT_GE(s.random_steps, 100) << "the random schedule must run its decode steps";
    EXPECT_GE(s.pressure_steps, 40) << "the pressure phase must decode up to the pool's end and past the preemption";
    EXPECT_GT(s.compared_logits, 40) << "logits must be compared";
    EXPECT_GE(s.batches.size(), 3u) << "the schedule must visit several batch sizes";
    EXPECT_GT(s.longest, 300) << "lengths must cross the split heuristic's 256-key threshold";
    EXPECT_GT(s.refused, 0) << "the tight pool must refuse a prompt";
    EXPECT_GT(s.preempted, 0) << "the tight pool must force a preemption";
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
