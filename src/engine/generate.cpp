// Autoregressive generation loop: prefill the prompt, then sample → decode until BOS/EOS, the step limit or the
// context end (llama2.c convention: the model emits BOS to end a text).
#include <chrono>

#include "flashkv/engine.hpp"
#include "flashkv/error.hpp"

namespace flashkv {

GenerationResult generate(Engine& engine, std::span<const int32_t> prompt_tokens, int32_t steps, Sampler& sampler,
                          const std::function<void(int32_t, int32_t)>& on_token, bool keep_logits) {
  const ModelConfig& c = engine.model().config;
  if (steps <= 0) throw Error("steps", "a positive number of tokens to generate", std::to_string(steps));
  if (prompt_tokens.empty()) throw Error("prompt", "at least the BOS token", "0 tokens");
  if (prompt_tokens.size() > static_cast<std::size_t>(c.seq_len))
    throw Error("prompt", "at most " + std::to_string(c.seq_len) + " tokens (the model's context)",
                std::to_string(prompt_tokens.size()) + " tokens");
  GenerationResult res;
  res.prompt_tokens.assign(prompt_tokens.begin(), prompt_tokens.end());
  const int32_t seq = engine.add_sequence();
  struct Release {
    Engine& e;
    int32_t s;
    ~Release() { e.remove_sequence(s); }
  } release{engine, seq};
  std::vector<float> logits(static_cast<std::size_t>(c.vocab_size));
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  engine.prefill(seq, prompt_tokens, logits);
  res.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  const int32_t bos = 1, eos = 2;
  int32_t prev = prompt_tokens.back();
  for (int32_t step = 0; step < steps; ++step) {
    const int32_t next = sampler.sample(logits);
    if (next == bos) { res.stop = StopReason::bos; break; }
    if (next == eos) { res.stop = StopReason::eos; break; }
    res.tokens.push_back(next);
    if (keep_logits) res.logits.push_back(logits);
    if (on_token) on_token(prev, next);
    prev = next;
    if (step + 1 == steps) { res.stop = StopReason::steps; break; }
    if (engine.length(seq) >= c.seq_len) { res.stop = StopReason::context; break; }
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

}  // namespace flashkv
