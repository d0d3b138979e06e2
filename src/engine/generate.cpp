// Autoregressive generation loop: feed the prompt (prefill, or extend an existing sequence), then sample → decode until
// an end-of-generation token (Model::stop_tokens), the step limit or the context end.
#include <algorithm>
#include <chrono>

#include "flashkv/engine.hpp"
#include "flashkv/error.hpp"

namespace flashkv {

GenerationResult generate_in(Engine& engine, int32_t seq, std::span<const int32_t> tokens, Sampler& sampler,
                             const GenerateOptions& o) {
  const int32_t steps = o.steps;
  const Model& m = engine.model();
  const ModelConfig& c = m.config;
  if (steps <= 0) throw Error("steps", "a positive number of tokens to generate", std::to_string(steps));
  if (tokens.empty()) throw Error("prompt", "at least one token", "0 tokens");
  const int32_t cached = engine.length(seq);
  if (static_cast<int64_t>(cached) + static_cast<int64_t>(tokens.size()) > engine.max_context())
    throw Error("prompt", "at most " + std::to_string(engine.max_context() - cached) + " tokens (the model's context" +
                              (cached > 0 ? ", " + std::to_string(cached) + " already cached)" : std::string(")")),
                std::to_string(tokens.size()) + " tokens");
  GenerationResult res;
  res.prompt_tokens.assign(tokens.begin(), tokens.end());
  // Logits come back to the host only when the caller keeps them; sampling runs on the engine's device.
  std::vector<float> logits(o.keep_logits ? static_cast<std::size_t>(c.vocab_size) : 0);
  Sampler* samplers[1] = {&sampler};
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  if (cached == 0) engine.prefill(seq, tokens, logits);
  else engine.extend(seq, tokens, logits);
  res.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  int32_t prev = tokens.back();
  for (int32_t step = 0; step < steps; ++step) {
    // A decode step is decode() + the sampling of its token: on CUDA decode() returns once its work is enqueued and
    // sample() waits for it.
    auto ts = clock::now();
    const int32_t next = engine.sample(samplers)[0];
    (step > 0 ? res.decode_seconds : res.prefill_seconds) += std::chrono::duration<double>(clock::now() - ts).count();
    if (!o.ignore_stop_tokens && std::find(m.stop_tokens.begin(), m.stop_tokens.end(), next) != m.stop_tokens.end()) {
      res.stop = next == m.bos_token ? StopReason::bos : StopReason::eos;
      res.stop_token = next;
      break;
    }
    res.tokens.push_back(next);
    if (o.keep_logits) res.logits.push_back(logits);
    if (o.on_token) o.on_token(prev, next);
    prev = next;
    if (step + 1 == steps) { res.stop = StopReason::steps; break; }
    if (engine.length(seq) >= engine.max_context()) { res.stop = StopReason::context; break; }
    auto t1 = clock::now();
    const int32_t tok[1] = {next};
    const int32_t sq[1] = {seq};
    engine.decode(sq, tok, logits);
    res.decode_seconds += std::chrono::duration<double>(clock::now() - t1).count();
    ++res.decode_steps;
  }
  res.kv = engine.memory();
  return res;
}

GenerationResult generate(Engine& engine, std::span<const int32_t> prompt_tokens, int32_t steps, Sampler& sampler,
                          const std::function<void(int32_t, int32_t)>& on_token, bool keep_logits) {
  GenerateOptions o;
  o.steps = steps;
  o.on_token = on_token;
  o.keep_logits = keep_logits;
  return generate(engine, prompt_tokens, sampler, o);
}

GenerationResult generate(Engine& engine, std::span<const int32_t> prompt_tokens, Sampler& sampler,
                          const GenerateOptions& o) {
  const int32_t steps = o.steps;
  if (steps <= 0) throw Error("steps", "a positive number of tokens to generate", std::to_string(steps));
  if (prompt_tokens.empty()) throw Error("prompt", "at least one token (BOS or text)", "0 tokens");
  if (prompt_tokens.size() > static_cast<std::size_t>(engine.max_context()))
    throw Error("prompt", "at most " + std::to_string(engine.max_context()) + " tokens (the model's context)",
                std::to_string(prompt_tokens.size()) + " tokens");
  const int32_t seq = engine.add_sequence();
  struct Release {
    Engine& e;
    int32_t s;
    ~Release() { e.remove_sequence(s); }
  } release{engine, seq};
  return generate_in(engine, seq, prompt_tokens, sampler, o);
}

}  // namespace flashkv
