#include "eval/demo.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "eval/prompt.hpp"
#include "eval/report.hpp"
#include "flashkv/error.hpp"
#include "flashkv/kvcache.hpp"

namespace flashkv::eval {

int32_t demo_kivi_group(int32_t head_dim) {
  const int32_t g =
      parse_kv_cache_dtype(fit_kv_spec(parse_format_item("int4_kivi"), head_dim).kv_cache_dtype).first.group_size;
  return g > 0 ? g : 32;
}

std::vector<KVCacheSpec> demo_formats(int32_t head_dim) {
  std::vector<KVCacheSpec> f;
  for (const std::string s : {"fp32", "bf16", "fp8_e4m3", "int8", "int4", "int4_kivi", "int2_kivi+r32"})
    f.push_back(fit_kv_spec(parse_format_item(s), head_dim));
  return f;
}

namespace {
bool is_fp32(const KVCacheSpec& s) { return s.kv_cache_dtype == "fp32" && s.residual == 0 && s.sinks == 0 && !s.rotate; }
constexpr const char* kChatQuestion = "Explain in two sentences why the sky is blue.";
}  // namespace

DemoPlan plan_demo(const Model& model, const DemoOptions& o) {
  const EvalTarget& target = o.target;
  const std::vector<KVCacheSpec> formats = o.formats.empty() ? demo_formats(model.config.head_dim) : o.formats;
  DemoPlan plan;  // without the reference (always run, first; "fp32" in the list stands for it)
  for (const auto& s : formats)
    if (!is_fp32(s) && !target.is_reference(s)) plan.specs.push_back(s);
  // The default list keeps what the device runs (the rest is listed with the reason); a format of an explicit list
  // that the device cannot run is an UnsupportedError.
  if (o.formats.empty())
    plan.specs = runnable_specs(model, plan.specs, target, plan.skipped);
  else
    check_target(model, plan.specs, target);
  return plan;
}

DemoResult run_demo(const LoadedModel& lm, const DemoOptions& o, const Progress& progress, const DemoPlan* given) {
  const Model& model = lm.model;
  const Tokenizer& tok = *lm.tokenizer;
  const ModelConfig& c = model.config;
  const EvalTarget& target = o.target;
  if (o.steps < 0) throw Error("steps", ">= 0 (0 = 48)", std::to_string(o.steps));
  if (o.chunks < 1) throw Error("chunks", ">= 1", std::to_string(o.chunks));
  const DemoPlan plan = given ? *given : plan_demo(model, o);  // before any work
  const std::vector<KVCacheSpec>& specs = plan.specs;
  DemoResult res;
  res.device = target.device_name();
  res.reference_device = target.reference_device();
  res.skipped = plan.skipped;
  res.context = std::min(o.context, c.seq_len);

  // 1) Quality: llama-perplexity protocol on the text's first chunks. Only as much text as needed is tokenized.
  std::ifstream f(o.text_path, std::ios::binary);
  if (!f)
    throw IoError("flashkv: cannot open the demo text '" + o.text_path +
                  "' (Debian's base-files ships it; pass another UTF-8 text with --text)");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  res.text_bytes = static_cast<int64_t>(text.size());
  const std::size_t want = static_cast<std::size_t>(res.context) * static_cast<std::size_t>(o.chunks);
  std::vector<int32_t> tokens;
  for (std::size_t take = std::min(text.size(), want * 8);; take = std::min(text.size(), take * 2)) {
    std::size_t cut = take;  // cut at a line end so no word is split
    if (cut < text.size()) {
      const std::size_t nl = text.rfind('\n', cut);
      if (nl != std::string::npos && nl > 0) cut = nl + 1;
    }
    tokens = text_tokens(tok, text.substr(0, cut));
    if (tokens.size() >= want || take == text.size()) break;
  }
  PerplexityOptions po;
  po.n_ctx = res.context;
  po.max_chunks = o.chunks;
  po.bos_id = tokenizer_adds_bos(tok) ? tok.bos_id() : -1;
  int64_t base = 0, total = 0;
  auto sub = [&](int64_t d, int64_t t) {
    if (progress) progress(base + d, total == 0 ? t : total);
  };
  // Passkey plan first, so that the progress total covers both parts.
  PasskeyOptions pk;
  pk.contexts = {res.context};
  pk.depths = o.passkey_depths;
  pk.keys = 1;
  bool passkey = !o.passkey_depths.empty();
  int64_t pk_tokens = 0;
  if (passkey) {
    try {
      for (double d : pk.depths)
        pk_tokens += static_cast<int64_t>(passkey_prompt(lm, res.context, d, "00000", pk.answer_tokens).size());
    } catch (const Error&) {
      passkey = false;
      res.passkey_note = "passkey: the prompt does not fit this model's " + std::to_string(c.seq_len) + "-token context";
    }
  }
  total = static_cast<int64_t>(res.context) * o.chunks * static_cast<int64_t>(specs.size() + 1) +
          pk_tokens * static_cast<int64_t>(specs.size() + 1);
  const TextResult tr = evaluate_text(model, specs, tokens, po, sub, target);
  base += static_cast<int64_t>(res.context) * tr.chunks * static_cast<int64_t>(specs.size() + 1);
  res.scored_tokens = tr.reference.scored;

  // 2) Retrieval.
  PasskeyResult pr;
  if (passkey) pr = run_passkey(lm, specs, pk, sub, target);

  // 3) Greedy continuation per format (the reference first: its text is the one the others are compared with).
  const bool chat = has_chat_template(lm);
  if (!o.prompt.empty() || chat) {
    const std::string q = o.prompt.empty() ? kChatQuestion : o.prompt;
    res.prompt_tokens = chat ? chat_prompt_tokens(lm, q, "") : tok.encode(q, tokenizer_adds_bos(tok), false);
    res.prompt_text = q;
  } else {
    res.prompt_tokens = {tok.bos_id()};
  }
  if (res.prompt_tokens.size() >= static_cast<std::size_t>(c.seq_len))
    throw Error("prompt", "fewer than " + std::to_string(c.seq_len) + " tokens (the model's context)",
                std::to_string(res.prompt_tokens.size()) + " tokens");
  const int32_t room = c.seq_len - static_cast<int32_t>(res.prompt_tokens.size()) + 1;
  const int32_t steps = std::min(o.steps == 0 ? 48 : o.steps, room);
  const bool tiny = model.weight_bytes() < (std::size_t{16} << 20);
  const int32_t reps = o.repeats > 0 ? o.repeats : (tiny ? 3 : 1);
  std::vector<KVCacheSpec> all{target.reference_spec()};
  all.insert(all.end(), specs.begin(), specs.end());
  const std::vector<int32_t> stops = stop_tokens(lm);
  for (std::size_t i = 0; i < all.size(); ++i) {
    DemoRow row;
    row.spec = all[i];
    row.label = all[i].label();
    Engine engine(model, all[i], 1, 0, i == 0 ? target.reference_options() : target.engine);
    GenerationResult best;
    for (int32_t rep = 0; rep < reps; ++rep) {
      Sampler greedy(SamplerConfig{});
      GenerationResult g = generate(engine, res.prompt_tokens, steps, greedy);
      if (rep == 0 || g.decode_seconds < best.decode_seconds) best = std::move(g);
    }
    row.decode_tok_s = best.decode_seconds > 0 ? best.decode_steps / best.decode_seconds : 0.0;
    row.greedy_tokens = best.tokens;
    row.greedy_text = tok.decode(best.tokens);
    if (i == 0) {
      row.quality = tr.reference;
      const double elem = all[0].kv_cache_dtype == "fp32" ? 4.0 : 2.0;  // fp32 or bf16: no metadata, no windows
      row.effective_bits = 8.0 * elem;
      row.bytes_per_token = 2.0 * c.n_layers * c.num_heads_kv * c.head_dim * elem;
      row.ratio_vs_bf16 = 2.0 / elem;
    } else {
      const TextRow& t = tr.rows[i - 1];
      row.quality = t.stats;
      row.bytes_per_token = t.bytes_per_token;
      row.effective_bits = t.effective_bits;
      row.ratio_vs_bf16 = t.ratio_vs_bf16;
      row.prefill_tok_s = t.prefill_tok_s;
    }
    if (passkey) {
      const PasskeyFormat& p = pr.formats[i];
      row.passkey_trials = static_cast<int32_t>(p.trials.size());
      for (const auto& t : p.trials) row.passkey_ok += t.success ? 1 : 0;
    }
    if (i > 0) {
      const auto& ref = res.rows.front().greedy_tokens;
      const std::size_t n = std::min(ref.size(), row.greedy_tokens.size());
      for (std::size_t t = 0; t < n && row.greedy_divergence < 0; ++t)
        if (ref[t] != row.greedy_tokens[t]) row.greedy_divergence = static_cast<int32_t>(t);
      if (row.greedy_divergence < 0 && ref.size() != row.greedy_tokens.size())
        row.greedy_divergence = static_cast<int32_t>(n);
    }
    res.rows.push_back(std::move(row));
  }
  return res;
}

namespace {
std::string fm(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}
}  // namespace

std::string demo_table(const DemoResult& r) {
  const bool pk = r.passkey_note.empty();
  std::vector<std::string> head = {"kv cache", "bytes/token", "eff. bits", "vs bf16", "prefill tok/s", "decode tok/s",
                                   "PPL", "mean KLD", "same top-1"};
  if (pk) head.push_back("passkey");
  head.push_back("greedy div");
  std::vector<std::vector<std::string>> cells;
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    const DemoRow& d = r.rows[i];
    const std::string label =
        i == 0 && r.reference_device != r.device ? d.label + " (reference, " + r.reference_device + ")" : d.label;
    std::vector<std::string> c = {label, fm("%.0f", d.bytes_per_token), fm("%.2f", d.effective_bits),
                                  fm("%.2fx", d.ratio_vs_bf16), i == 0 ? "—" : fm("%.0f", d.prefill_tok_s),
                                  fm("%.0f", d.decode_tok_s), fm("%.3f", d.quality.ppl),
                                  i == 0 ? "0 (reference)" : fm(d.quality.kld_mean < 1e-3 ? "%.2e" : "%.4f", d.quality.kld_mean),
                                  i == 0 ? "—" : fm("%.1f%%", 100 * d.quality.same_top1)};
    if (pk) c.push_back(std::to_string(d.passkey_ok) + "/" + std::to_string(d.passkey_trials));
    c.push_back(i == 0 ? "—" : d.greedy_divergence < 0 ? "none" : "step " + std::to_string(d.greedy_divergence));
    cells.push_back(std::move(c));
  }
  return markdown_table(head, cells);
}

