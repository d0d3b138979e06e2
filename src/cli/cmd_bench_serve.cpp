// flashkv bench serve: continuous-batching replay of N seeded requests per KV format (eval/serve.hpp): decode and
// overall tokens/s, inter-token latency and time-to-first-token percentiles, preemptions.
//
//   flashkv bench serve --model smollm2-135m --device cuda --kv-cache bf16 int8 int4 --requests 64 --max-batch 16
#include <cstdio>

#include "cli/command.hpp"
#include "cli/util_eval_cli.hpp"
#include "cli/util_json.hpp"
#include "cli/util_model_cli.hpp"
#include "cli/util_output.hpp"
#include "eval/report.hpp"
#include "eval/serve.hpp"
#include "flashkv/engine.hpp"
#include "flashkv/error.hpp"

namespace {

struct BenchServeArgs {
  std::string model, tokenizer, json, prompt_len = "32:256", output_len = "16:128";
  std::vector<std::string> kv_cache;
  flashkv::cli::DeviceOptions device;
  int32_t requests = 64, max_batch = 16, page_size = 32;
  int64_t kv_pages = 0;
  uint64_t seed = 1;
};

/// "A:B" (or "A" = A:A) → [A, B]; Error naming the option otherwise.
void parse_range(const std::string& s, const char* option, int32_t& lo, int32_t& hi) {
  const std::size_t colon = s.find(':');
  try {
    std::size_t used = 0;
    lo = std::stoi(s.substr(0, colon), &used);
    if (used != (colon == std::string::npos ? s.size() : colon)) throw std::invalid_argument(s);
    hi = lo;
    if (colon != std::string::npos) {
      hi = std::stoi(s.substr(colon + 1), &used);
      if (used != s.size() - colon - 1) throw std::invalid_argument(s);
    }
  } catch (const std::logic_error&) {
    throw flashkv::Error(option, "MIN:MAX token counts (or one count)", "'" + s + "'");
  }
  if (lo < 1 || hi < lo) throw flashkv::Error(option, "1 <= MIN <= MAX", "'" + s + "'");
}

void run(const BenchServeArgs& a) {
  using namespace flashkv;
  eval::ServeOptions o;
  o.requests = a.requests;
  o.max_batch = a.max_batch;
  o.kv_capacity_pages = a.kv_pages;
  o.seed = a.seed;
  o.engine = a.device.engine();
  parse_range(a.prompt_len, "prompt-len", o.prompt_min, o.prompt_max);
  parse_range(a.output_len, "output-len", o.output_min, o.output_max);
  if (a.requests < 1) throw Error("requests", ">= 1", std::to_string(a.requests));
  if (a.max_batch < 1) throw Error("max-batch", ">= 1", std::to_string(a.max_batch));
  if (a.kv_pages < 0) throw Error("kv-pages", ">= 0 (0 = enough for max-batch sequences)", std::to_string(a.kv_pages));
  cli::check_output_file(a.json, "--json", /*allow_stdout=*/true);
  KVCacheSpec defaults;
  defaults.page_size = a.page_size;
  (void)cli::parse_kv_list(a.kv_cache, defaults, 256);  // grammar errors before loading
  LoadedModel lm = load_named_model(a.model, a.tokenizer);
  if (static_cast<int64_t>(o.prompt_max) + o.output_max > lm.model.config.seq_len)
    throw Error("output-len", "prompt-len MAX + output-len MAX <= the model's context " +
                                  std::to_string(lm.model.config.seq_len),
                std::to_string(static_cast<int64_t>(o.prompt_max) + o.output_max));
  std::vector<KVCacheSpec> specs = cli::parse_kv_list(a.kv_cache, defaults, lm.model.config.head_dim);
  if (specs.empty()) specs = cli::parse_kv_list({a.device.cuda() ? "bf16 int8 int4" : "fp32 bf16 int8 int4"}, defaults,
                                                lm.model.config.head_dim);
  const auto rows = eval::run_serve(lm.model, specs, o, [&a](const eval::ServeResult& r) {
    std::fprintf(stderr, "[bench serve] %-12s decode %.1f tok/s, ITL p50 %.2f ms p99 %.2f ms, %d preempted%s%s\n",
                 r.label.c_str(), r.decode_tokens_per_s, r.itl_ms_p50, r.itl_ms_p99, r.preemptions,
                 a.device.cuda() ? "; " : "",
                 a.device.cuda() ? cli::cuda_graph_summary(a.device, r.graphs).c_str() : "");
  });
  std::printf("flashkv bench serve: %s on %s; %d requests arriving at t = 0, prompt %s / output %s tokens (uniform, "
              "seed %llu), at most %d sequences per decode step, greedy\n\n",
              a.model.c_str(), a.device.device.c_str(), a.requests, a.prompt_len.c_str(), a.output_len.c_str(),
              static_cast<unsigned long long>(a.seed), a.max_batch);
  std::fputs(eval::serve_table(rows).c_str(), stdout);
  if (a.json.empty()) return;
  nlohmann::json j = eval::run_info();
  j["model"] = a.model;
  j["config"] = {{"device", a.device.device}, {"cuda_graphs", a.device.cuda_graphs}, {"requests", a.requests}, {"prompt_len", a.prompt_len},
                 {"output_len", a.output_len}, {"max_batch", a.max_batch}, {"kv_pages", a.kv_pages}, {"seed", a.seed}};
  for (const eval::ServeResult& r : rows) {
    j["results"].push_back({{"kv_cache", r.label}, {"requests", r.requests}, {"prompt_tokens", r.prompt_tokens},
                            {"generated_tokens", r.generated_tokens}, {"decode_steps", r.decode_steps},
                            {"preemptions", r.preemptions}, {"deferred_admissions", r.deferred_admissions},
                            {"wall_seconds", r.wall_seconds}, {"prefill_seconds", r.prefill_seconds},
                            {"decode_seconds", r.decode_seconds}, {"decode_tokens_per_s", r.decode_tokens_per_s},
                            {"throughput_tokens_per_s", r.throughput_tokens_per_s}, {"mean_batch", r.mean_batch},
                            {"max_batch_seen", r.max_batch_seen}, {"itl_ms_p50", r.itl_ms_p50},
                            {"itl_ms_p90", r.itl_ms_p90}, {"itl_ms_p99", r.itl_ms_p99}, {"itl_ms_max", r.itl_ms_max},
                            {"ttft_ms_p50", r.ttft_ms_p50}, {"ttft_ms_p99", r.ttft_ms_p99},
                            {"kv_pool_pages", r.kv_pool_pages}, {"kv_bytes_per_token", r.kv_bytes_per_token},
                            {"cuda_graph_stats", cli::graph_stats_json(r.graphs)}});
  }
  cli::print_or_write_json(j, a.json);
}

void register_bench_serve(CLI::App& root) {
  CLI::App* bench = flashkv::cli::group(root, "bench", "benchmarks");
  auto args = std::make_shared<BenchServeArgs>();
  CLI::App* cmd = bench->add_subcommand(
      "serve", "continuous batching: replay N seeded requests, decode tok/s and per-token latency percentiles");
  flashkv::cli::add_model_options(cmd, args->model, args->tokenizer, "smollm2-135m");
  cmd->add_option("--kv-cache", args->kv_cache, "formats (default: fp32 bf16 int8 int4; on cuda bf16 int8 int4)")
      ->expected(1, -1);
  flashkv::cli::add_device_option(cmd, args->device);
  cmd->add_option("--requests", args->requests, "requests replayed (default 64)");
  cmd->add_option("--prompt-len", args->prompt_len, "prompt tokens MIN:MAX, uniform (default 32:256)");
  cmd->add_option("--output-len", args->output_len, "generated tokens MIN:MAX, uniform (default 16:128)");
  cmd->add_option("--max-batch", args->max_batch, "sequences decoded together at most (default 16)");
  cmd->add_option("--kv-pages", args->kv_pages,
                  "KV page pool (default 0: max-batch sequences of the longest prompt + output fit; smaller pools "
                  "defer admissions and preempt)");
  cmd->add_option("--page-size", args->page_size, "tokens per cache page (default 32)");
  cmd->add_option("--seed", args->seed, "request lengths and prompt tokens (default 1)");
  cmd->add_option("--json", args->json, "write results (with command, date, machine) as JSON ('-' = stdout)");
  cmd->callback([args] { run(*args); });
}

}  // namespace

FLASHKV_CLI_COMMAND("bench serve", register_bench_serve);
