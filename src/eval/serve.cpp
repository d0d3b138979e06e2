// Continuous-batching replay of seeded requests (serve.hpp).
#include "eval/serve.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <random>

#include "flashkv/error.hpp"

namespace flashkv::eval {

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double rank = std::ceil(q / 100.0 * static_cast<double>(v.size()));
  const std::size_t i = static_cast<std::size_t>(std::clamp(rank, 1.0, static_cast<double>(v.size()))) - 1;
  return v[i];
}

namespace {

using clock_type = std::chrono::steady_clock;
double seconds(clock_type::time_point a, clock_type::time_point b) { return std::chrono::duration<double>(b - a).count(); }

struct Request {
  std::vector<int32_t> prompt;
  int32_t output = 0;
  bool started = false;  ///< TTFT recorded (a preempted request keeps its first TTFT)
};

struct Live {
  int32_t request = 0, seq = 0, produced = 0, next = 0;
  clock_type::time_point last;
};

void check(const ServeOptions& o, const ModelConfig& c) {
  if (o.requests < 1) throw Error("requests", ">= 1", std::to_string(o.requests));
  if (o.max_batch < 1) throw Error("max_batch", ">= 1", std::to_string(o.max_batch));
  if (o.prompt_min < 1 || o.prompt_max < o.prompt_min)
    throw Error("prompt_max", "1 <= prompt_min <= prompt_max", std::to_string(o.prompt_min) + ".." + std::to_string(o.prompt_max));
  if (o.output_min < 1 || o.output_max < o.output_min)
    throw Error("output_max", "1 <= output_min <= output_max", std::to_string(o.output_min) + ".." + std::to_string(o.output_max));
  if (static_cast<int64_t>(o.prompt_max) + o.output_max > c.seq_len)
    throw Error("output_max", "prompt_max + output_max <= the model's context " + std::to_string(c.seq_len),
                std::to_string(static_cast<int64_t>(o.prompt_max) + o.output_max));
}

ServeResult serve_one(const Model& model, const KVCacheSpec& spec, const ServeOptions& o) {
  const ModelConfig& c = model.config;
  std::mt19937_64 rng(o.seed);
  std::vector<Request> reqs(static_cast<std::size_t>(o.requests));
  std::uniform_int_distribution<int32_t> plen(o.prompt_min, o.prompt_max), olen(o.output_min, o.output_max),
      tok(0, c.vocab_size - 1);
  for (Request& r : reqs) {
    r.prompt.resize(static_cast<std::size_t>(plen(rng)));
    for (int32_t& t : r.prompt) t = tok(rng);
    r.output = olen(rng);
  }
  const int32_t ctx = o.prompt_max + o.output_max;
  EngineOptions eo = o.engine;
  eo.kv_capacity_pages = o.kv_capacity_pages;
  Engine e(model, spec, o.max_batch, ctx, eo);
  ServeResult res;
  res.label = spec.label();
  res.requests = o.requests;
  res.kv_pool_pages = eo.kv_capacity_pages > 0 ? eo.kv_capacity_pages
                                               : static_cast<int64_t>(o.max_batch) * ((ctx + spec.page_size - 1) / spec.page_size + 1);
  for (const Request& r : reqs) res.prompt_tokens += static_cast<int64_t>(r.prompt.size());
  std::deque<int32_t> queue;
  for (int32_t i = 0; i < o.requests; ++i) queue.push_back(i);
  std::vector<Live> live;
  std::vector<double> itl, ttft;
  Sampler greedy(SamplerConfig{});
  double batch_sum = 0;
  int64_t decode_tokens = 0;
  const auto t_start = clock_type::now();
  bool hold = false;  // after a preemption no admission until a sequence retires (else the victim is re-admitted into
                      // the pages it just gave back, and preempted again: a livelock)
  auto retire_done = [&] {
    for (auto it = live.begin(); it != live.end();) {
      if (it->produced >= reqs[static_cast<std::size_t>(it->request)].output || e.length(it->seq) >= e.max_context()) {
        res.generated_tokens += it->produced;
        e.remove_sequence(it->seq);
        it = live.erase(it);
        hold = false;
      } else {
        ++it;
      }
    }
  };
  while (!queue.empty() || !live.empty()) {
    while (!hold && !queue.empty() && static_cast<int32_t>(live.size()) < o.max_batch) {  // admit, first come first served
      const int32_t ri = queue.front();
      Request& r = reqs[static_cast<std::size_t>(ri)];
      const int32_t seq = e.add_sequence();
      const auto t0 = clock_type::now();
      try {
        e.prefill(seq, r.prompt, {});
      } catch (const CapacityError&) {
        e.remove_sequence(seq);
        ++res.deferred_admissions;
        if (live.empty())
          throw Error("kv_capacity_pages (--kv-pages)", "a pool that holds one prompt of " + std::to_string(r.prompt.size()) + " tokens",
                      std::to_string(res.kv_pool_pages) + " pages");
        break;
      }
      Sampler* s[1] = {&greedy};
      const int32_t first = e.sample(s)[0];
      const auto t1 = clock_type::now();
      res.prefill_seconds += seconds(t0, t1);
      if (!r.started) ttft.push_back(1e3 * seconds(t_start, t1));
      r.started = true;
      queue.pop_front();
      live.push_back(Live{ri, seq, 1, first, t1});
    }
    retire_done();  // outputs of one token end at the prefill
    if (live.empty()) continue;
    std::vector<int32_t> ids, toks;
    for (const Live& l : live) ids.push_back(l.seq), toks.push_back(l.next);
    const auto t0 = clock_type::now();
    try {
      e.decode(ids, toks, {});
    } catch (const CapacityError&) {  // preempt the newest sequence; its request restarts from its prompt later
      if (live.size() == 1)
        throw Error("kv_capacity_pages (--kv-pages)", "a pool that holds one sequence of prompt_max + output_max tokens",
                    std::to_string(res.kv_pool_pages) + " pages");
      const Live victim = live.back();
      live.pop_back();
      e.remove_sequence(victim.seq);
      queue.push_front(victim.request);
      ++res.preemptions;
      hold = true;
      continue;
    }
    std::vector<Sampler*> samplers(live.size(), &greedy);
    const std::vector<int32_t> next = e.sample(samplers);
    const auto t1 = clock_type::now();
    res.decode_seconds += seconds(t0, t1);
    ++res.decode_steps;
    batch_sum += static_cast<double>(live.size());
    res.max_batch_seen = std::max(res.max_batch_seen, static_cast<int32_t>(live.size()));
    if (static_cast<int32_t>(live.size()) == res.max_batch_seen) res.kv_bytes_per_token = e.memory().bytes_per_token;
    decode_tokens += static_cast<int64_t>(live.size());
    for (std::size_t i = 0; i < live.size(); ++i) {
      itl.push_back(1e3 * seconds(live[i].last, t1));
      live[i].last = t1;
      live[i].next = next[i];
      ++live[i].produced;
    }
    retire_done();
  }
  res.wall_seconds = seconds(t_start, clock_type::now());
  res.graphs = e.cuda_graph_stats();
  res.decode_tokens_per_s = res.decode_seconds > 0 ? static_cast<double>(decode_tokens) / res.decode_seconds : 0.0;
  res.throughput_tokens_per_s = res.wall_seconds > 0 ? static_cast<double>(res.generated_tokens) / res.wall_seconds : 0.0;
  res.mean_batch = res.decode_steps > 0 ? batch_sum / res.decode_steps : 0.0;
  res.itl_ms_p50 = percentile(itl, 50), res.itl_ms_p90 = percentile(itl, 90), res.itl_ms_p99 = percentile(itl, 99);
  res.itl_ms_max = percentile(itl, 100);
  res.ttft_ms_p50 = percentile(ttft, 50), res.ttft_ms_p99 = percentile(ttft, 99);
  return res;
}

}  // namespace

