// flashkv bench engine: prefill (pp) and decode (tg) tokens/s of the whole model per KV format at a context, measured
// as llama.cpp's llama-bench measures `-p/-n/-d` (eval/speed.hpp), so the two compare on the same machine; with
// --batch, decode tokens/s of B sequences decoded together per format × context × batch, the most sequences of a
// context the page pool holds, and the bytes each step reads (eval/batch_decode.hpp).
//
//   flashkv bench engine --model smollm2-135m --kv-cache fp32 bf16 int8 int4 --contexts 2k,8k --repeats 3 --json s.json
//   flashkv bench engine --model m.gguf --device cuda --kv-cache bf16 int4 --contexts 1k,8k --batch 1,8,64,max
//     --fill synthetic --kv-pool 100GiB --capacity-context 8k --json b.json
#include <omp.h>

#include <algorithm>
#include <set>
#include <chrono>
#include <cstdio>

#include "cli/command.hpp"
#include "cli/util_eval_cli.hpp"
#include "cli/util_model_cli.hpp"
#include "cli/util_output.hpp"
#include "cli/util_json.hpp"
#include "cli/util_parse.hpp"
#include "eval/batch_decode.hpp"
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
  // --batch mode (eval/batch_decode.hpp)
  std::string batch, fill = "prefill", kv_pool;
  int32_t warmup = 2, batch_cap = 1024, capacity_context = 0, probe_cap = 8192;
  double point_seconds = 0.0, time_budget = 0.0;
  uint64_t seed = 1;
  bool n_gen_given = false, llama_bench_given = false, batch_only_given = false;
};

/// "1,8,64,max" → {1, 8, 64, 0}.
std::vector<int32_t> parse_batches(const std::string& list) {
  std::vector<int32_t> out;
  for (const std::string& w : flashkv::cli::parse_list(list, "--batch"))
    out.push_back(w == "max" ? 0 : static_cast<int32_t>(flashkv::cli::parse_count(w, "--batch", 1, 1 << 20)));
  return out;
}

