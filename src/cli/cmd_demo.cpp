// flashkv demo: the README's main-job command. Runs a model once per KV format at one context (default: the real
// model at 2k, the 260K model at its 128) and prints one side-by-side table — bytes/token, effective bits, prefill and
// decode tok/s, perplexity and KL(fp32 cache ‖ format) on real prose, same top-1, passkey retrieval, first greedy
// divergence — then the generated texts (eval/demo.hpp). --device cuda runs every format the GPU decodes against the
// GPU's bf16 cache (--reference cpu: the CPU's fp32 cache); default formats it cannot run are listed with the reason.
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "cli/command.hpp"
#include "cli/util_eval_cli.hpp"
#include "cli/util_json.hpp"
#include "cli/util_model_cli.hpp"
#include "cli/util_output.hpp"
#include "cli/util_parse.hpp"
#include "eval/demo.hpp"
#include "eval/report.hpp"
#include "flashkv/engine.hpp"
#include "flashkv/error.hpp"

namespace {

struct DemoArgs {
  std::string model, tokenizer, prompt, json, text = "/usr/share/common-licenses/GPL-3", ctx, reference = "device";
  flashkv::cli::DeviceOptions device;
  std::vector<std::string> kv_cache;
  int32_t steps = 0, chunks = 1;
  bool progress = false, no_progress = false;
};

void run(const DemoArgs& a) {
  using namespace flashkv;
  const auto t0 = std::chrono::steady_clock::now();
  eval::DemoOptions o;
  o.target = cli::eval_target(a.device, a.reference);  // Error naming 'device' / 'reference'
  cli::check_output_file(a.json, "--json", /*allow_stdout=*/true);
  o.prompt = a.prompt;
  o.steps = a.steps;
  o.chunks = a.chunks;
  o.text_path = a.text;
  if (!a.ctx.empty()) {
    const auto v = cli::parse_token_counts(a.ctx, "--ctx");
    if (v.size() != 1) throw Error("--ctx", "one context length", "'" + a.ctx + "'");
    o.context = v.front();
  }
  (void)cli::parse_kv_list(a.kv_cache, KVCacheSpec{}, 256);  // grammar errors before loading
  const std::string& model = a.model;
  LoadedModel lm = load_named_model(model, a.tokenizer);
  const ModelConfig& c = lm.model.config;
  o.formats = cli::parse_kv_list(a.kv_cache, KVCacheSpec{}, c.head_dim);
  if (o.context > c.seq_len) o.context = c.seq_len;
  const eval::DemoPlan plan = eval::plan_demo(lm.model, o);  // UnsupportedError (exit 2) before any work
  std::fprintf(stderr, "[demo] %s loaded; %zu KV formats at a %d-token context on %s: quality on %s, passkey, greedy "
               "text (%s)\n",
               model.c_str(), plan.specs.size() + 1, o.context, o.target.device_name().c_str(), a.text.c_str(),
               eval::load_average().c_str());
  const bool show = !a.no_progress && (a.progress || ::isatty(STDERR_FILENO));
  eval::ProgressBar bar(show, "tokens");
  const eval::DemoResult r = eval::run_demo(lm, o, [&](int64_t d, int64_t t) { bar.update(d, t); }, &plan);
  bar.finish();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("flashkv demo — %s (%s: dim %d, %d layers, %d query / %d KV heads, head_dim %d, vocab %d, context %d)\n",
              model.c_str(), checkpoint_format_name(lm.model.format), c.dim, c.n_layers, c.num_heads, c.num_heads_kv,
              c.head_dim, c.vocab_size, c.seq_len);
  std::printf("every format at a %d-token context; prefill in 512-token chunks through the cache (quantized history "
              "is what later tokens see); decode reads the packed pages (page 32, KIVI G = %d).\n",
              r.context, eval::demo_kivi_group(c.head_dim));
  std::printf("quality: %s, llama-perplexity protocol (%lld scored tokens: the second half of each %d-token chunk); "
              "reference = %s.\n",
              a.text.c_str(), static_cast<long long>(r.scored_tokens), r.context, cli::reference_text(o.target).c_str());
  cli::print_target(o.target, r.skipped);
  if (r.passkey_note.empty())
    std::printf("passkey: a 5-digit key hidden at 25%% and 75%% of a %d-token filler; success = the greedy answer "
                "contains it.\n",
                r.context);
  else
    std::printf("%s (no passkey column).\n", r.passkey_note.c_str());
  std::printf("\n");
  std::fputs(eval::demo_table(r).c_str(), stdout);
  std::printf("\nbytes/token: all layers, K and V, codes + metadata + bf16 residual/sink buffers + page slack, at %d "
              "cached tokens; mean KLD in nats/token; prefill tok/s from the quality run (all caches in lockstep); "
              "decode tok/s from the greedy run (short context, whole model: weights, not KV bytes, set it — formats "
              "compared at 2k-8k: `flashkv bench engine`); greedy div = first generated token that differs from the "
              "reference's text.\n\n",
              r.context);
  for (const auto& row : r.rows) {
    std::printf("--- %s%s\n%s%s\n\n", row.label.c_str(),
                &row == &r.rows.front()       ? " (reference)"
                : row.greedy_divergence < 0 ? (" (identical to " + r.rows.front().label + ")").c_str()
                                            : (" (diverges at step " + std::to_string(row.greedy_divergence) + ")").c_str(),
                r.prompt_text.empty() ? "" : (r.prompt_text + " → ").c_str(), row.greedy_text.c_str());
  }
  std::printf("total %.1f s\n", secs);
  if (!a.json.empty()) {
    nlohmann::json j = eval::run_info();
    j["model"] = model;
    j["text"] = a.text;
    j["seconds"] = secs;
    j["device"] = a.device.device;
    j["target"] = eval::target_to_json(o.target);
    j["demo"] = eval::demo_to_json(r);
    j["formats"] = j["demo"]["formats"];
    cli::print_or_write_json(j, a.json);
  }
}

void register_demo(CLI::App& root) {
  auto args = std::make_shared<DemoArgs>();
  CLI::App* sub = root.add_subcommand("demo", "the main job on a real model: every KV format side by side");
  flashkv::cli::add_model_options(sub, args->model, args->tokenizer, "smollm2-135m");
  sub->add_option("--text", args->text, "prose for the quality columns (default /usr/share/common-licenses/GPL-3)");
  flashkv::cli::add_nonempty_option(sub, "--ctx", args->ctx, "context of the comparison (default 2k, capped at the model's)");
  flashkv::cli::add_count_option(sub, "--chunks", args->chunks, "quality chunks of --ctx tokens (default 1)", 1, 1 << 20);
  sub->add_option("--prompt", args->prompt, "greedy prompt (default: BOS, or a fixed question for chat models)");
  flashkv::cli::add_count_option(sub, "--steps", args->steps, "greedy tokens per format (default 0: 48)", 0, 1 << 30);
  sub->add_option("--kv-cache", args->kv_cache,
                  "formats (default: fp32 bf16 fp8_e4m3 int8 int4 int4_kivi int2_kivi+r32; KIVI G = 32, 16 at head_dim 16)")
      ->expected(1, -1);
  flashkv::cli::add_eval_device_options(sub, args->device, args->reference);
  sub->add_option("--json", args->json, "also write the results as JSON to this file");
  sub->add_flag("--progress", args->progress, "always show the progress bar");
  sub->add_flag("--no-progress", args->no_progress, "never show the progress bar");
  sub->callback([args] { run(*args); });
}

}  // namespace

FLASHKV_CLI_COMMAND("demo", register_demo);
