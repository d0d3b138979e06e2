// flashkv eval kv: attention-level quality of KV cache formats on synthetic K/V that mimic real models (gaussian,
// outlier key channels, post-RoPE keys, an attention sink): reconstruction NMSE of K and V, relative attention error
// vs the unquantized cache, bias and spread of q·k̂ − q·k; plus the needle test (success table per format and an SVG
// heatmap per format, depth × context). Library: src/kvcache/quality/quality.hpp. Shares the `eval` group with the
// engine's model-level evaluation.
//
//   flashkv eval kv
//   flashkv eval kv --formats bf16,int8,int4,int2_kivi --needle-contexts 1k,32k,128k --heatmap-dir out/ --json r.json
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command.hpp"
#include "cli/util_json.hpp"
#include "cli/util_output.hpp"
#include "cli/util_parse.hpp"
#include "flashkv/error.hpp"
#include "flashkv/kvcache.hpp"
#include "kvcache/quality/quality.hpp"

namespace {

struct EvalKvArgs {
  std::string formats = "bf16,fp8_e4m3,fp8_e4m3_dynamic,int8,int4,int4_g32,int4_kivi,int2_kivi";
  std::string distributions = "gaussian,outlier,rope,sink";
  std::string needle_contexts = "1k,4k,16k";
  int32_t needle_depths = 11;
  double margin = 1.5;
  bool no_needle = false;
  int64_t tokens = 4096;
  int64_t queries = 8;
  int32_t head_dim = 128;
  int32_t page_size = 32, residual = 0, sinks = 0;
  std::string rotate = "none";
  std::string json, heatmap_dir;
  uint64_t seed = 1;
};

std::string safe_name(const std::string& s) {
  std::string o;
  for (char c : s) o += (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-') ? c : '_';
  return o;
}

void run(const EvalKvArgs& a) {
  using namespace flashkv;
  if (a.rotate != "none" && a.rotate != "hadamard") throw Error("--rotate", "'none' or 'hadamard'", "'" + a.rotate + "'");
  // lists and counts: src/cli/util_parse.hpp (no empty items, 4k = 4096); output paths checked before any work
  const std::vector<std::string> formats = flashkv::cli::parse_kv_format_list({a.formats}, "--formats");
  if (a.head_dim % 2 != 0 || a.head_dim < 4) {
    throw Error("--head-dim", "an even value in 4..256 (the synthetic K/V generators)", std::to_string(a.head_dim));
  }
  if (!std::isfinite(a.margin)) throw Error("--margin", "a finite score margin", std::to_string(a.margin));
  for (const std::string& f : formats) {  // fail fast on a typo or a format these settings cannot hold
    KVCacheConfig c;
    c.head_dim = a.head_dim;
    c.page_size = a.page_size;
    c.residual_tokens = a.residual;
    c.sink_tokens = a.sinks;
    c.rotation = a.rotate == "hadamard" ? KVRotation::hadamard : KVRotation::none;
    c.capacity_pages = 1;
    c.with_kv_cache_dtype(f).validate();
  }
  std::vector<kvq::Distribution> dists;
  for (const std::string& d : flashkv::cli::parse_list(a.distributions, "--distributions")) {
    dists.push_back(kvq::parse_distribution(d));
  }
  std::vector<int64_t> contexts;
  if (!a.no_needle) contexts = flashkv::cli::parse_count_list(a.needle_contexts, "--needle-contexts", 1, int64_t{1} << 24);
  flashkv::cli::check_output_file(a.json, "--json", /*allow_stdout=*/true);
  if (!a.no_needle) flashkv::cli::prepare_output_dir(a.heatmap_dir, "--heatmap-dir");
  kvq::CacheSettings st;
  st.page_size = a.page_size;
  st.residual_tokens = a.residual;
  st.sink_tokens = a.sinks;
  st.hadamard = a.rotate == "hadamard";
  st.rotation_seed = a.seed;
  std::vector<double> depths;
  for (int32_t i = 0; i < a.needle_depths; ++i) depths.push_back(static_cast<double>(i) / (a.needle_depths - 1));

  nlohmann::json js;
  js["settings"] = {{"tokens", a.tokens},      {"queries", a.queries},     {"head_dim", a.head_dim},
                    {"page_size", a.page_size}, {"residual", a.residual},  {"sinks", a.sinks},
                    {"rotate", a.rotate},       {"seed", a.seed},          {"needle_margin", a.margin}};
  std::printf("KV quality: %lld tokens, %lld queries (GQA over 1 KV head), head_dim %d, page %d, residual %d, sinks "
              "%d, rotation %s, seed %llu\n",
              static_cast<long long>(a.tokens), static_cast<long long>(a.queries), a.head_dim, a.page_size,
              a.residual, a.sinks, a.rotate.c_str(), static_cast<unsigned long long>(a.seed));
  std::printf("%-22s %-9s %9s %11s %11s %13s %11s %10s\n", "format", "keys", "bits/elt", "NMSE(K)", "NMSE(V)",
              "attn rel err", "q·k bias", "q·k std");
  for (kvq::Distribution dist : dists) {
    const kvq::Synthetic data = kvq::generate(dist, a.tokens, a.queries, a.head_dim, a.seed);
    for (const std::string& f : formats) {
      const kvq::FormatQuality q = kvq::evaluate_format(f, st, data);
      std::printf("%-22s %-9s %9.3f %11.3e %11.3e %13.3e %+11.2e %10.2e\n", f.c_str(), kvq::distribution_name(dist),
                  q.bits_per_element, q.nmse_k, q.nmse_v, q.attn_rel_err, q.qk_bias, q.qk_std);
      js["formats"].push_back({{"kv_cache_dtype", f},
                               {"distribution", kvq::distribution_name(dist)},
                               {"bits_per_element", q.bits_per_element},
                               {"nmse_k", q.nmse_k},
                               {"nmse_v", q.nmse_v},
                               {"attn_rel_err", q.attn_rel_err},
                               {"qk_bias", q.qk_bias},
                               {"qk_std", q.qk_std}});
    }
  }
  if (!contexts.empty()) {
    std::printf("\nneedle test: success rate over %d depths (cos(out, needle value) >= 0.9; margin %.2f over the "
                "distractors' log-sum-exp)\n%-22s",
                a.needle_depths, a.margin, "format");
    for (int64_t n : contexts) std::printf(" %8lld", static_cast<long long>(n));
    std::printf("\n");
    for (const std::string& f : formats) {
      const kvq::NeedleResult r = kvq::needle_test(f, st, contexts, depths, a.margin, a.head_dim, a.seed);
      std::printf("%-22s", f.c_str());
      nlohmann::json jr = {{"kv_cache_dtype", f}};
      for (int64_t n : contexts) {
        std::printf(" %8.2f", r.success_rate(n));
        jr["success_rate"][std::to_string(n)] = r.success_rate(n);
      }
      std::printf("\n");
      for (const kvq::NeedleCell& c : r.cells) {
        jr["cells"].push_back({{"context", c.context}, {"depth", c.depth}, {"cosine", c.cosine}, {"success", c.success}});
      }
      if (!a.heatmap_dir.empty()) {
        const std::string path = a.heatmap_dir + "/needle-" + safe_name(f) + ".svg";
        std::ofstream out(path);
        if (!out) throw IoError("flashkv: cannot write heatmap '" + path + "'");
        out << kvq::needle_heatmap_svg(r, contexts, depths);
        jr["heatmap"] = path;
      }
      js["needle"].push_back(jr);
    }
    if (!a.heatmap_dir.empty()) std::printf("heatmaps: %s/needle-<format>.svg\n", a.heatmap_dir.c_str());
  }
  if (!a.json.empty()) flashkv::cli::print_or_write_json(js, a.json);
}

void register_eval_kv(CLI::App& root) {
  CLI::App* g = flashkv::cli::group(root, "eval", "quality evaluation of KV cache formats");
  auto args = std::make_shared<EvalKvArgs>();
  CLI::App* kv = g->add_subcommand("kv", "attention-level KV-format quality on synthetic K/V + needle test");
  kv->add_option("--formats", args->formats, "comma-separated kv_cache_dtype strings (e.g. bf16,int8,k:int8,v:int4)");
  kv->add_option("--distributions", args->distributions, "gaussian,outlier,rope,sink");
  using flashkv::cli::add_count_option;
  add_count_option(kv, "--tokens", args->tokens, "cached tokens for the error metrics (default 4096; 4k = 4096)", 1,
                   int64_t{1} << 24);
  add_count_option(kv, "--queries", args->queries, "query heads sharing the KV head (default 8)", 1, 4096);
  add_count_option(kv, "--head-dim", args->head_dim, "head_dim (default 128)", 1, 256);
  add_count_option(kv, "--page-size", args->page_size, "tokens per page (default 32)", 1, 1 << 20);
  add_count_option(kv, "--residual", args->residual, "most recent tokens kept bf16 (default 0)", 0, 1 << 30);
  add_count_option(kv, "--sinks", args->sinks, "first tokens kept bf16 (default 0)", 0, 1 << 30);
  kv->add_option("--rotate", args->rotate, "none | hadamard");
  kv->add_option("--needle-contexts", args->needle_contexts, "context lengths, e.g. 1k,4k,32k,128k (default 1k,4k,16k)");
  add_count_option(kv, "--needle-depths", args->needle_depths, "depths 0..100% evenly (default 11)", 2, 101);
  kv->add_option("--margin", args->margin, "needle score margin over the distractors' log-sum-exp (default 1.5: exact softmax mass 0.82)");
  kv->add_flag("--no-needle", args->no_needle, "skip the needle test");
  kv->add_option("--heatmap-dir", args->heatmap_dir, "write needle-<format>.svg heatmaps here");
  kv->add_option("--json", args->json, "write results as JSON to this file ('-' = stdout)");
  kv->add_option("--seed", args->seed, "generator seed (default 1)");
  kv->callback([args] { run(*args); });
}

}  // namespace

FLASHKV_CLI_COMMAND("eval kv", register_eval_kv);
