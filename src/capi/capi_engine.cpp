// C ABI of the generation engine (include/flashkv/flashkv_engine.h over include/flashkv/engine.hpp). Every call runs
// inside capi::guard (exceptions → status + flashkv_last_error()); structs honor struct_size. The engine runs the
// CLI's code path (flashkv generate): load_named_model, eval::fit_kv_spec, Tokenizer::encode_prompt, flashkv::generate.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "capi/capi_common.hpp"
#include "eval/evaluation.hpp"
#include "flashkv/engine.hpp"
#include "flashkv/flashkv_engine.h"

namespace flashkv::capi {
namespace {

/// A request of the batch API: its own sampler and limits; `last` is the token to feed at the next step.
struct Request {
  explicit Request(const SamplerConfig& c) : sampler(c) {}
  Sampler sampler;
  int32_t last = -1;
  int32_t generated = 0;  ///< tokens emitted (a sampled stop token is not counted, as in flashkv::generate)
  int32_t max_new = 0;
  bool stop_at_eos = true;
  bool running = true;
};

/// A validated flashkv_generate_options: the sampler config (seed resolved) and the limits.
struct Settings {
  SamplerConfig sampler;
  int32_t max_new = 256;
  bool stop_at_eos = true;
  bool seeded = false;  ///< the caller gave the seed (else the engine's stream is advanced on success)
};

}  // namespace
}  // namespace flashkv::capi

struct flashkv_engine {
  flashkv::LoadedModel lm;
  std::unique_ptr<flashkv::Engine> engine;
  int32_t max_sequences = 1;
  uint64_t seed = 42;
  uint64_t unseeded_calls = 0;  ///< calls that took their seed from the engine's stream (seed + n)
  std::string label, format;
  std::map<int32_t, flashkv::capi::Request> requests;  ///< batch API, by sequence id (ascending = event order)
  std::mutex mutex;  ///< held by every call on this handle: calls from several threads are serialized, never racing
};