nlohmann::json demo_to_json(const DemoResult& r) {
  nlohmann::json j = {{"context", r.context}, {"text_bytes", r.text_bytes}, {"scored_tokens", r.scored_tokens},
                      {"passkey_note", r.passkey_note}, {"prompt_tokens", r.prompt_tokens},
                      {"prompt_text", r.prompt_text}, {"device", r.device},
                      {"reference_device", r.reference_device}};
  j["skipped"] = skipped_to_json(r.skipped);
  j["formats"] = nlohmann::json::array();
  for (const DemoRow& d : r.rows) {
    j["formats"].push_back({{"label", d.label},
                            {"kv_cache_dtype", d.spec.kv_cache_dtype},
                            {"residual", d.spec.residual},
                            {"bytes_per_token", d.bytes_per_token},
                            {"effective_bits", d.effective_bits},
                            {"ratio_vs_bf16", d.ratio_vs_bf16},
                            {"prefill_tok_s", d.prefill_tok_s},
                            {"decode_tok_s", d.decode_tok_s},
                            {"ppl", d.quality.ppl},
                            {"delta_ppl", d.quality.delta_ppl},
                            {"mean_kl", d.quality.kld_mean},
                            {"max_kl", d.quality.kld_max},
                            {"top1", d.quality.same_top1},
                            {"passkey_ok", d.passkey_ok},
                            {"passkey_trials", d.passkey_trials},
                            {"greedy_divergence", d.greedy_divergence},
                            {"greedy_tokens", d.greedy_tokens},
                            {"greedy_text", d.greedy_text}});
  }
  return j;
}

}  // namespace flashkv::eval
