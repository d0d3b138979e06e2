// flashkv chat: a multi-turn conversation with an instruction-tuned model through its ChatML template. The whole
// conversation stays in one KV-cache sequence: each turn feeds only the new text (closing the previous reply, the user
// message, the assistant header) through Engine::extend and decodes the reply from the (quantized) cache.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "cli/util_model_cli.hpp"
#include "cli/util_parse.hpp"
#include "eval/evaluation.hpp"
#include "flashkv/engine.hpp"
#include "flashkv/error.hpp"

namespace {

struct ChatArgs {
  std::string model, tokenizer, system;
  std::vector<std::string> messages;
  flashkv::cli::KvOptions kv;
  flashkv::cli::SamplerOptions sampling;
  int32_t steps = 256, context = 0;
  bool json = false, system_given = false;
};

void run(const ChatArgs& a) {
  using namespace flashkv;
  if (a.steps <= 0) throw Error("steps", "a positive number of tokens per reply", std::to_string(a.steps));
  const KVCacheSpec spec = a.kv.spec();
  const SamplerConfig sc = a.sampling.config();
  LoadedModel lm = load_named_model(a.model, a.tokenizer);
  const Tokenizer& tok = *lm.tokenizer;
  render_chat(tok.chat_template(), {}, false);  // Error now, before reading input, if the model has no ChatML template
  // KIVI group fitted to head_dim, as eval and demo (eval::fit_kv_spec)
  Engine engine(lm.model, eval::fit_kv_spec(spec, lm.model.config.head_dim), 1, a.context);
  Sampler sampler(sc);
  const int32_t seq = engine.add_sequence();
  const bool interactive = a.messages.empty() && ::isatty(STDIN_FILENO) && !a.json;

  std::vector<ChatMessage> history;
  if (a.system_given) history.push_back({"system", a.system});
  std::string fed;  // the text the cache holds so far (rendered template + replies)
  std::size_t next_message = 0;
  for (int turn = 0;; ++turn) {
    std::string user;
    if (!a.messages.empty()) {
      if (next_message == a.messages.size()) break;
      user = a.messages[next_message++];
    } else {
      if (interactive) { std::fputs("> ", stdout); std::fflush(stdout); }
      if (!std::getline(std::cin, user)) break;
      if (user.empty()) continue;
    }
    history.push_back({"user", user});
    const std::string rendered = render_chat(tok.chat_template(), history, true);
    // The new chunk is what the rendering adds to the text already cached (it starts at a special token, so it
    // tokenizes the same alone as inside the whole conversation).
    if (rendered.compare(0, fed.size(), fed) != 0)
      throw Error("chat_template", "a template whose rendering extends the previous turn", "a rendering that rewrites it");
    const std::vector<int32_t> chunk =
        tok.encode(std::string_view(rendered).substr(fed.size()), turn == 0 && tok.add_bos(), false, true);
    if (engine.length(seq) + static_cast<int64_t>(chunk.size()) >= engine.max_context())
      throw Error("conversation", "at most " + std::to_string(engine.max_context()) + " tokens (the context)",
                  std::to_string(engine.length(seq) + static_cast<int64_t>(chunk.size())) + " tokens after turn " +
                      std::to_string(turn + 1));
    const int32_t context_before = engine.length(seq);
    if (!a.json && !interactive) std::printf("user: %s\nassistant: ", user.c_str());
    GenerateOptions go;
    go.steps = a.steps;
    go.on_token = flashkv::cli::stdout_streamer(tok, a.json);
    GenerationResult g = generate_in(engine, seq, chunk, sampler, go);
    const std::string reply = tok.decode(g.tokens);
    fed = rendered + reply;
    history.push_back({"assistant", reply});
    if (a.json) {
      nlohmann::json j = {{"turn", turn + 1}, {"user", user}, {"reply", reply}, {"reply_tokens", g.tokens},
                          {"stop", stop_reason_name(g.stop)}, {"context", rendered},
                          {"context_tokens", context_before + static_cast<int32_t>(chunk.size())},
                          {"chunk_tokens", chunk}, {"prefill_seconds", g.prefill_seconds},
                          {"decode_tokens_per_s", g.decode_seconds > 0 ? g.decode_steps / g.decode_seconds : 0.0}};
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::printf("\n");
      if (!interactive) std::printf("\n");
    }
    std::fflush(stdout);
    if (g.stop == StopReason::context) break;
  }
}

void register_chat(CLI::App& root) {
  auto args = std::make_shared<ChatArgs>();
  CLI::App* sub = root.add_subcommand(
      "chat", "chat with an instruction-tuned model (ChatML template; one KV-cache sequence for the whole conversation)");
  flashkv::cli::add_model_options(sub, args->model, args->tokenizer, "smollm2-135m");
  sub->add_option("--message", args->messages,
                  "a user turn (repeatable; default: read one turn per line from stdin until EOF)");
  sub->add_option("--system", args->system, "system message (default: the template's own)")
      ->each([args](const std::string&) { args->system_given = true; });
  flashkv::cli::add_count_option(sub, "--steps", args->steps, "maximum tokens per reply (default 256)", 1, 1 << 30);
  flashkv::cli::add_count_option(sub, "--context", args->context,
                                 "KV cache context in tokens (default 0: the model's context length)", 0, 1 << 30);
  flashkv::cli::add_sampler_options(sub, args->sampling, 0.2f);
  sub->add_flag("--json", args->json, "print one JSON object per turn (reply, tokens, the rendered context)");
  flashkv::cli::add_kv_options(sub, args->kv);
  sub->callback([args] { run(*args); });
}

}  // namespace

FLASHKV_CLI_COMMAND("chat", register_chat);
