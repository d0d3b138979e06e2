// flashkv generate: prompt → prefill (exact tiled attention) → quantized KV cache → decode → streamed text, then
// prefill / decode tokens per second and the KV bytes used vs bf16. --chat renders the prompt as one user turn of the
// model's ChatML template. --device cuda runs the CUDA engine (EngineOptions::device).
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "cli/util_kv_memory.hpp"
#include "cli/util_json.hpp"
#include "cli/util_model_cli.hpp"
#include "cli/util_output.hpp"
#include "cli/util_parse.hpp"
#include "eval/evaluation.hpp"
#include "flashkv/engine.hpp"
#include "flashkv/error.hpp"

namespace {

struct GenerateArgs {
  std::string model, tokenizer, prompt, prompt_file, system, logits_out;
  flashkv::cli::KvOptions kv;
  flashkv::cli::DeviceOptions device;
  flashkv::cli::SamplerOptions sampling;
  int32_t steps = 256, context = 0;
  bool json = false, chat = false, system_given = false, ignore_eos = false;
};

std::string read_text_file(const std::string& path, const char* option) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw flashkv::IoError(std::string("flashkv: cannot read ") + option + " '" + path + "'");
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void run(const GenerateArgs& a) {
  using namespace flashkv;
  if (a.steps <= 0) throw Error("steps", "a positive number of tokens", std::to_string(a.steps));
  if (!a.prompt.empty() && !a.prompt_file.empty()) throw Error("prompt", "either --prompt or --prompt-file", "both");
  if (a.system_given && !a.chat) throw Error("system", "--system together with --chat", "--system without --chat");
  flashkv::cli::check_output_file(a.logits_out, "logits-out");
  const KVCacheSpec spec = flashkv::cli::kv_spec_for(a.kv, a.device);
  const EngineOptions eo = a.device.engine();
  const SamplerConfig sc = a.sampling.config();
  const std::string user_text = a.prompt_file.empty() ? a.prompt : read_text_file(a.prompt_file, "--prompt-file");
  LoadedModel lm = load_named_model(a.model, a.tokenizer);
  const Tokenizer& tok = *lm.tokenizer;
  std::string prompt_text = user_text;
  if (a.chat) {
    std::vector<ChatMessage> msgs;
    if (a.system_given) msgs.push_back({"system", a.system});
    msgs.push_back({"user", user_text});
    prompt_text = render_chat(tok.chat_template(), msgs, true);
  }
  const std::vector<int32_t> prompt = tok.encode_prompt(prompt_text);
  if (prompt.empty())
    throw Error("prompt", "a non-empty prompt (this model's tokenizer adds no BOS token to start from)", "''");
  // KIVI group fitted to head_dim, as eval and demo (eval::fit_kv_spec)
  Engine engine(lm.model, eval::fit_kv_spec(spec, lm.model.config.head_dim), 1, a.context, eo);
  if (prompt.size() > static_cast<std::size_t>(engine.max_context()))
    throw Error("prompt", "at most " + std::to_string(engine.max_context()) + " tokens (the context)",
                std::to_string(prompt.size()) + " tokens");
  Sampler sampler(sc);
  if (!a.json && !a.chat) std::fputs(prompt_text.c_str(), stdout);
  GenerateOptions go;
  go.steps = a.steps;
  go.keep_logits = !a.logits_out.empty();
  go.ignore_stop_tokens = a.ignore_eos;
  go.on_token = flashkv::cli::stdout_streamer(tok, a.json);
  GenerationResult g = generate(engine, prompt, sampler, go);
  if (!a.logits_out.empty()) {
    std::ofstream f(a.logits_out, std::ios::binary | std::ios::trunc);
    if (!f) throw IoError("flashkv: cannot write --logits-out '" + a.logits_out + "'");
    for (const auto& row : g.logits)
      f.write(reinterpret_cast<const char*>(row.data()), static_cast<std::streamsize>(row.size() * sizeof(float)));
    if (!f) throw IoError("flashkv: failed writing --logits-out '" + a.logits_out + "'");
  }
  const double prefill_tps = g.prefill_seconds > 0 ? static_cast<double>(prompt.size()) / g.prefill_seconds : 0.0;
  const double decode_tps = g.decode_seconds > 0 ? g.decode_steps / g.decode_seconds : 0.0;
  // "vs bf16": one formula and wording with `flashkv kv-mem` (src/cli/util_kv_memory.hpp): a bf16 cache of the same
  // shape, page size and tokens, pages counted on both sides.
  const ModelConfig& mc = lm.model.config;
  const double bf16_bytes = static_cast<double>(flashkv::cli::bf16_reference_bytes(
      mc.n_layers, mc.num_heads_kv, mc.head_dim, engine.spec().page_size, 1, static_cast<int64_t>(g.kv.tokens)));
  if (a.json) {
    nlohmann::json j = {{"model", lm.alias.empty() ? lm.model.path : lm.alias}, {"prompt", prompt_text},
                        {"prompt_tokens", g.prompt_tokens}, {"tokens", g.tokens},
                        {"text", tok.decode(g.tokens)},
                        {"stop", stop_reason_name(g.stop)}, {"stop_token", g.stop_token}, {"kv_cache", engine.spec().label()},
                        {"prefill_seconds", g.prefill_seconds}, {"decode_seconds", g.decode_seconds},
                        {"decode_steps", g.decode_steps},
                        {"prefill_tokens_per_s", prefill_tps}, {"decode_tokens_per_s", decode_tps},
                        {"kv_bytes", g.kv.bytes}, {"kv_tokens", g.kv.tokens}, {"kv_bf16_bytes", bf16_bytes},
                        {"kv_vs_bf16", flashkv::cli::vs_bf16_text(bf16_bytes, static_cast<double>(g.kv.bytes))},
                        {"kv_effective_bits", g.kv.effective_bits}, {"model_format", checkpoint_format_name(lm.model.format)},
                        {"device", a.device.device}, {"cuda_graphs", a.device.cuda_graphs},
                        {"cuda_graph_stats", flashkv::cli::graph_stats_json(engine.cuda_graph_stats())},
                        {"blas", eo.device == Device::cpu ? engine_blas_info() : std::string("cuBLAS (bf16, fp32 accumulate)")}};
    // Decoded bytes need not be valid UTF-8 (a token may end inside a character): invalid bytes become U+FFFD.
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return;
  }
  std::printf("\n---\n");
  std::printf("prefill: %zu tokens, %.0f tok/s | decode: %d tokens, %.0f tok/s | stop: %s | device: %s\n",
              prompt.size(), prefill_tps, g.decode_steps, decode_tps, stop_reason_name(g.stop), a.device.device.c_str());
  if (eo.device == Device::cuda)
    std::printf("%s\n", flashkv::cli::cuda_graph_summary(a.device, engine.cuda_graph_stats()).c_str());
  std::printf("kv cache %s: %zu bytes for %zu tokens (%.1f bytes/token, %.2f bits/element), %s (bf16: %.0f bytes)\n",
              engine.spec().label().c_str(), g.kv.bytes, g.kv.tokens, g.kv.bytes_per_token, g.kv.effective_bits,
              flashkv::cli::vs_bf16_text(bf16_bytes, static_cast<double>(g.kv.bytes)).c_str(), bf16_bytes);
}

void register_generate(CLI::App& root) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* sub = root.add_subcommand("generate", "generate text: prefill with exact attention, decode from a (quantized) KV cache");
  flashkv::cli::add_model_options(sub, args->model, args->tokenizer, "smollm2-135m");
  sub->add_option("--prompt", args->prompt, "prompt text (special tokens such as <|im_start|> are parsed)");
  sub->add_option("--prompt-file", args->prompt_file, "read the prompt from a file instead");
  sub->add_flag("--chat", args->chat, "render the prompt as a user turn of the model's ChatML chat template");
  sub->add_option("--system", args->system, "system message for --chat (default: the template's own)")
      ->each([args](const std::string&) { args->system_given = true; });
  flashkv::cli::add_count_option(sub, "--steps", args->steps,
                                 "maximum number of tokens to generate (default 256; stops at end-of-text/context)", 1,
                                 1 << 30);
  sub->add_flag("--ignore-eos", args->ignore_eos,
                "do not stop at end-of-generation tokens (<|im_end|>, ...): always run --steps tokens");
  flashkv::cli::add_count_option(sub, "--context", args->context,
                                 "KV cache context in tokens (default 0: the model's context length)", 0, 1 << 30);
  flashkv::cli::add_sampler_options(sub, args->sampling, 1.0f);
  sub->add_flag("--json", args->json, "print one JSON object (tokens, text, speeds, KV bytes) instead of streaming");
  sub->add_option("--logits-out", args->logits_out,
                  "write each generated step's logits (float32, [steps, vocab], little-endian) to this file");
  flashkv::cli::add_kv_options(sub, args->kv);
  flashkv::cli::add_device_option(sub, args->device);
  sub->callback([args] { run(*args); });
}

}  // namespace

FLASHKV_CLI_COMMAND("generate", register_generate);
