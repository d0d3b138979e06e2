// flashkv eval --model ... --kv-cache LIST: teacher-forced A/B evaluation of KV cache formats against the float32
// cache (mean KL, top-1 agreement, perplexity ratio, first greedy divergence, KV bytes): table on stdout, --json,
// --plot (SVG of KL vs effective bits), progress bar with ETA on stderr. Shares the `eval` group with `eval kv`.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/command.hpp"
#include "cli/util_output.hpp"
#include "cli/util_parse.hpp"
#include "eval/demo.hpp"
#include "eval/evaluation.hpp"
#include "eval/report.hpp"
#include "flashkv/engine.hpp"
#include "flashkv/error.hpp"
#include "flashkv/kvcache.hpp"

namespace {

struct EvalArgs {
  std::string model, tokenizer, text_file, tokens_file, json, plot, rotate = "none";
  std::vector<std::string> kv_cache;
  int32_t samples = 8, length = 0, batch = 0, residual = 0, sinks = 0, page_size = 32;
  uint64_t seed = 1;
  bool progress = false, no_progress = false;
};

void run(CLI::App* group, const EvalArgs& a) {
  using namespace flashkv;
  // `flashkv eval kv ...` is the kvcache layer's attention-level tool: nothing to do here when it was given.
  for (CLI::App* sub : group->get_subcommands([](CLI::App*) { return true; }))
    if (sub->get_name() == "kv" && sub->parsed()) return;
  if (a.model.empty()) throw Error("model", "--model PATH (checkpoint to evaluate), or the subcommand `eval kv`", "nothing");
  if (!a.text_file.empty() && !a.tokens_file.empty()) throw Error("text/tokens", "at most one of --text and --tokens", "both");
  for (const auto& [path, option] : {std::pair{a.text_file, "--text"}, std::pair{a.tokens_file, "--tokens"}}) {
    if (!path.empty() && !std::filesystem::is_regular_file(path)) {
      throw Error(option, "a readable file", "'" + path + "' (" +
                  (std::filesystem::exists(path) ? "not a regular file" : "no such file") + ")", Status::io);
    }
  }
  KVCacheSpec defaults;
  defaults.residual = a.residual;
  defaults.sinks = a.sinks;
  if (a.rotate != "none" && a.rotate != "hadamard") throw Error("rotate", "'none' or 'hadamard'", "'" + a.rotate + "'");
  defaults.rotate = a.rotate == "hadamard";
  defaults.page_size = a.page_size;
  std::vector<KVCacheSpec> specs;
  if (!a.kv_cache.empty()) {  // given: items separated by spaces and/or commas, none empty (util_parse.hpp)
    for (const std::string& w : flashkv::cli::parse_kv_format_list(a.kv_cache, "--kv-cache")) {
      specs.push_back(eval::parse_format_item(w, defaults));
    }
  }
  // every output path is checked before the model is loaded and the evaluation runs
  flashkv::cli::check_output_file(a.json, "--json", /*allow_stdout=*/true);
  flashkv::cli::check_output_file(a.plot, "--plot");
  LoadedModel lm = load_model_with_tokenizer(a.model, a.tokenizer);
  const ModelConfig& c = lm.model.config;
  if (specs.empty()) specs = eval::demo_formats(c.head_dim);
  std::vector<std::vector<int32_t>> seqs;
  std::string source;
  if (!a.text_file.empty()) {
    std::ifstream f(a.text_file, std::ios::binary);
    if (!f) throw IoError("flashkv: cannot open text file '" + a.text_file + "'");
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    seqs = eval::sequences_from_text(*lm.tokenizer, text, c.seq_len);
    source = "text " + a.text_file;
  } else if (!a.tokens_file.empty()) {
    seqs = eval::sequences_from_token_file(a.tokens_file, c.vocab_size, c.seq_len);
    source = "tokens " + a.tokens_file;
  } else {
    const int32_t len = a.length == 0 ? c.seq_len : a.length;
    seqs = eval::sample_sequences(lm.model, a.samples, len, a.seed);
    source = std::to_string(a.samples) + " sequences of " + std::to_string(len) +
             " tokens sampled from the fp32 model (temperature 1, seed " + std::to_string(a.seed) + ")";
  }
  const bool show = !a.no_progress && (a.progress || ::isatty(STDERR_FILENO));
  eval::ProgressBar bar(show, "tokens");
  auto rows = eval::evaluate(lm.model, specs, seqs, a.batch,
                             [&](int64_t d, int64_t t) { bar.update(d, t); });
  bar.finish();
  std::printf("flashkv eval: %s (%s; dim %d, %d layers, %d/%d heads, head_dim %d, context %d)\n", a.model.c_str(),
              checkpoint_format_name(lm.model.format), c.dim, c.n_layers, c.num_heads, c.num_heads_kv, c.head_dim,
              c.seq_len);
  std::printf("data: %s; teacher forcing, every position decoded through the cache; reference = fp32 cache\n\n",
              source.c_str());
  std::fputs(eval::format_table(rows, false).c_str(), stdout);
  std::printf("\nKL = mean KL(fp32 cache || format) per token (nats); top-1 = argmax agreement; ppl ratio = "
              "exp(-mean Δlog-likelihood of the next token); first div (TF) = mean position of the first top-1 "
              "disagreement (sequences that diverged / all); bytes/token over all layers, K and V, everything counted.\n");
  if (!a.json.empty()) {
    nlohmann::json j = {{"model", a.model}, {"data", source}, {"sequences", seqs.size()},
                        {"formats", eval::rows_to_json(rows)}};
    if (a.json == "-") {
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      std::ofstream f(a.json, std::ios::trunc);
      if (!f) throw IoError("flashkv: cannot write '" + a.json + "'");
      f << j.dump(2) << "\n";
    }
  }
  if (!a.plot.empty()) {
    eval::write_kl_plot_svg(rows, "KV cache formats: KL vs effective bits (" + a.model.substr(a.model.find_last_of('/') + 1) + ")",
                            a.plot);
    std::printf("plot: %s\n", a.plot.c_str());
  }
}

void register_eval(CLI::App& root) {
  auto args = std::make_shared<EvalArgs>();
  CLI::App* g = flashkv::cli::group(root, "eval", "quality evaluation of KV cache formats");
  g->add_option("--model", args->model, "checkpoint (llama2.c or GGUF): teacher-forced A/B of KV formats vs fp32");
  g->add_option("--tokenizer", args->tokenizer, "llama2.c tokenizer file (default: embedded in a GGUF)");
  g->add_option("--kv-cache", args->kv_cache,
                "formats to compare: DTYPE[+rN][+sN][+hadamard][+pN] ... (e.g. int8 int4 int2_kivi+r32 k:int8,v:int4; default: the demo's list)")
      ->expected(1, -1);
  using flashkv::cli::add_count_option;
  add_count_option(g, "--samples", args->samples, "sequences sampled from the fp32 model (default 8)", 1, 1 << 20);
  add_count_option(g, "--length", args->length, "tokens per sampled sequence (default 0: the model's context)", 0,
                   1 << 30);
  g->add_option("--seed", args->seed, "sampling seed (default 1)");
  g->add_option("--text", args->text_file, "evaluate on this UTF-8 text instead (chunks of the context length)");
  g->add_option("--tokens", args->tokens_file, "evaluate on token ids: one sequence per line");
  add_count_option(g, "--batch", args->batch, "sequences decoded together (default 0: all)", 0, 1 << 20);
  add_count_option(g, "--residual", args->residual, "default residual window for every format", 0, 1 << 30);
  add_count_option(g, "--sinks", args->sinks, "default sink tokens for every format", 0, 1 << 30);
  g->add_option("--rotate", args->rotate, "default rotation: none | hadamard");
  add_count_option(g, "--page-size", args->page_size, "tokens per cache page (default 32)", 1, 1 << 20);
  g->add_option("--json", args->json, "write the results as JSON to this file ('-' = stdout)");
  g->add_option("--plot", args->plot, "write an SVG plot of mean KL vs effective bits to this file");
  g->add_flag("--progress", args->progress, "always show the progress bar (default: only on a terminal)");
  g->add_flag("--no-progress", args->no_progress, "never show the progress bar");
  g->callback([g, args] { run(g, *args); });
}

}  // namespace

FLASHKV_CLI_COMMAND("eval", register_eval);