void run_batched(const BenchEngineArgs& a) {
  using namespace flashkv;
  if (a.llama_bench_given)
    throw Error("--batch", "no --n-prompt / --repeats (they belong to the single-sequence protocol)", "both given");
  eval::BatchDecodeOptions o;
  o.contexts = cli::parse_token_counts(a.contexts, "--contexts");
  o.batches = parse_batches(a.batch);
  o.warmup = a.warmup;
  o.n_gen = a.n_gen_given ? a.n_gen : 16;
  o.point_seconds = a.point_seconds;
  o.batch_cap = a.batch_cap;
  o.pool_bytes = a.kv_pool.empty() ? 0 : cli::parse_bytes(a.kv_pool, "--kv-pool");
  o.capacity_context = a.capacity_context;
  o.probe_cap = a.probe_cap;
  if (a.fill != "synthetic" && a.fill != "prefill")
    throw Error("--fill", "synthetic or prefill", "'" + a.fill + "'");
  o.synthetic = a.fill == "synthetic";
  o.ubatch = a.ubatch;
  o.seed = a.seed;
  o.time_budget = a.time_budget;
  o.engine = a.device.engine();
  if (a.point_seconds < 0) throw Error("--point-seconds", ">= 0", std::to_string(a.point_seconds));
  if (a.time_budget < 0) throw Error("--time-budget", ">= 0", std::to_string(a.time_budget));
  const bool wants_max = std::find(o.batches.begin(), o.batches.end(), 0) != o.batches.end();
  if ((wants_max || o.capacity_context > 0) && o.pool_bytes == 0)
    throw Error("--kv-pool", "a pool size (e.g. 100GiB) with --batch max or --capacity-context", "none");
  if (o.capacity_context > 0 && std::find(o.contexts.begin(), o.contexts.end(), o.capacity_context) == o.contexts.end())
    throw Error("--capacity-context", "one of --contexts " + a.contexts, std::to_string(o.capacity_context));
  const int32_t points = static_cast<int32_t>(std::set<int32_t>(o.batches.begin(), o.batches.end()).size());
  for (int32_t c : o.contexts)
    if (c < points * (o.warmup + o.n_gen) + 1)
      throw Error("--contexts", ">= " + std::to_string(points) + " batch points x (--warmup + --n-gen) + 1 = " +
                                    std::to_string(points * (o.warmup + o.n_gen) + 1) + " tokens",
                  std::to_string(c));
  cli::check_output_file(a.json, "--json", /*allow_stdout=*/true);
  KVCacheSpec defaults;
  defaults.page_size = a.page_size;
  (void)cli::parse_kv_list(a.kv_cache, defaults, 256);  // grammar errors before loading
  if (a.threads > 0) omp_set_num_threads(a.threads);
  const auto t0 = std::chrono::steady_clock::now();
  LoadedModel lm = load_named_model(a.model, a.tokenizer);
  const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const ModelConfig& mc = lm.model.config;
  std::vector<KVCacheSpec> specs = cli::parse_kv_list(a.kv_cache, defaults, mc.head_dim);
  if (specs.empty())
    specs = cli::parse_kv_list({a.device.cuda() ? "bf16 fp8_e4m3 int8 int4" : "fp32 bf16 int8 int4"}, defaults,
                               mc.head_dim);
  std::fprintf(stderr, "[bench engine] %s (%d layers, dim %d, %d/%d heads x %d, vocab %d) loaded in %.1f s; %s on %s, "
               "fill %s\n", a.model.c_str(), mc.n_layers, mc.dim, mc.num_heads, mc.num_heads_kv, mc.head_dim,
               mc.vocab_size, load_seconds, a.batch.c_str(), a.device.device.c_str(), a.fill.c_str());
  const eval::BatchDecodeResult r = eval::run_batch_decode(lm.model, specs, o, [](const eval::BatchDecodeRow& x) {
    if (x.status == "ok")
      std::fprintf(stderr, "[bench engine] %-12s ctx %6d batch %5d%s: %9.3f ms/step, %10.1f tok/s (%d steps, fill %.1f s)\n",
                   x.kv_cache.c_str(), x.context, x.batch, x.is_max ? "*" : " ", x.step_ms_median, x.tokens_per_s,
                   x.steps, x.fill_seconds);
    else
      std::fprintf(stderr, "[bench engine] %-12s ctx %6d batch %5s: %s: %s\n", x.kv_cache.c_str(), x.context,
                   x.batch == 0 ? "max" : std::to_string(x.batch).c_str(),
                   x.status.c_str(), x.message.c_str());
  });
  std::printf("flashkv bench engine --batch: %s on %s; per context C, P batch points in ascending order: a point's new "
              "sequences are filled to D = C - P x (%d + %d) tokens (%s, not timed), earlier ones continue; up to %d "
              "warm-up and %d timed steps (decode + greedy sample of all B)%s\n\n",
              a.model.c_str(), a.device.device.c_str(), o.warmup, o.n_gen,
              o.synthetic ? "synthetic K/V appended without the model" : "prefilled through the cache", o.warmup,
              o.n_gen, o.point_seconds > 0 ? (", each loop stopping after " + std::to_string(o.point_seconds) + " s").c_str() : "");
  std::fputs(eval::batch_decode_table(r).c_str(), stdout);
  if (a.json.empty()) return;
  nlohmann::json j = eval::run_info();
  j["model"] = a.model;
  j["model_config"] = {{"n_layers", mc.n_layers}, {"dim", mc.dim}, {"hidden_dim", mc.hidden_dim},
                       {"num_heads", mc.num_heads}, {"num_heads_kv", mc.num_heads_kv}, {"head_dim", mc.head_dim},
                       {"vocab_size", mc.vocab_size}, {"seq_len", mc.seq_len},
                       {"shared_classifier", mc.shared_classifier}};
  j["load_seconds"] = load_seconds;
  j["config"] = {{"protocol", "batched decode"}, {"device", a.device.device}, {"cuda_graphs", a.device.cuda_graphs}, {"fill", a.fill},
                 {"contexts", o.contexts}, {"batches", a.batch}, {"warmup", o.warmup}, {"n_gen", o.n_gen},
                 {"point_seconds", o.point_seconds}, {"batch_cap", o.batch_cap}, {"kv_pool_bytes", o.pool_bytes},
                 {"capacity_context", o.capacity_context}, {"probe_cap", o.probe_cap}, {"page_size", a.page_size},
                 {"seed", o.seed}, {"time_budget", o.time_budget}, {"threads", omp_get_max_threads()}};
  j.update(eval::batch_decode_to_json(r));
  cli::print_or_write_json(j, a.json);
}