namespace flashkv::capi {
namespace {

const char* str_or(const char* s, const char* fallback) { return s != nullptr && s[0] != '\0' ? s : fallback; }

flashkv_engine_options default_engine_options() {
  const KVCacheSpec spec;
  const EngineOptions eo;
  flashkv_engine_options o{};
  o.struct_size = sizeof(flashkv_engine_options);
  o.page_size = spec.page_size;
  o.residual_tokens = spec.residual;
  o.sink_tokens = spec.sinks;
  o.rotation = spec.rotate ? FLASHKV_KV_ROTATION_HADAMARD : FLASHKV_KV_ROTATION_NONE;
  o.rotation_seed = spec.rotation_seed;
  o.kv_capacity_pages = eo.kv_capacity_pages;
  o.max_sequences = 1;
  o.max_context = 0;
  o.seed = SamplerConfig{}.seed;
  return o;
}

flashkv_generate_options default_generate_options() {
  // The CLI's defaults (flashkv generate: --steps 256 --temperature 1.0 --top-p 0.9 --top-k 0).
  flashkv_generate_options o{};
  o.struct_size = sizeof(flashkv_generate_options);
  o.max_new_tokens = 256;
  o.temperature = 1.0f;
  o.top_k = 0;
  o.top_p = 0.9f;
  o.stop_at_eos = 1;
  return o;
}

/// The engine behind a handle, with its mutex held for the rest of the call.
struct Locked {
  flashkv_engine& e;
  std::unique_lock<std::mutex> hold;
};
Locked lock(const flashkv_engine* e) {
  if (e == nullptr) throw Error("engine", "a flashkv_engine from flashkv_engine_create", "NULL pointer");
  flashkv_engine& m = const_cast<flashkv_engine&>(*e);  // handles are created non-const (flashkv_engine_create)
  return {m, std::unique_lock<std::mutex>(m.mutex)};
}

Settings settings(const flashkv_engine& e, const flashkv_generate_options* p) {
  const flashkv_generate_options o = p != nullptr ? *p : default_generate_options();
  if (p != nullptr) check_struct_size(o.struct_size, sizeof(o), sizeof(o), "opts");
  if (o.max_new_tokens < 1)
    throw Error("max_new_tokens", "a positive number of tokens to generate", std::to_string(o.max_new_tokens));
  Settings s;
  s.max_new = o.max_new_tokens;
  s.stop_at_eos = o.stop_at_eos != 0;
  s.seeded = o.has_seed != 0;
  s.sampler.temperature = o.temperature;
  s.sampler.top_k = o.top_k;
  s.sampler.top_p = o.top_p;
  s.sampler.seed = s.seeded ? o.seed : e.seed + e.unseeded_calls;
  s.sampler.validate();  // 'temperature', 'top_p', 'top_k'
  return s;
}

/// Accepts the seed: the engine's stream advances only when the call succeeded.
void commit(flashkv_engine& e, const Settings& s) {
  if (!s.seeded) ++e.unseeded_calls;
}

std::span<const int32_t> prompt_span(const int32_t* prompt, int64_t n, const flashkv::Engine& engine) {
  if (n < 1) throw Error("prompt", "at least one token id (n_prompt >= 1)", "n_prompt = " + std::to_string(n));
  if (prompt == nullptr) throw Error("prompt", std::to_string(n) + " token ids", "NULL pointer");
  if (n > engine.max_context())
    throw Error("prompt", "at most " + std::to_string(engine.max_context()) + " tokens (the context)",
                std::to_string(n) + " tokens");
  return {prompt, static_cast<std::size_t>(n)};
}

/// Why a request stops after sampling `token` as its next token (the rule of flashkv::generate_in), or NONE.
int32_t stop_after(const flashkv::Engine& engine, int32_t seq, Request& r, int32_t token) {
  const Model& m = engine.model();
  if (r.stop_at_eos && std::find(m.stop_tokens.begin(), m.stop_tokens.end(), token) != m.stop_tokens.end())
    return token == m.bos_token ? FLASHKV_STOP_BOS : FLASHKV_STOP_EOS;
  ++r.generated;
  if (r.generated >= r.max_new) return FLASHKV_STOP_STEPS;
  if (engine.length(seq) >= engine.max_context()) return FLASHKV_STOP_CONTEXT;
  return FLASHKV_STOP_NONE;
}

void run_generate(flashkv_engine& e, std::span<const int32_t> prompt, const Settings& s, int32_t* tokens_out,
                  int64_t capacity, int64_t* n_out, flashkv_generation_stats* stats) {
  if (n_out == nullptr) throw Error("n_out", "an int64_t* to fill", "NULL pointer");
  *n_out = 0;
  // The most tokens this call can return: max_new_tokens, or what the context leaves (the last token is not decoded).
  const int64_t most = std::min<int64_t>(s.max_new, static_cast<int64_t>(e.engine->max_context()) -
                                                        static_cast<int64_t>(prompt.size()) + 1);
  if (capacity < most)
    throw Error("capacity",
                ">= " + std::to_string(most) + " slots at tokens_out (min(max_new_tokens, max_context - n_prompt + 1))",
                std::to_string(capacity));
  if (tokens_out == nullptr) throw Error("tokens_out", std::to_string(capacity) + " int32_t slots", "NULL pointer");
  if (stats != nullptr) check_struct_size(stats->struct_size, sizeof(*stats), sizeof(*stats), "stats");
  Sampler sampler(s.sampler);
  GenerateOptions go;
  go.steps = s.max_new;
  go.ignore_stop_tokens = !s.stop_at_eos;
  const GenerationResult g = generate(*e.engine, prompt, sampler, go);
  commit(e, s);
  std::copy(g.tokens.begin(), g.tokens.end(), tokens_out);
  *n_out = static_cast<int64_t>(g.tokens.size());
  if (stats == nullptr) return;
  flashkv_generation_stats& t = *stats;
  t.stop_reason = static_cast<int32_t>(g.stop);
  t.stop_token = g.stop_token;
  t.prompt_tokens = static_cast<int64_t>(g.prompt_tokens.size());
  t.generated_tokens = static_cast<int64_t>(g.tokens.size());
  t.decode_steps = g.decode_steps;
  t.seed = s.sampler.seed;
  t.prefill_seconds = g.prefill_seconds;
  t.decode_seconds = g.decode_seconds;
  // The CLI's formulas (src/cli/cmd_generate.cpp).
  t.prefill_tokens_per_s = g.prefill_seconds > 0 ? static_cast<double>(prompt.size()) / g.prefill_seconds : 0.0;
  t.decode_tokens_per_s = g.decode_seconds > 0 ? g.decode_steps / g.decode_seconds : 0.0;
  t.kv_bytes = static_cast<int64_t>(g.kv.bytes);
  t.kv_tokens = static_cast<int64_t>(g.kv.tokens);
  t.kv_bytes_per_token = g.kv.bytes_per_token;
  t.kv_effective_bits = g.kv.effective_bits;
  t.kv_bf16_bytes_per_token = g.kv.bf16_bytes_per_token;
}

std::vector<int32_t> encode(const flashkv_engine& e, const char* text, std::size_t len, int32_t add_bos,
                            const char* text_name) {
  if (text == nullptr && len > 0) throw Error(text_name, std::to_string(len) + " bytes", "NULL pointer");
  const std::string_view sv(text != nullptr ? text : "", len);
  const Tokenizer& tok = *e.lm.tokenizer;
  if (add_bos < -1 || add_bos > 1)
    throw Error("add_bos", "-1 (the tokenizer's rule), 0 or 1", std::to_string(add_bos));
  const bool bos = add_bos == -1 ? tok.add_bos() : add_bos == 1;
  if (bos && tok.bos_id() < 0) throw Error("add_bos", "0 or -1 (this vocabulary has no BOS token)", "1");
  return tok.encode(sv, bos, false, /*parse_special=*/true);
}

}  // namespace
}  // namespace flashkv::capi

