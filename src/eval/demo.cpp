#include "eval/demo.hpp"

#include "flashkv/error.hpp"

namespace flashkv::eval {

int32_t demo_kivi_group(int32_t head_dim) { return head_dim >= 32 ? 32 : head_dim; }

std::vector<KVCacheSpec> demo_formats(int32_t head_dim) {
  const std::string g = "_g" + std::to_string(demo_kivi_group(head_dim));
  std::vector<KVCacheSpec> f;
  for (const std::string s : {"fp32", "bf16", "fp8_e4m3", "int8", "int4"}) f.push_back(parse_format_item(s));
  f.push_back(parse_format_item("int4_kivi" + g));
  f.push_back(parse_format_item("int2_kivi" + g + "+r32"));
  return f;
}

DemoResult run_demo(const LoadedModel& lm, const DemoOptions& o, const Progress& progress) {
  const Model& model = lm.model;
  const Tokenizer& tok = *lm.tokenizer;
  const ModelConfig& c = model.config;
  const std::vector<KVCacheSpec> formats = o.formats.empty() ? demo_formats(c.head_dim) : o.formats;
  if (o.samples < 0) throw Error("samples", ">= 0", std::to_string(o.samples));
  DemoResult res;
  res.prompt_tokens = tok.encode(o.prompt, true, false);
  if (res.prompt_tokens.size() > static_cast<std::size_t>(c.seq_len))
    throw Error("prompt", "at most " + std::to_string(c.seq_len) + " tokens (the model's context)",
                std::to_string(res.prompt_tokens.size()) + " tokens");
  const int32_t room = c.seq_len - static_cast<int32_t>(res.prompt_tokens.size()) + 1;
  if (o.steps < 0) throw Error("steps", ">= 0 (0 = to the context end)", std::to_string(o.steps));
  const int32_t steps = o.steps == 0 ? room : std::min(o.steps, room);

  // 1) The fp32 cache's greedy text (the reference; also warms caches and thread pools before anything is timed),
  //    then greedy generation per format.
  std::vector<int32_t> ref_tokens;
  {
    Engine engine(model, KVCacheSpec{}, 1);
    Sampler greedy(SamplerConfig{});
    ref_tokens = generate(engine, res.prompt_tokens, steps, greedy).tokens;
  }
  std::vector<GenerationResult> gens;
  for (const auto& spec : formats) {
    Engine engine(model, spec, 1);
    // Best of 3 identical greedy runs for the decode speed (the tokens are the same every time).
    GenerationResult best;
    for (int rep = 0; rep < 3; ++rep) {
      Sampler greedy(SamplerConfig{});
      GenerationResult g = generate(engine, res.prompt_tokens, steps, greedy);
      if (rep == 0 || g.decode_seconds < best.decode_seconds) best = std::move(g);
    }
    gens.push_back(std::move(best));
  }
  // 2) Teacher-forced sequences: the fp32 greedy text (prompt + generated), plus sampled ones.
  std::vector<std::vector<int32_t>> seqs;
  std::vector<int32_t> first = res.prompt_tokens;
  first.insert(first.end(), ref_tokens.begin(), ref_tokens.end());
  if (first.size() > static_cast<std::size_t>(c.seq_len)) first.resize(static_cast<std::size_t>(c.seq_len));
  seqs.push_back(first);
  if (o.samples > 0) {
    auto sampled = sample_sequences(model, o.samples, c.seq_len, o.seed);
    seqs.insert(seqs.end(), sampled.begin(), sampled.end());
  }
  res.rows = evaluate(model, formats, seqs, 0, progress);
  res.sequences = static_cast<int32_t>(seqs.size());
  for (std::size_t i = 0; i < res.rows.size(); ++i) {
    FormatRow& row = res.rows[i];
    const GenerationResult& g = gens[i];
    row.decode_tok_s = g.decode_seconds > 0 ? g.decode_steps / g.decode_seconds : 0.0;
    row.greedy_tokens = g.tokens;
    row.greedy_text = tok.decode(g.tokens);
    row.greedy_divergence = -1;
    const std::size_t n = std::min(g.tokens.size(), ref_tokens.size());
    for (std::size_t t = 0; t < n; ++t)
      if (g.tokens[t] != ref_tokens[t]) { row.greedy_divergence = static_cast<int32_t>(t); break; }
    if (row.greedy_divergence < 0 && g.tokens.size() != ref_tokens.size()) row.greedy_divergence = static_cast<int32_t>(n);
    res.positions = row.metrics.positions;
  }
  return res;
}

}  // namespace flashkv::eval
