// flashkv eval --model ... --kv-cache LIST: A/B evaluation of KV cache formats against the float32 cache.
//   --text FILE [--ctx 512,2k,8k]  perplexity, KL, top-1, RMS Δp with llama-perplexity's protocol (eval/perplexity.hpp)
//   --samples N / --tokens FILE    teacher-forced token-by-token decode replay (mean KL, top-1, ppl ratio, first
//                                  divergence; eval/evaluation.hpp)
// Table on stdout, --json (with the command, date, machine and load), --plot (SVG of KL vs effective bits), progress
// bar with ETA on stderr. --device cpu|cuda|cuda:N runs the formats on that device; --reference device|cpu picks the
// reference (eval::EvalTarget). Shares the `eval` group with `eval kv` and `eval passkey`.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/command.hpp"
#include "cli/util_eval_cli.hpp"
#include "cli/util_json.hpp"
#include "cli/util_model_cli.hpp"
#include "cli/util_output.hpp"
#include "cli/util_parse.hpp"
#include "eval/demo.hpp"
#include "eval/evaluation.hpp"
#include "eval/perplexity.hpp"
#include "eval/prompt.hpp"
#include "eval/report.hpp"
#include "flashkv/engine.hpp"
#include "flashkv/error.hpp"
#include "flashkv/kvcache.hpp"

