// flashkv eval passkey: real retrieval through the model per KV format (eval/passkey.hpp) — success per
// (context, depth) cell over several keys, a table, one SVG heatmap per format, the answers' first divergence from
// the fp32 cache's.
//
//   flashkv eval passkey --model smollm2-135m --kv-cache bf16 int8 int2_kivi+r128 --contexts 1k,2k,4k,8k
//       --depths 0,25,50,75,100 --keys 3 --heatmap-dir out/ --json passkey.json
//   flashkv eval passkey --model smollm2-135m --device cuda --kv-cache fp8_e4m3 int8 int4   (reference: bf16 on the GPU)
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "cli/command.hpp"
#include "cli/util_eval_cli.hpp"
#include "cli/util_model_cli.hpp"
#include "cli/util_output.hpp"
#include "cli/util_json.hpp"
#include "eval/passkey.hpp"
#include "eval/report.hpp"
#include "flashkv/engine.hpp"
#include "flashkv/error.hpp"

namespace {

struct PasskeyArgs {
  std::string model, tokenizer, contexts = "1k,2k,4k,8k", depths = "0,25,50,75,100", json, heatmap_dir;
  std::string rotate = "none", reference = "device";
  flashkv::cli::DeviceOptions device;
  std::vector<std::string> kv_cache;
  int32_t keys = 3, answer_tokens = 12, ubatch = 512, residual = 0, sinks = 0, page_size = 32;
  uint64_t seed = 1;
  bool progress = false, no_progress = false;
};

std::string safe_name(const std::string& s) {
  std::string o;
  for (char c : s) o += (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-') ? c : '_';
  return o;
}

void run(const PasskeyArgs& a) {
  using namespace flashkv;
  eval::PasskeyOptions o;
  o.contexts = cli::parse_token_counts(a.contexts, "--contexts");
  o.depths = cli::parse_percents(a.depths, "--depths");
  o.keys = a.keys;
  o.answer_tokens = a.answer_tokens;
  o.ubatch = a.ubatch;
  o.seed = a.seed;
  if (a.keys < 1) throw Error("keys", ">= 1 per cell", std::to_string(a.keys));
  if (a.answer_tokens < 1) throw Error("answer-tokens", ">= 1", std::to_string(a.answer_tokens));
  if (a.ubatch < 1) throw Error("ubatch", ">= 1 tokens", std::to_string(a.ubatch));
  if (a.rotate != "none" && a.rotate != "hadamard") throw Error("rotate", "'none' or 'hadamard'", "'" + a.rotate + "'");
  const eval::EvalTarget target = cli::eval_target(a.device, a.reference);  // Error naming 'device' / 'reference'
  cli::check_output_file(a.json, "--json", /*allow_stdout=*/true);
  cli::prepare_output_dir(a.heatmap_dir, "--heatmap-dir");
  KVCacheSpec defaults;
  defaults.residual = a.residual;
  defaults.sinks = a.sinks;
  defaults.rotate = a.rotate == "hadamard";
  defaults.page_size = a.page_size;
  (void)cli::parse_kv_list(a.kv_cache, defaults, 256);  // grammar errors before loading
  LoadedModel lm = load_named_model(a.model, a.tokenizer);
  const ModelConfig& c = lm.model.config;
  for (int32_t n : o.contexts)
    if (n > c.seq_len)
      throw Error("contexts", "at most the model's context " + std::to_string(c.seq_len), std::to_string(n));
  std::vector<KVCacheSpec> specs = cli::parse_kv_list(a.kv_cache, defaults, c.head_dim);
  std::vector<eval::SkippedFormat> skipped;  // (no default list here: every listed format must run)
  specs = cli::formats_for_target(lm.model, specs, /*explicit_list=*/true, target, skipped);
  const bool show = !a.no_progress && (a.progress || ::isatty(STDERR_FILENO));
  eval::ProgressBar bar(show, "prompt tokens");
  const eval::PasskeyResult r =
      eval::run_passkey(lm, specs, o, [&](int64_t d, int64_t t) { bar.update(d, t); }, target);
  bar.finish();
  const std::string name = a.model.substr(a.model.find_last_of('/') + 1);
  std::printf("flashkv eval passkey: %s; %zu contexts x %zu depths x %d keys = %zu trials per format; greedy answer "
              "of up to %d tokens must contain the 5-digit key\n",
              a.model.c_str(), o.contexts.size(), o.depths.size(), o.keys, r.formats.front().trials.size(),
              o.answer_tokens);
  cli::print_target(target, skipped);
  std::printf("\n");
  std::fputs(eval::passkey_table(r).c_str(), stdout);
  nlohmann::json j = eval::run_info();
  j["model"] = a.model;
  j["device"] = a.device.device;
  j["target"] = eval::target_to_json(target);
  j["passkey"] = eval::passkey_to_json(r);
  if (!a.heatmap_dir.empty()) {
    for (std::size_t i = 0; i < r.formats.size(); ++i) {
      const std::string path = a.heatmap_dir + "/passkey-" + safe_name(r.formats[i].label) + ".svg";
      std::ofstream out(path, std::ios::trunc);
      if (!out) throw IoError("flashkv: cannot write heatmap '" + path + "'");
      out << eval::passkey_heatmap_svg(r.formats[i], o, name);
      j["passkey"]["formats"][i]["heatmap"] = path;
    }
    std::printf("\nheatmaps: %s/passkey-<format>.svg\n", a.heatmap_dir.c_str());
  }
  if (!a.json.empty()) cli::print_or_write_json(j, a.json);
}

void register_eval_passkey(CLI::App& root) {
  CLI::App* g = flashkv::cli::group(root, "eval", "quality evaluation of KV cache formats");
  auto args = std::make_shared<PasskeyArgs>();
  CLI::App* p = g->add_subcommand("passkey", "passkey retrieval through the model per KV format: heatmap over context x depth");
  flashkv::cli::add_model_options(p, args->model, args->tokenizer, "smollm2-135m");
  p->add_option("--kv-cache", args->kv_cache,
                "formats besides the reference (fp32 on the CPU, bf16 on CUDA): DTYPE[+rN][+sN][+hadamard][+pN] ...")
      ->expected(1, -1);
  p->add_option("--contexts", args->contexts, "prompt + answer budget per cell, e.g. 1k,2k,4k,8k (default)");
  p->add_option("--depths", args->depths, "needle depths in percent (default 0,25,50,75,100)");
  p->add_option("--keys", args->keys, "different keys per (context, depth) cell (default 3)");
  p->add_option("--answer-tokens", args->answer_tokens, "greedy answer length (default 12)");
  p->add_option("--ubatch", args->ubatch, "prefill chunk through the cache (default 512)");
  p->add_option("--residual", args->residual, "default residual window for every format");
  p->add_option("--sinks", args->sinks, "default sink tokens for every format");
  p->add_option("--rotate", args->rotate, "default rotation: none | hadamard");
  p->add_option("--page-size", args->page_size, "tokens per cache page (default 32)");
  p->add_option("--seed", args->seed, "key seed (default 1)");
  flashkv::cli::add_eval_device_options(p, args->device, args->reference);
  p->add_option("--heatmap-dir", args->heatmap_dir, "write passkey-<format>.svg heatmaps here");
  p->add_option("--json", args->json, "write every trial as JSON to this file ('-' = stdout)");
  p->add_flag("--progress", args->progress, "always show the progress bar");
  p->add_flag("--no-progress", args->no_progress, "never show the progress bar");
  p->callback([args] { run(*args); });
}

}  // namespace

FLASHKV_CLI_COMMAND("eval passkey", register_eval_passkey);
