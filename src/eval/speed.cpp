// Prefill / decode speed per KV format (see speed.hpp).
#include "eval/speed.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "flashkv/error.hpp"

namespace flashkv::eval {

namespace {
void mean_sd(const std::vector<double>& v, double& mean, double& sd) {
  mean = sd = 0.0;
  if (v.empty()) return;
  for (double x : v) mean += x;
  mean /= static_cast<double>(v.size());
  if (v.size() < 2) return;
  for (double x : v) sd += (x - mean) * (x - mean);
  sd = std::sqrt(sd / static_cast<double>(v.size() - 1));
}
}  // namespace

std::vector<SpeedRow> run_speed(const Model& model, const std::vector<KVCacheSpec>& specs, const SpeedOptions& o,
                                const std::function<void(const SpeedRow&)>& on_row) {
  const ModelConfig& c = model.config;
  if (o.n_prompt < 1) throw Error("n_prompt", ">= 1 tokens", std::to_string(o.n_prompt));
  if (o.n_gen < 1) throw Error("n_gen", ">= 1 tokens", std::to_string(o.n_gen));
  if (o.repeats < 1) throw Error("repeats", ">= 1", std::to_string(o.repeats));
  if (o.ubatch < 1) throw Error("ubatch", ">= 1 tokens", std::to_string(o.ubatch));
  if (o.contexts.empty()) throw Error("contexts", "at least one context", "none");
  for (int32_t ctx : o.contexts)
    if (ctx > c.seq_len || ctx - o.n_gen - o.n_prompt < 0)
      throw Error("contexts", std::to_string(o.n_prompt + o.n_gen) + ".." + std::to_string(c.seq_len) +
                                  " tokens (n_prompt + n_gen .. the model's context)",
                  std::to_string(ctx));
  using clock = std::chrono::steady_clock;
  const std::size_t V = static_cast<std::size_t>(c.vocab_size);
  std::vector<SpeedRow> rows;
  std::vector<float> logits(V);
  for (const KVCacheSpec& spec : specs) {
    for (int32_t ctx : o.contexts) {
      Engine engine(model, spec, 1, ctx, o.engine);
      SpeedRow row;
      row.spec = spec;
      row.label = spec.label();
      row.context = ctx;
      row.depth = ctx - o.n_gen - o.n_prompt;
      std::vector<int32_t> toks(static_cast<std::size_t>(ctx));
      for (int32_t i = 0; i < ctx; ++i) toks[static_cast<std::size_t>(i)] = static_cast<int32_t>((i * 7919 + 13) % c.vocab_size);
      auto feed = [&](int32_t seq, int32_t from, int32_t to) {
        for (int32_t u = from; u < to; u += o.ubatch) {
          const int32_t n = std::min(o.ubatch, to - u);
          engine.extend(seq, std::span<const int32_t>(toks.data() + u, static_cast<std::size_t>(n)), std::span<float>(logits),
                        false);
        }
      };
      for (int32_t rep = 0; rep < o.repeats; ++rep) {
        const int32_t seq = engine.add_sequence();
        if (row.depth > 0) feed(seq, 0, row.depth);
        auto t0 = clock::now();
        for (int32_t i = 0; i < o.n_gen; ++i) {
          const int32_t sq[1] = {seq}, tk[1] = {toks[static_cast<std::size_t>(row.depth + i)]};
          engine.decode(sq, tk, logits);
        }
        row.tg.push_back(o.n_gen / std::chrono::duration<double>(clock::now() - t0).count());
        t0 = clock::now();
        feed(seq, row.depth + o.n_gen, ctx);
        row.pp.push_back(o.n_prompt / std::chrono::duration<double>(clock::now() - t0).count());
        if (rep == 0) {
          const KVMemory m = engine.memory();
          row.bytes_per_token = m.bytes_per_token;
          row.effective_bits = m.effective_bits;
        }
        engine.remove_sequence(seq);
      }
      row.graphs = engine.cuda_graph_stats();
      mean_sd(row.pp, row.pp_mean, row.pp_sd);
      mean_sd(row.tg, row.tg_mean, row.tg_sd);
      if (on_row) on_row(row);
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

}  // namespace flashkv::eval