void run(const BenchEngineArgs& a) {
  using namespace flashkv;
  if (a.threads < 0) throw Error("threads", ">= 0 (0 = OpenMP default)", std::to_string(a.threads));
  if (!a.batch.empty()) return run_batched(a);
  if (a.batch_only_given)
    throw Error("--batch", "a batch list (--fill, --warmup, --kv-pool, --batch-cap, --capacity-context, --probe-cap, "
                           "--point-seconds, --time-budget and --seed belong to the --batch protocol)", "none");
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
  const auto rows = eval::run_speed(lm.model, specs, o, [&a](const eval::SpeedRow& r) {
    std::fprintf(stderr, "[bench engine] %-22s ctx %5d: pp %7.1f tok/s, tg %6.1f tok/s  (%s)%s%s\n", r.label.c_str(),
                 r.context, r.pp_mean, r.tg_mean, eval::load_average().c_str(), a.device.cuda() ? "; " : "",
                 a.device.cuda() ? cli::cuda_graph_summary(a.device, r.graphs).c_str() : "");
  });
  std::printf("flashkv bench engine: %s on %s; %d threads; per context C: depth D = C - %d - %d prefilled, then tg = %d "
              "decode steps (D..D+%d), pp = %d tokens prefilled through the cache (..C); %d repetition(s)\n\n",
              a.model.c_str(), a.device.device.c_str(), omp_get_max_threads(), o.n_gen, o.n_prompt, o.n_gen, o.n_gen, o.n_prompt, o.repeats);
  std::fputs(eval::speed_table(rows).c_str(), stdout);
  j["model"] = a.model;
  j["config"] = {{"device", a.device.device}, {"cuda_graphs", a.device.cuda_graphs}, {"n_prompt", o.n_prompt}, {"n_gen", o.n_gen}, {"repeats", o.repeats}, {"ubatch", o.ubatch},
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
  cmd->add_option("--n-prompt", args->n_prompt, "prefill tokens timed (default 512, llama-bench -p)")
      ->each([args](const std::string&) { args->llama_bench_given = true; });
  cmd->add_option("--n-gen", args->n_gen, "decode steps timed (default 128, llama-bench -n; with --batch 16, at most)")
      ->each([args](const std::string&) { args->n_gen_given = true; });
  cmd->add_option("--repeats", args->repeats, "repetitions, each a fresh sequence (default 3)")
      ->each([args](const std::string&) { args->llama_bench_given = true; });
  cmd->add_option("--ubatch", args->ubatch, "tokens per prefill call (default 512)");
  // --batch protocol
  cmd->add_option("--batch", args->batch,
                  "batched decode: batch sizes, e.g. 1,8,64,256,max (max = the most sequences of each context the "
                  "--kv-pool holds, at most --batch-cap); times decode steps of all B sequences together");
  auto batch_only = [args](const std::string&) { args->batch_only_given = true; };
  cmd->add_option("--fill", args->fill, "--batch: how the context is filled: prefill (the model over arbitrary "
                                        "tokens, default) or synthetic (seeded K/V appended without the model)")
      ->each(batch_only);
  flashkv::cli::add_count_option(cmd, "--warmup", args->warmup, "--batch: untimed steps per point (default 2)", 0, 1 << 20)
      ->each(batch_only);
  cmd->add_option("--kv-pool", args->kv_pool, "--batch: KV page pool per format, e.g. 100GiB (default: enough for the "
                                              "largest numeric batch at the largest context)")
      ->each(batch_only);
  flashkv::cli::add_count_option(cmd, "--batch-cap", args->batch_cap, "--batch: max is at most this many sequences "
                                 "(default 1024)", 1, 1 << 20)->each(batch_only);
  flashkv::cli::add_count_option(cmd, "--capacity-context", args->capacity_context,
                                 "--batch: measure how many sequences of this context (one of --contexts) fit: filled "
                                 "until the engine refuses one", 1, 1 << 24)->each(batch_only);
  flashkv::cli::add_count_option(cmd, "--probe-cap", args->probe_cap, "--batch: the capacity probe stops at this many "
                                 "sequences (default 8192)", 1, 1 << 20)->each(batch_only);
  cmd->add_option("--point-seconds", args->point_seconds, "--batch: stop timing a point after this many seconds (at "
                                                          "least one step; default 0 = always --n-gen steps)")
      ->each(batch_only);
  cmd->add_option("--time-budget", args->time_budget, "--batch: points not started within this many seconds are "
                                                      "reported as skipped (default 0 = no budget)")
      ->each(batch_only);
  cmd->add_option("--seed", args->seed, "--batch: synthetic K/V and first tokens (default 1)")->each(batch_only);
  cmd->add_option("--page-size", args->page_size, "tokens per cache page (default 32)");
  cmd->add_option("--threads", args->threads, "OpenMP threads (default 0 = OpenMP default)");
  flashkv::cli::add_device_option(cmd, args->device);
  cmd->add_option("--json", args->json, "write results (with command, date, machine, load) as JSON ('-' = stdout)");
  cmd->callback([args] { run(*args); });
}

}  // namespace

FLASHKV_CLI_COMMAND("bench engine", register_bench_engine);