std::vector<ServeResult> run_serve(const Model& model, const std::vector<KVCacheSpec>& specs, const ServeOptions& o,
                                   const std::function<void(const ServeResult&)>& on_result) {
  check(o, model.config);
  std::vector<ServeResult> out;
  for (const KVCacheSpec& spec : specs) {
    out.push_back(serve_one(model, spec, o));
    if (on_result) on_result(out.back());
  }
  return out;
}

std::string serve_table(const std::vector<ServeResult>& rs) {
  std::string s =
      "| kv cache | requests | generated | decode tok/s | throughput tok/s | mean batch | ITL p50 / p90 / p99 / max ms | "
      "TTFT p50 / p99 ms | preempted | KV bytes/token |\n|---|---|---|---|---|---|---|---|---|---|\n";
  char b[512];
  for (const ServeResult& r : rs) {
    std::snprintf(b, sizeof b, "| %s | %d | %lld | %.1f | %.1f | %.1f | %.2f / %.2f / %.2f / %.2f | %.1f / %.1f | %d | %.0f |\n",
                  r.label.c_str(), r.requests, static_cast<long long>(r.generated_tokens), r.decode_tokens_per_s,
                  r.throughput_tokens_per_s, r.mean_batch, r.itl_ms_p50, r.itl_ms_p90, r.itl_ms_p99, r.itl_ms_max,
                  r.ttft_ms_p50, r.ttft_ms_p99, r.preemptions, r.kv_bytes_per_token);
    s += b;
  }
  return s;
}

}  // namespace flashkv::eval
