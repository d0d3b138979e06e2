// flashkv demo: the README's main-job command. Runs the shipped model once per KV format and prints one
// side-by-side table (bytes/token, effective bits, decode tok/s, mean KL vs the fp32 cache, top-1 agreement, first
// greedy divergence), then the generated texts.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/command.hpp"
#include "cli/util_output.hpp"
#include "cli/util_parse.hpp"
#include "eval/demo.hpp"
#include "eval/report.hpp"
#include "flashkv/engine.hpp"
#include "flashkv/error.hpp"

namespace {

struct DemoArgs {
  std::string model, tokenizer, prompt, json;
  std::vector<std::string> kv_cache;
  int32_t steps = 0, samples = 7;
  uint64_t seed = 1;
  bool progress = false;
};

void run(const DemoArgs& a) {
  using namespace flashkv;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string dir = eval::default_models_dir();
  const std::string model = a.model.empty() ? dir + "/aidreams260K.bin" : a.model;
  const std::string tokenizer = a.model.empty() && a.tokenizer.empty() ? dir + "/aidreams260K.tok512.bin" : a.tokenizer;
  eval::DemoOptions o;
  o.prompt = a.prompt;
  o.steps = a.steps;
  o.samples = a.samples;
  o.seed = a.seed;
  if (!a.kv_cache.empty()) {  // given: items separated by spaces and/or commas, none empty (util_parse.hpp)
    for (const std::string& w : flashkv::cli::parse_kv_format_list(a.kv_cache, "--kv-cache")) {
      o.formats.push_back(eval::parse_format_item(w));
    }
  }
  flashkv::cli::check_output_file(a.json, "--json");  // before the minutes of work, not after
  LoadedModel lm = load_model_with_tokenizer(model, tokenizer);
  const ModelConfig& c = lm.model.config;
  eval::ProgressBar bar(a.progress || ::isatty(STDERR_FILENO), "tokens");
  eval::DemoResult r = eval::run_demo(lm, o, [&](int64_t d, int64_t t) { bar.update(d, t); });
  bar.finish();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("flashkv demo — %s (%s: dim %d, %d layers, %d query / %d KV heads, head_dim %d, vocab %d, context %d)\n",
              model.c_str(), checkpoint_format_name(lm.model.format), c.dim, c.n_layers, c.num_heads, c.num_heads_kv,
              c.head_dim, c.vocab_size, c.seq_len);
  std::printf("prefill: exact tiled causal attention; decode: quantized paged KV cache (page 32, KIVI G = %d).\n",
              eval::demo_kivi_group(c.head_dim));
  std::printf("prompt: %s (%zu tokens incl. BOS); greedy decoding; quality teacher-forced on %d sequences "
              "(the fp32 greedy text + %d sampled, seed %llu), %lld predicted positions per format\n\n",
              a.prompt.empty() ? "(none: from BOS)" : ("\"" + a.prompt + "\"").c_str(), r.prompt_tokens.size(),
              r.sequences, a.samples, static_cast<unsigned long long>(a.seed), static_cast<long long>(r.positions));
  std::fputs(eval::format_table(r.rows, true).c_str(), stdout);
  std::printf("\nbytes/token: all layers, K and V, codes + metadata + bf16 residual/sink buffers + page slack, at %d "
              "cached tokens; mean KL(fp32 cache || format) in nats/token; greedy div = first generated token that "
              "differs from the fp32 cache's text. decode tok/s: best of 3 runs of the whole model per token; at "
              "head_dim %d and %d tokens per-token overhead, not the KV bytes read, sets it (formats compared at "
              "head_dim 128, 4k-32k tokens: bench/results/cpu-decode-*-v2.md).\n\n",
              c.seq_len, c.head_dim, c.seq_len);
  for (const auto& row : r.rows) {
    std::printf("--- %s%s\n%s%s\n\n", row.label.c_str(),
                row.greedy_divergence < 0 ? " (identical to fp32)" : (" (diverges at step " + std::to_string(row.greedy_divergence) + ")").c_str(),
                a.prompt.c_str(), row.greedy_text.c_str());
  }
  std::printf("total %.1f s\n", secs);
  if (!a.json.empty()) {
    nlohmann::json j = {{"model", model}, {"prompt", a.prompt}, {"prompt_tokens", r.prompt_tokens},
                        {"sequences", r.sequences}, {"positions", r.positions}, {"seconds", secs},
                        {"formats", eval::rows_to_json(r.rows)}};
    std::ofstream f(a.json, std::ios::trunc);
    if (!f) throw IoError("flashkv: cannot write '" + a.json + "'");
    f << j.dump(2) << "\n";
  }
}

void register_demo(CLI::App& root) {
  auto args = std::make_shared<DemoArgs>();
  CLI::App* sub = root.add_subcommand("demo", "the main job on the shipped model: every KV format side by side");
  sub->add_option("--model", args->model, "checkpoint (default: the shipped model in $FLASHKV_MODELS_DIR or ../shared/models)");
  sub->add_option("--tokenizer", args->tokenizer, "llama2.c tokenizer file");
  sub->add_option("--prompt", args->prompt, "prompt text (default: none, generate from BOS)");
  flashkv::cli::add_count_option(sub, "--steps", args->steps,
                                 "tokens to generate per format (default 0: up to the context end)", 0, 1 << 30);
  flashkv::cli::add_count_option(sub, "--samples", args->samples,
                                 "extra sampled sequences for the teacher-forced metrics (default 7)", 0, 1 << 20);
  sub->add_option("--seed", args->seed, "sampling seed (default 1)");
  sub->add_option("--kv-cache", args->kv_cache, "formats (default: fp32 bf16 fp8_e4m3 int8 int4 int4_kivi int2_kivi+r32; KIVI G = min(32, head_dim))")
      ->expected(1, -1);
  sub->add_option("--json", args->json, "also write the results as JSON to this file");
  sub->add_flag("--progress", args->progress, "always show the progress bar");
  sub->callback([args] { run(*args); });
}

}  // namespace

FLASHKV_CLI_COMMAND("demo", register_demo);
