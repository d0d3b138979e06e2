// flashkv generate: prompt → prefill (exact tiled attention) → quantized KV cache → decode → streamed text, then
// prefill / decode tokens per second and the KV bytes used vs bf16.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "eval/evaluation.hpp"
#include "flashkv/engine.hpp"
#include "flashkv/error.hpp"
#include "flashkv/kvcache.hpp"

namespace {

struct GenerateArgs {
  std::string model, tokenizer, prompt, kv_cache, kv_k, kv_v, rotate = "none";
  int32_t steps = 256, top_k = 0, residual = 0, sinks = 0, page_size = 32;
  float temperature = 1.0f, top_p = 0.9f;
  uint64_t seed = 42;
  bool json = false;
};

void run(const GenerateArgs& a) {
  using namespace flashkv;
  if (a.steps <= 0) throw Error("steps", "a positive number of tokens", std::to_string(a.steps));
  const KVCacheSpec spec =
      eval::spec_from_options(a.kv_cache, a.kv_k, a.kv_v, a.residual, a.sinks, a.rotate, a.page_size);
  SamplerConfig sc{a.temperature, a.top_p, a.top_k, a.seed};
  sc.validate();
  LoadedModel lm = load_model_with_tokenizer(a.model, a.tokenizer);
  const Tokenizer& tok = *lm.tokenizer;
  std::vector<int32_t> prompt = tok.encode(a.prompt, true, false);
  if (prompt.size() > static_cast<std::size_t>(lm.model.config.seq_len))
    throw Error("prompt", "at most " + std::to_string(lm.model.config.seq_len) + " tokens (the model's context)",
                std::to_string(prompt.size()) + " tokens");
  Engine engine(lm.model, eval::fit_kv_spec(spec, lm.model.config.head_dim), 1);  // KIVI G fitted to head_dim, as eval/demo
  const KVCacheSpec& used = engine.spec();
  Sampler sampler(sc);
  if (!a.json) std::fputs(a.prompt.c_str(), stdout);
  auto stream = [&](int32_t prev, int32_t t) {
    if (a.json) return;
    std::fputs(tok.decode_piece(prev, t).c_str(), stdout);
    std::fflush(stdout);
  };
  GenerationResult g = generate(engine, prompt, a.steps, sampler, stream);
  const double prefill_tps = g.prefill_seconds > 0 ? static_cast<double>(prompt.size()) / g.prefill_seconds : 0.0;
  const double decode_tps = g.decode_seconds > 0 ? g.decode_steps / g.decode_seconds : 0.0;
  const double bf16_bytes = g.kv.bf16_bytes_per_token * static_cast<double>(g.kv.tokens);
  if (a.json) {
    nlohmann::json j = {{"prompt_tokens", g.prompt_tokens}, {"tokens", g.tokens}, {"text", tok.decode(g.tokens)},
                        {"stop", stop_reason_name(g.stop)}, {"kv_cache", used.label()},
                        {"prefill_tokens_per_s", prefill_tps}, {"decode_tokens_per_s", decode_tps},
                        {"kv_bytes", g.kv.bytes}, {"kv_tokens", g.kv.tokens}, {"kv_bf16_bytes", bf16_bytes},
                        {"kv_effective_bits", g.kv.effective_bits}, {"model_format", checkpoint_format_name(lm.model.format)}};
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("\n---\n");
  std::printf("prefill: %zu tokens, %.0f tok/s | decode: %d tokens, %.0f tok/s | stop: %s\n", prompt.size(),
              prefill_tps, g.decode_steps, decode_tps, stop_reason_name(g.stop));
  std::printf("kv cache %s: %zu bytes for %zu tokens (%.1f bytes/token, %.2f bits/element) vs bf16 %.0f bytes (%.2fx smaller)\n",
              used.label().c_str(), g.kv.bytes, g.kv.tokens, g.kv.bytes_per_token, g.kv.effective_bits, bf16_bytes,
              g.kv.bytes > 0 ? bf16_bytes / static_cast<double>(g.kv.bytes) : 0.0);
}

void add_kv_options(CLI::App* sub, GenerateArgs& a) {
  sub->add_option("--kv-cache", a.kv_cache, std::string("KV cache format (default fp32). ") + flashkv::kv_cache_dtype_grammar());
  sub->add_option("--kv-k", a.kv_k, "K format (with --kv-v) instead of --kv-cache");
  sub->add_option("--kv-v", a.kv_v, "V format (with --kv-k)");
  sub->add_option("--residual", a.residual, "most recent tokens kept in bf16 (KIVI residual window)");
  sub->add_option("--sinks", a.sinks, "first tokens kept in bf16");
  sub->add_option("--rotate", a.rotate, "none | hadamard (rotation before quantization)");
  sub->add_option("--page-size", a.page_size, "tokens per cache page (power of two, 16-256)");
}

void register_generate(CLI::App& root) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* sub = root.add_subcommand("generate", "generate text: prefill with exact attention, decode from a (quantized) KV cache");
  sub->add_option("--model", args->model, "checkpoint: llama2.c (.bin) or GGUF")->required();
  sub->add_option("--tokenizer", args->tokenizer, "llama2.c tokenizer file (default: the vocabulary embedded in a GGUF)");
  sub->add_option("--prompt", args->prompt, "prompt text (default: empty, start from BOS)");
  sub->add_option("--steps", args->steps, "maximum number of tokens to generate (default 256; stops at BOS/EOS/context)");
  sub->add_option("--temperature", args->temperature, "0 = greedy (default 1.0)");
  sub->add_option("--top-p", args->top_p, "nucleus sampling threshold in (0, 1] (default 0.9)");
  sub->add_option("--top-k", args->top_k, "keep the k most probable tokens (0 = off)");
  sub->add_option("--seed", args->seed, "sampler seed (default 42)");
  sub->add_flag("--json", args->json, "print one JSON object (tokens, text, speeds, KV bytes) instead of streaming");
  add_kv_options(sub, *args);
  sub->callback([args] { run(*args); });
}

}  // namespace

FLASHKV_CLI_COMMAND("generate", register_generate);