namespace {

struct EvalArgs {
  std::string model, tokenizer, text_file, tokens_file, json, plot, rotate = "none", ctx, reference = "device";
  flashkv::cli::DeviceOptions device;
  std::vector<std::string> kv_cache;
  int32_t samples = 8, length = 0, batch = 0, residual = 0, sinks = 0, page_size = 32, chunks = 0, ubatch = 512;
  uint64_t seed = 1;
  bool progress = false, no_progress = false;
};

/// Text mode: llama-perplexity's protocol per context (eval/perplexity.hpp).
void run_text(const EvalArgs& a, const flashkv::LoadedModel& lm, const std::vector<flashkv::KVCacheSpec>& specs,
              const flashkv::eval::EvalTarget& target, const std::vector<flashkv::eval::SkippedFormat>& skipped,
              bool show) {
  using namespace flashkv;
  const ModelConfig& c = lm.model.config;
  std::ifstream f(a.text_file, std::ios::binary);
  if (!f) throw IoError("flashkv: cannot open text file '" + a.text_file + "'");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const std::vector<int32_t> contexts =
      a.ctx.empty() ? std::vector<int32_t>{std::min(512, c.seq_len)} : cli::parse_token_counts(a.ctx, "--ctx");
  for (int32_t n : contexts)
    if (n < 4 || n > c.seq_len)
      throw Error("--ctx", "4.." + std::to_string(c.seq_len) + " tokens (the model's context)", std::to_string(n));
  const std::vector<int32_t> tokens = eval::text_tokens(*lm.tokenizer, text);
  nlohmann::json j = eval::run_info();
  j["model"] = a.model;
  j["text"] = {{"path", a.text_file}, {"bytes", text.size()}, {"tokens", tokens.size()}};
  j["protocol"] = "llama-perplexity: chunks of n_ctx from an empty cache, fed in ubatches through the cache under "
                  "test (Engine::extend), last n_ctx/2-1 tokens of each chunk scored; reference = " +
                  cli::reference_text(target);
  j["target"] = eval::target_to_json(target);
  j["device"] = a.device.device;
  j["skipped"] = eval::skipped_to_json(skipped);
  j["results"] = nlohmann::json::array();
  std::printf("flashkv eval: %s (%s; dim %d, %d layers, %d/%d heads, head_dim %d, context %d)\n", a.model.c_str(),
              checkpoint_format_name(lm.model.format), c.dim, c.n_layers, c.num_heads, c.num_heads_kv, c.head_dim,
              c.seq_len);
  std::printf("text: %s (%zu bytes, %zu tokens); llama-perplexity protocol, ubatch %d; reference = %s\n",
              a.text_file.c_str(), text.size(), tokens.size(), a.ubatch, cli::reference_text(target).c_str());
  cli::print_target(target, skipped);
  std::vector<eval::FormatRow> plot_rows;
  for (int32_t n_ctx : contexts) {
    eval::PerplexityOptions o;
    o.n_ctx = n_ctx;
    o.ubatch = a.ubatch;
    o.max_chunks = a.chunks;
    o.bos_id = eval::tokenizer_adds_bos(*lm.tokenizer) ? lm.tokenizer->bos_id() : -1;
    eval::ProgressBar bar(show, "tokens (n_ctx " + std::to_string(n_ctx) + ")");
    const eval::TextResult r =
        eval::evaluate_text(lm.model, specs, tokens, o, [&](int64_t d, int64_t t) { bar.update(d, t); }, target);
    bar.finish();
    std::printf("\nn_ctx %d: %d chunk(s), %lld scored tokens (last n_ctx/2-1 of each chunk)\n\n", n_ctx, r.chunks,
                static_cast<long long>(r.reference.scored));
    std::fputs(eval::text_table(r).c_str(), stdout);
    j["results"].push_back(eval::text_to_json(r));
    if (plot_rows.empty())
      for (const auto& row : r.rows) {
        eval::FormatRow p;
        p.label = row.label;
        p.effective_bits = row.effective_bits;
        p.metrics.mean_kl = row.stats.kld_mean;
        plot_rows.push_back(p);
      }
  }
  std::printf("\nPPL = exp(mean -log q(next)); KLD = KL(%s || format) per scored token (nats); RMS Δp = "
              "RMS of q(next) - p(next); ± as llama-perplexity prints them; bits/bytes per token over all layers, K "
              "and V, everything counted, at n_ctx cached tokens.\n",
              cli::reference_text(target).c_str());
  if (!a.json.empty()) cli::print_or_write_json(j, a.json);
  if (!a.plot.empty()) {
    eval::write_kl_plot_svg(plot_rows, "KV cache formats: KL vs effective bits (" +
                                           a.model.substr(a.model.find_last_of('/') + 1) + ", n_ctx " +
                                           std::to_string(contexts.front()) + ")",
                            a.plot, cli::reference_text(target));
    std::printf("plot: %s\n", a.plot.c_str());
  }
}

void run(CLI::App* group, const EvalArgs& a) {
  using namespace flashkv;
  // `flashkv eval kv|passkey ...` are subcommands: nothing to do here when one was given.
  for (CLI::App* sub : group->get_subcommands([](CLI::App*) { return true; }))
    if (sub->parsed()) return;
  if (a.model.empty())
    throw Error("model", "--model NAME|PATH (e.g. smollm2-135m), or a subcommand (`eval kv`, `eval passkey`)", "nothing");
  if (!a.text_file.empty() && !a.tokens_file.empty()) throw Error("text/tokens", "at most one of --text and --tokens", "both");
  if (!a.ctx.empty() && a.text_file.empty()) throw Error("--ctx", "--text FILE (--ctx sets its chunk length)", "no --text");
  for (const auto& [path, option] : {std::pair{a.text_file, "--text"}, std::pair{a.tokens_file, "--tokens"}}) {
    if (!path.empty() && !std::filesystem::is_regular_file(path)) {
      throw Error(option, "a readable file", "'" + path + "' (" +
                  (std::filesystem::exists(path) ? "not a regular file" : "no such file") + ")", Status::io);
    }
  }
  const eval::EvalTarget target = cli::eval_target(a.device, a.reference);  // Error naming 'device' / 'reference'
  // every output path is checked before the model is loaded and the evaluation runs
  flashkv::cli::check_output_file(a.json, "--json", /*allow_stdout=*/true);
  flashkv::cli::check_output_file(a.plot, "--plot");
  KVCacheSpec defaults;
  defaults.residual = a.residual;
  defaults.sinks = a.sinks;
  if (a.rotate != "none" && a.rotate != "hadamard") throw Error("rotate", "'none' or 'hadamard'", "'" + a.rotate + "'");
  defaults.rotate = a.rotate == "hadamard";
  defaults.page_size = a.page_size;
  (void)cli::parse_kv_list(a.kv_cache, defaults, 256);  // grammar errors before loading
  LoadedModel lm = load_named_model(a.model, a.tokenizer);
  const ModelConfig& c = lm.model.config;
  std::vector<KVCacheSpec> specs = cli::parse_kv_list(a.kv_cache, defaults, c.head_dim);
  const bool explicit_list = !specs.empty();
  if (specs.empty()) specs = eval::demo_formats(c.head_dim);
  // Before any work: an explicit list the device cannot run whole is an UnsupportedError (exit 2, one line); the
  // default list keeps what the device runs and names the rest.
  std::vector<eval::SkippedFormat> skipped;
  specs = cli::formats_for_target(lm.model, specs, explicit_list, target, skipped);
  const bool show = !a.no_progress && (a.progress || ::isatty(STDERR_FILENO));
  if (!a.text_file.empty()) return run_text(a, lm, specs, target, skipped, show);
  std::vector<std::vector<int32_t>> seqs;
  std::string source;
  if (!a.tokens_file.empty()) {
    seqs = eval::sequences_from_token_file(a.tokens_file, c.vocab_size, c.seq_len);
    source = "tokens " + a.tokens_file;
  } else {
    const int32_t len = a.length == 0 ? c.seq_len : a.length;
    seqs = eval::sample_sequences(lm.model, a.samples, len, a.seed, 1.0f, target);
    source = std::to_string(a.samples) + " sequences of " + std::to_string(len) + " tokens sampled from the " +
             (target.engine.device == Device::cpu ? std::string("fp32 model")
                                                  : "model with the reference (" + target.reference_name() + ")") +
             " (temperature 1, seed " + std::to_string(a.seed) + ")";
  }
  eval::ProgressBar bar(show, "tokens");
  auto rows = eval::evaluate(lm.model, specs, seqs, a.batch, [&](int64_t d, int64_t t) { bar.update(d, t); }, target);
  bar.finish();
  std::printf("flashkv eval: %s (%s; dim %d, %d layers, %d/%d heads, head_dim %d, context %d)\n", a.model.c_str(),
              checkpoint_format_name(lm.model.format), c.dim, c.n_layers, c.num_heads, c.num_heads_kv, c.head_dim,
              c.seq_len);
  std::printf("data: %s; teacher forcing, every position decoded through the cache; reference = %s\n",
              source.c_str(), cli::reference_text(target).c_str());
  cli::print_target(target, skipped);
  std::printf("\n");
  std::fputs(eval::format_table(rows, false).c_str(), stdout);
  std::printf("\nKL = mean KL(%s || format) per token (nats); top-1 = argmax agreement; ppl ratio = "
              "exp(-mean Δlog-likelihood of the next token); first div (TF) = mean position of the first top-1 "
              "disagreement (sequences that diverged / all); bytes/token over all layers, K and V, everything counted.\n",
              cli::reference_text(target).c_str());
  if (!a.json.empty()) {
    nlohmann::json j = eval::run_info();
    j["model"] = a.model;
    j["data"] = source;
    j["sequences"] = seqs.size();
    j["device"] = a.device.device;
    j["target"] = eval::target_to_json(target);
    j["skipped"] = eval::skipped_to_json(skipped);
    j["formats"] = eval::rows_to_json(rows);
    cli::print_or_write_json(j, a.json);
  }
  if (!a.plot.empty()) {
    eval::write_kl_plot_svg(rows, "KV cache formats: KL vs effective bits (" + a.model.substr(a.model.find_last_of('/') + 1) + ")",
                            a.plot, cli::reference_text(target));
    std::printf("plot: %s\n", a.plot.c_str());
  }
}

void register_eval(CLI::App& root) {
  auto args = std::make_shared<EvalArgs>();
  CLI::App* g = flashkv::cli::group(root, "eval", "quality evaluation of KV cache formats");
  flashkv::cli::add_model_options(g, args->model, args->tokenizer, "");
  g->add_option("--kv-cache", args->kv_cache,
                "formats to compare: DTYPE[+rN][+sN][+hadamard][+pN] ... (e.g. int8 int4 int2_kivi+r32 k:int8,v:int4; "
                "KIVI without _gN takes the largest group that fits head_dim; default: the demo's list)")
      ->expected(1, -1);
  using flashkv::cli::add_count_option;
  g->add_option("--text", args->text_file,
                "perplexity + KL on this UTF-8 text with llama-perplexity's protocol (chunks of --ctx, prefilled "
                "through the cache, second half of each chunk scored)");
  flashkv::cli::add_nonempty_option(g, "--ctx", args->ctx,
                                    "--text chunk lengths, e.g. 512,2k,8k (default: 512 or the model's context)");
  add_count_option(g, "--chunks", args->chunks, "--text: at most this many chunks per context (default 0 = all)", 0,
                   1 << 20);
  add_count_option(g, "--ubatch", args->ubatch,
                   "--text: tokens per prefill call through the cache (default 512, as llama.cpp)", 1, 1 << 20);
  add_count_option(g, "--samples", args->samples, "sequences sampled from the fp32 model (default 8)", 1, 1 << 20);
  add_count_option(g, "--length", args->length, "tokens per sampled sequence (default 0: the model's context)", 0,
                   1 << 30);
  g->add_option("--seed", args->seed, "sampling seed (default 1)");
  g->add_option("--tokens", args->tokens_file, "evaluate on token ids: one sequence per line (decoded token by token)");
  add_count_option(g, "--batch", args->batch, "sequences decoded together (default 0: all)", 0, 1 << 20);
  add_count_option(g, "--residual", args->residual, "default residual window for every format", 0, 1 << 30);
  add_count_option(g, "--sinks", args->sinks, "default sink tokens for every format", 0, 1 << 30);
  g->add_option("--rotate", args->rotate, "default rotation: none | hadamard");
  add_count_option(g, "--page-size", args->page_size, "tokens per cache page (default 32)", 1, 1 << 20);
  flashkv::cli::add_eval_device_options(g, args->device, args->reference);
  g->add_option("--json", args->json, "write the results as JSON to this file ('-' = stdout)");
  g->add_option("--plot", args->plot, "write an SVG plot of mean KL vs effective bits to this file");
  g->add_flag("--progress", args->progress, "always show the progress bar (default: only on a terminal)");
  g->add_flag("--no-progress", args->no_progress, "never show the progress bar");
  g->callback([g, args] { run(g, *args); });
}

}  // namespace

FLASHKV_CLI_COMMAND("eval", register_eval);