using flashkv::Error;
using flashkv::capi::guard;

extern "C" {

flashkv_status flashkv_engine_options_default(flashkv_engine_options* opts) {
  return guard([&] {
    if (opts == nullptr) throw Error("opts", "a flashkv_engine_options pointer", "NULL pointer");
    *opts = flashkv::capi::default_engine_options();
  });
}

flashkv_status flashkv_generate_options_default(flashkv_generate_options* opts) {
  return guard([&] {
    if (opts == nullptr) throw Error("opts", "a flashkv_generate_options pointer", "NULL pointer");
    *opts = flashkv::capi::default_generate_options();
  });
}

flashkv_status flashkv_engine_create(const char* model, const flashkv_engine_options* opts, flashkv_engine** out) {
  return guard([&] {
    using namespace flashkv;
    if (out == nullptr) throw Error("out", "a flashkv_engine* to fill", "NULL pointer");
    *out = nullptr;
    if (model == nullptr || model[0] == '\0')
      throw Error("model", "a model name or a checkpoint path (llama2.c .bin or GGUF)",
                  model == nullptr ? "NULL pointer" : "''");
    const flashkv_engine_options o = opts != nullptr ? *opts : capi::default_engine_options();
    if (opts != nullptr) capi::check_struct_size(o.struct_size, sizeof(o), sizeof(o), "opts");
    // Everything that needs no file first, so a bad option is named before a model is read.
    EngineOptions eo = parse_engine_device(capi::str_or(o.device, "cpu"), "device");
    eo.kv_capacity_pages = o.kv_capacity_pages;
    if (o.rotation != FLASHKV_KV_ROTATION_NONE && o.rotation != FLASHKV_KV_ROTATION_HADAMARD)
      throw Error("opts.rotation", "FLASHKV_KV_ROTATION_NONE (0) or FLASHKV_KV_ROTATION_HADAMARD (1)",
                  std::to_string(o.rotation));
    if (o.residual_tokens < 0)
      throw Error("residual_tokens", ">= 0 tokens kept bf16", std::to_string(o.residual_tokens));
    if (o.sink_tokens < 0) throw Error("sink_tokens", ">= 0 tokens kept bf16", std::to_string(o.sink_tokens));
    // The CLI's spec (kv_spec_for + spec_from_options): the CUDA engine decodes no fp32 cache, so bf16 is its default.
    const std::string dtype = capi::str_or(o.kv_cache_dtype, eo.device == Device::cuda ? "bf16" : "fp32");
    KVCacheSpec spec = eval::spec_from_options(dtype, "", "", o.residual_tokens, o.sink_tokens,
                                               o.rotation == FLASHKV_KV_ROTATION_HADAMARD ? "hadamard" : "none",
                                               o.page_size);
    spec.rotation_seed = o.rotation_seed;
    auto e = std::make_unique<flashkv_engine>();
    e->seed = o.seed;
    e->max_sequences = o.max_sequences;
    e->lm = load_named_model(model, capi::str_or(o.tokenizer_path, ""));
    e->engine = std::make_unique<Engine>(e->lm.model, eval::fit_kv_spec(spec, e->lm.model.config.head_dim),
                                         o.max_sequences, o.max_context, eo);
    e->label = e->engine->spec().label();
    e->format = checkpoint_format_name(e->lm.model.format);
    *out = e.release();
  });
}

flashkv_status flashkv_engine_destroy(flashkv_engine* engine) {
  return guard([&] { delete engine; });
}

flashkv_status flashkv_engine_get_info(const flashkv_engine* engine, flashkv_engine_info* info) {
  return guard([&] {
    auto [h, hold] = flashkv::capi::lock(engine);
    const flashkv::Engine& e = *h.engine;
    if (info == nullptr) throw Error("info", "a flashkv_engine_info to fill", "NULL pointer");
    flashkv::capi::check_struct_size(info->struct_size, sizeof(*info), sizeof(*info), "info");
    const flashkv::ModelConfig& c = e.model().config;
    const flashkv::Tokenizer& tok = *engine->lm.tokenizer;
    info->vocab_size = c.vocab_size;
    info->max_context = e.max_context();
    info->max_sequences = engine->max_sequences;
    info->dim = c.dim;
    info->hidden_dim = c.hidden_dim;
    info->num_layers = c.n_layers;
    info->num_heads = c.num_heads;
    info->num_heads_kv = c.num_heads_kv;
    info->head_dim = c.head_dim;
    info->bos_id = tok.bos_id();
    info->eos_id = tok.eos_id();
    info->add_bos = tok.add_bos() ? 1 : 0;
    info->device = static_cast<int32_t>(e.device());
    info->device_index = e.options().device_index;
    info->kv_cache_dtype = engine->label.c_str();
    info->model_format = engine->format.c_str();
    info->model_path = e.model().path.c_str();
  });
}

flashkv_status flashkv_engine_tokenize(const flashkv_engine* engine, const char* text, size_t text_len,
                                       int32_t add_bos, int32_t* tokens, int64_t capacity, int64_t* n_tokens) {
  return guard([&] {
    [[maybe_unused]] auto [h, hold] = flashkv::capi::lock(engine);
    if (n_tokens == nullptr) throw Error("n_tokens", "an int64_t* to fill", "NULL pointer");
    if (capacity < 0) throw Error("capacity", ">= 0", std::to_string(capacity));
    if (tokens == nullptr && capacity > 0) throw Error("tokens", std::to_string(capacity) + " int32_t slots", "NULL pointer");
    const std::vector<int32_t> ids = flashkv::capi::encode(*engine, text, text_len, add_bos, "text");
    *n_tokens = static_cast<int64_t>(ids.size());
    if (tokens == nullptr) return;  // size query
    if (capacity < static_cast<int64_t>(ids.size()))
      throw flashkv::CapacityError("flashkv: argument 'capacity': expected >= " + std::to_string(ids.size()) +
                                   " token slots (the text's token count, now in *n_tokens), got " +
                                   std::to_string(capacity));
    std::copy(ids.begin(), ids.end(), tokens);
  });
}

flashkv_status flashkv_engine_detokenize(const flashkv_engine* engine, const int32_t* tokens, int64_t n_tokens,
                                         char* text, size_t capacity, size_t* text_len) {
  return guard([&] {
    [[maybe_unused]] auto [h, hold] = flashkv::capi::lock(engine);
    if (text_len == nullptr) throw Error("text_len", "a size_t* to fill", "NULL pointer");
    if (n_tokens < 0) throw Error("n_tokens", ">= 0", std::to_string(n_tokens));
    if (tokens == nullptr && n_tokens > 0) throw Error("tokens", std::to_string(n_tokens) + " token ids", "NULL pointer");
    if (text == nullptr && capacity > 0) throw Error("text", std::to_string(capacity) + " bytes", "NULL pointer");
    const std::string s = engine->lm.tokenizer->decode({tokens, static_cast<std::size_t>(n_tokens)});
    *text_len = s.size();
    if (text == nullptr) return;  // size query
    if (capacity < s.size() + 1)
      throw flashkv::CapacityError("flashkv: argument 'capacity': expected >= " + std::to_string(s.size() + 1) +
                                   " bytes (the text's length in *text_len, plus its NUL), got " +
                                   std::to_string(capacity));
    std::memcpy(text, s.data(), s.size());
    text[s.size()] = '\0';
  });
}

flashkv_status flashkv_engine_generate(flashkv_engine* engine, const int32_t* prompt, int64_t n_prompt,
                                       const flashkv_generate_options* opts, int32_t* tokens_out, int64_t capacity,
                                       int64_t* n_out, flashkv_generation_stats* stats) {
  return guard([&] {
    auto [e, hold] = flashkv::capi::lock(engine);
    const flashkv::capi::Settings s = flashkv::capi::settings(e, opts);
    flashkv::capi::run_generate(e, flashkv::capi::prompt_span(prompt, n_prompt, *e.engine), s, tokens_out, capacity,
                                n_out, stats);
  });
}

flashkv_status flashkv_engine_generate_text(flashkv_engine* engine, const char* prompt, size_t prompt_len,
                                            const flashkv_generate_options* opts, int32_t* tokens_out,
                                            int64_t capacity, int64_t* n_out, flashkv_generation_stats* stats) {
  return guard([&] {
    auto [e, hold] = flashkv::capi::lock(engine);
    const flashkv::capi::Settings s = flashkv::capi::settings(e, opts);
    const std::vector<int32_t> ids = flashkv::capi::encode(e, prompt, prompt_len, -1, "prompt");
    if (ids.empty())
      throw Error("prompt", "a non-empty prompt (this model's tokenizer adds no BOS token to start from)", "''");
    flashkv::capi::run_generate(e, flashkv::capi::prompt_span(ids.data(), static_cast<int64_t>(ids.size()), *e.engine),
                                s, tokens_out, capacity, n_out, stats);
  });
}

flashkv_status flashkv_engine_add(flashkv_engine* engine, const int32_t* prompt, int64_t n_prompt,
                                  const flashkv_generate_options* opts, flashkv_engine_event* first) {
  return guard([&] {
    using namespace flashkv;
    auto [e, hold] = capi::lock(engine);
    const capi::Settings s = capi::settings(e, opts);
    if (first == nullptr) throw Error("first", "a flashkv_engine_event to fill", "NULL pointer");
    const std::span<const int32_t> p = capi::prompt_span(prompt, n_prompt, *e.engine);
    Engine& eng = *e.engine;
    const int32_t seq = eng.add_sequence();  // CapacityError when max_sequences are live
    try {
      eng.prefill(seq, p, {});  // token range and page budget checked before anything is written
      capi::Request r(s.sampler);
      r.max_new = s.max_new;
      r.stop_at_eos = s.stop_at_eos;
      Sampler* samplers[1] = {&r.sampler};
      r.last = eng.sample(samplers)[0];
      const int32_t stop = capi::stop_after(eng, seq, r, r.last);
      r.running = stop == FLASHKV_STOP_NONE;
      e.requests.insert_or_assign(seq, std::move(r));
      *first = flashkv_engine_event{seq, e.requests.at(seq).last, stop};
    } catch (...) {
      e.requests.erase(seq);
      eng.remove_sequence(seq);
      throw;
    }
    capi::commit(e, s);
  });
}

flashkv_status flashkv_engine_step(flashkv_engine* engine, flashkv_engine_event* events, int32_t capacity,
                                   int32_t* n_events) {
  return guard([&] {
    using namespace flashkv;
    auto [e, hold] = capi::lock(engine);
    if (n_events == nullptr) throw Error("n_events", "an int32_t* to fill", "NULL pointer");
    *n_events = 0;
    std::vector<int32_t> seqs, toks;
    std::vector<Sampler*> samplers;
    for (auto& [seq, r] : e.requests) {
      if (!r.running) continue;
      seqs.push_back(seq);
      toks.push_back(r.last);
      samplers.push_back(&r.sampler);
    }
    if (capacity < static_cast<int64_t>(seqs.size()))
      throw Error("capacity", ">= " + std::to_string(seqs.size()) + " events (one per running request)",
                  std::to_string(capacity));
    if (events == nullptr && !seqs.empty()) throw Error("events", std::to_string(capacity) + " events", "NULL pointer");
    if (seqs.empty()) return;
    Engine& eng = *e.engine;
    eng.decode(seqs, toks, {});  // CapacityError (pages) before anything is computed or written
    const std::vector<int32_t> next = eng.sample(samplers);
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      capi::Request& r = e.requests.at(seqs[i]);
      r.last = next[i];
      const int32_t stop = capi::stop_after(eng, seqs[i], r, next[i]);
      r.running = stop == FLASHKV_STOP_NONE;
      events[i] = flashkv_engine_event{seqs[i], next[i], stop};
    }
    *n_events = static_cast<int32_t>(seqs.size());
  });
}

flashkv_status flashkv_engine_retire(flashkv_engine* engine, int32_t seq) {
  return guard([&] {
    auto [e, hold] = flashkv::capi::lock(engine);
    if (e.requests.find(seq) == e.requests.end())
      throw Error("seq", "a sequence id from flashkv_engine_add, not yet retired", std::to_string(seq));
    e.engine->remove_sequence(seq);
    e.requests.erase(seq);
  });
}

}  // extern "C"
