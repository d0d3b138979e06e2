// flashkv bench engine: prefill (pp) and decode (tg) tokens/s of the whole model per KV format at a context, measured
// as llama.cpp's llama-bench measures `-p/-n/-d` (eval/speed.hpp), so the two compare on the same machine.
//
//   flashkv bench engine --model smollm2-135m --kv-cache fp32 bf16 int8 int4 --contexts 2k,8k --repeats 3 --json s.json
#include <omp.h>

#include <cstdio>

#include "cli/command.hpp"
#include "cli/util_eval_cli.hpp"
#include "cli/util_model_cli.hpp"
#include "cli/util_output.hpp"
#include "cli/util_json.hpp"
#include "eval/report.hpp"
#include "eval/speed.hpp"
#include "flashkv/engine.hpp"
#include "flashkv/error.hpp"

namespace {

struct BenchEngineArgs {
  std::string model, tokenizer, contexts = "2k,8k", json;
  std::vector<std::string> kv_cache;
  flashkv::cli::DeviceOptions device;
  int32_t n_prompt = 512, n_gen = 128, repeats = 3, ubatch = 512, threads = 0, page_size = 32;
};

void run(const BenchEngineArgs& a) {
  using namespace flashkv;
  if (a.threads < 0) throw Error("threads", ">= 0 (0 = OpenMP default)", std::to_string(a.threads));
  eval::SpeedOptions o;
  o.contexts = cli::parse_token_counts(a.contexts, "--contexts");
  o.n_prompt = a.n_prompt;
  o.n_gen = a.n_gen;
  o.repeats = a.repeats;
  o.ubatch = a.ubatch;
  o.engine = a.device.engine();
  cli::check_output_file(a.json, "--json", /*allow_stdout=*/true);
  KVCacheSpec defaults;
  defaults.page_size = a.page_size;
  (void)cli::parse_kv_list(a.kv_cache, defaults, 256);  // grammar errors before loading
  if (a.threads > 0) omp_set_num_threads(a.threads);
  LoadedModel lm = load_named_model(a.model, a.tokenizer);
  std::vector<KVCacheSpec> specs = cli::parse_kv_list(a.kv_cache, defaults, lm.model.config.head_dim);
  if (specs.empty())  // the CUDA engine decodes the 16-bit and token-granular quantized formats
    specs = cli::parse_kv_list({a.device.cuda() ? "bf16 fp16 fp8_e4m3 int8 int4"
                                                : "fp32 bf16 fp8_e4m3 int8 int4 int4_kivi int2_kivi+r128"},
                               defaults, lm.model.config.head_dim);
  nlohmann::json j = eval::run_info();
  std::fprintf(stderr, "[bench engine] %s on %s, %d threads, %s\n", a.model.c_str(), a.device.device.c_str(),
               omp_get_max_threads(), eval::load_average().c_str());
  const auto rows = eval::run_speed(lm.model, specs, o, [](const eval::SpeedRow& r) {
    std::fprintf(stderr, "[bench engine] %-22s ctx %5d: pp %7.1f tok/s, tg %6.1f tok/s  (%s)\n", r.label.c_str(),
                 r.context, r.pp_mean, r.tg_mean, eval::load_average().c_str());
  });
  std::printf("flashkv bench engine: %s on %s; %d threads; per context C: depth D = C - %d - %d prefilled, then tg = %d "
              "decode steps (D..D+%d), pp = %d tokens prefilled through the cache (..C); %d repetition(s)\n\n",
              a.model.c_str(), a.device.device.c_str(), omp_get_max_threads(), o.n_gen, o.n_prompt, o.n_gen, o.n_gen, o.n_prompt, o.repeats);
  std::fputs(eval::speed_table(rows).c_str(), stdout);
  j["model"] = a.model;
  j["config"] = {{"device", a.device.device}, {"n_prompt", o.n_prompt}, {"n_gen", o.n_gen}, {"repeats", o.repeats}, {"ubatch", o.ubatch},
                 {"threads", omp_get_max_threads()}};
  j["results"] = eval::speed_to_json(rows);
  j["machine"]["load_average_at_end"] = eval::load_average();
  if (!a.json.empty()) cli::print_or_write_json(j, a.json);
}

void register_bench_engine(CLI::App& root) {
  CLI::App* bench = flashkv::cli::group(root, "bench", "benchmarks");
  auto args = std::make_shared<BenchEngineArgs>();
  CLI::App* cmd = bench->add_subcommand("engine", "whole-model prefill / decode tok/s per KV format (llama-bench's protocol)");
  flashkv::cli::add_model_options(cmd, args->model, args->tokenizer, "smollm2-135m");
  cmd->add_option("--kv-cache", args->kv_cache, "formats (default: fp32 bf16 fp8_e4m3 int8 int4 int4_kivi int2_kivi+r128)")
      ->expected(1, -1);
  cmd->add_option("--contexts", args->contexts, "contexts C at which both end, e.g. 2k,8k (default)");
  cmd->add_option("--n-prompt", args->n_prompt, "prefill tokens timed (default 512, llama-bench -p)");
  cmd->add_option("--n-gen", args->n_gen, "decode steps timed (default 128, llama-bench -n)");
  cmd->add_option("--repeats", args->repeats, "repetitions, each a fresh sequence (default 3)");
  cmd->add_option("--ubatch", args->ubatch, "tokens per prefill call (default 512)");
  cmd->add_option("--page-size", args->page_size, "tokens per cache page (default 32)");
  cmd->add_option("--threads", args->threads, "OpenMP threads (default 0 = OpenMP default)");
  flashkv::cli::add_device_option(cmd, args->device);
  cmd->add_option("--json", args->json, "write results (with command, date, machine, load) as JSON ('-' = stdout)");
  cmd->callback([args] { run(*args); });
}

}  // namespace

FLASHKV_CLI_COMMAND("bench engine", register_bench_engine);
