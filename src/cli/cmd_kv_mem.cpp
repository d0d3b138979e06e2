// flashkv kv-mem: KV-cache memory calculator. Evaluates kv_memory_estimate() — the exact byte formula of
// PagedKVCache (include/flashkv/kvcache.hpp "MEMORY"; tested equal to a live cache's memory_report()) — for a model
// preset, a checkpoint, or explicit --layers/--kv-heads/--head-dim, and one or more kv_cache_dtype formats:
// bytes split into codes / metadata / residual / page slack, effective bits per element, ratio to bf16, and with
// --memory how many sequences of --tokens fit next to the weights.
//
//   flashkv kv-mem --model llama-3-8b --tokens 128k --kv-cache bf16,fp8,int4,int2_kivi --memory 141GB
//
// Presets: layers / KV heads / head_dim are the Hugging Face config.json values (num_hidden_layers,
// num_key_value_heads, head_dim or hidden_size / num_attention_heads) of the model cards named below; the parameter
// counts (for the default --weights in bf16) are the ones the model cards state.
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
#include "cli/util_kv_memory.hpp"
#include "cli/util_output.hpp"
#include "cli/util_parse.hpp"
#include "flashkv/engine.hpp"
#include "flashkv/error.hpp"
#include "flashkv/kvcache.hpp"

namespace {

struct Preset {
  const char* name;
  int32_t layers, kv_heads, head_dim;
  double params_billion;
  const char* source;
};

// clang-format off
const Preset kPresets[] = {
  {"llama-3-8b",     32,  8, 128,   8.03, "huggingface.co/meta-llama/Meta-Llama-3-8B config.json (32 layers, 8 KV heads, 4096/32)"},
  {"llama-3-70b",    80,  8, 128,  70.6,  "huggingface.co/meta-llama/Meta-Llama-3-70B config.json (80 layers, 8 KV heads, 8192/64)"},
  {"llama-3.1-405b", 126, 8, 128, 405.9,  "huggingface.co/meta-llama/Llama-3.1-405B config.json (126 layers, 8 KV heads, 16384/128)"},
  {"mistral-7b",     32,  8, 128,   7.24, "huggingface.co/mistralai/Mistral-7B-v0.1 config.json (32 layers, 8 KV heads, 4096/32)"},
  {"qwen2.5-7b",     28,  4, 128,   7.61, "huggingface.co/Qwen/Qwen2.5-7B config.json (28 layers, 4 KV heads, 3584/28)"},
  {"qwen2.5-72b",    80,  8, 128,  72.7,  "huggingface.co/Qwen/Qwen2.5-72B config.json (80 layers, 8 KV heads, 8192/64)"},
  {"gemma-2-9b",     42,  8, 256,   9.24, "huggingface.co/google/gemma-2-9b config.json (42 layers, 8 KV heads, head_dim 256; "
                                          "alternate layers use a 4096-token sliding window, not modelled here)"},
};
// clang-format on

struct Args {
  std::string model, kv_cache = "bf16,fp8_e4m3,int8,int4,int4_kivi,int2_kivi", kv_k, kv_v, tokens = "4096", memory,
                     weights, json;
  int32_t layers = 0, kv_heads = 0, head_dim = 0, page_size = 32, residual = 0, sinks = 0;
  int64_t batch = 1;
};

/// Fails (exit 2) when a cache of this shape could not be counted in int64 bytes: every format stores at most
/// 4 bytes of codes per element plus metadata, so 8 bytes per element, K and V, over tokens + one page of slack +
/// residual + sinks per sequence bounds every report; the bound must stay below 2^62 bytes (4 EiB).
void check_countable(const Args& a, int64_t tokens) {
  const long double per_seq_tokens = static_cast<long double>(tokens) + a.page_size + a.residual + a.sinks;
  const long double elems = 2.0L * a.layers * a.kv_heads * a.head_dim * static_cast<long double>(a.batch) * per_seq_tokens;
  const long double bound = 8.0L * elems;
  if (bound > 4.6e18L) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "--batch %lld x --tokens %lld on %d layers x %d KV heads x head_dim %d: up to %.3Lg bytes",
                  static_cast<long long>(a.batch), static_cast<long long>(tokens), a.layers, a.kv_heads, a.head_dim,
                  bound);
    throw flashkv::Error("--tokens/--batch", "a KV cache whose byte count fits int64 (below 2^62 bytes = 4 EiB)", buf);
  }
}

std::string human(double bytes) {
  char buf[64];
  const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (bytes >= 1024.0 && i < 4) {
    bytes /= 1024.0;
    ++i;
  }
  std::snprintf(buf, sizeof(buf), i == 0 ? "%.0f %s" : "%.2f %s", bytes, u[i]);
  return buf;
}

/// Reads layers / KV heads / head_dim from a Hugging Face config.json (file or directory) or a checkpoint that the
/// engine loads (llama2.c, GGUF).
void from_checkpoint(const std::string& path, Args& a, std::string& source) {
  namespace fs = std::filesystem;
  fs::path p(path);
  if (fs::is_directory(p)) p /= "config.json";
  if (p.extension() == ".json") {
    std::ifstream f(p);
    if (!f) throw flashkv::IoError("flashkv: cannot open '" + p.string() + "'");
    nlohmann::json j;
    try {
      f >> j;
      const int32_t heads = j.at("num_attention_heads").get<int32_t>();
      a.layers = j.at("num_hidden_layers").get<int32_t>();
      a.kv_heads = j.value("num_key_value_heads", heads);
      a.head_dim = j.contains("head_dim") && !j["head_dim"].is_null() ? j["head_dim"].get<int32_t>()
                                                                       : j.at("hidden_size").get<int32_t>() / heads;
    } catch (const nlohmann::json::exception& e) {
      throw flashkv::IoError("flashkv: '" + p.string() + "' is not a usable config.json: " + e.what());
    }
    source = p.string();
    return;
  }
  const flashkv::Model m = flashkv::load_model(path);
  a.layers = m.config.n_layers;
  a.kv_heads = m.config.num_heads_kv;
  a.head_dim = m.config.head_dim;
  source = path + " (" + flashkv::checkpoint_format_name(m.format) + ")";
}

void run(Args a) {
  using namespace flashkv;
  std::string source = "explicit --layers/--kv-heads/--head-dim";
  int64_t weights = 0;
  std::string weights_note = "0 (pass --weights)";
  if (!a.model.empty()) {
    const Preset* hit = nullptr;
    for (const Preset& p : kPresets) {
      if (a.model == p.name) hit = &p;
    }
    if (hit != nullptr) {
      a.layers = hit->layers;
      a.kv_heads = hit->kv_heads;
      a.head_dim = hit->head_dim;
      source = hit->source;
      weights = static_cast<int64_t>(std::llround(hit->params_billion * 1e9 * 2));
      weights_note = "bf16 weights of " + std::string(hit->name);
    } else if (std::filesystem::exists(a.model)) {
      from_checkpoint(a.model, a, source);
    } else {
      std::string names;
      for (const Preset& p : kPresets) names += std::string(names.empty() ? "" : ", ") + p.name;
      throw Error("--model", "a preset (" + names + ") or an existing checkpoint / config.json path", "'" + a.model + "'");
    }
  }
  if (a.layers <= 0 || a.kv_heads <= 0 || a.head_dim <= 0) {
    throw Error("--model", "--model PRESET|PATH or all of --layers, --kv-heads, --head-dim (> 0)",
                std::to_string(a.layers) + "/" + std::to_string(a.kv_heads) + "/" + std::to_string(a.head_dim));
  }
  if (!a.weights.empty()) {
    weights = flashkv::cli::parse_bytes(a.weights, "--weights");
    weights_note = "--weights";
  }
  const int64_t tokens = flashkv::cli::parse_count(a.tokens, "--tokens", 1);
  const int64_t memory = a.memory.empty() ? 0 : flashkv::cli::parse_bytes(a.memory, "--memory");
  check_countable(a, tokens);
  std::vector<std::string> formats;
  if (!a.kv_k.empty() || !a.kv_v.empty()) {
    if (a.kv_k.empty() || a.kv_v.empty()) throw Error("--kv-k/--kv-v", "both --kv-k and --kv-v", "only one");
    formats.push_back("k:" + a.kv_k + ",v:" + a.kv_v);
  } else {
    formats = flashkv::cli::parse_kv_format_list({a.kv_cache}, "--kv-cache");
  }
  std::vector<KVCacheConfig> configs;  // every format checked before anything is printed
  for (const std::string& f : formats) {
    KVCacheConfig c;
    c.num_layers = a.layers;
    c.num_heads_kv = a.kv_heads;
    c.head_dim = a.head_dim;
    c.page_size = a.page_size;
    c.residual_tokens = a.residual;
    c.sink_tokens = a.sinks;
    c.with_kv_cache_dtype(f);
    KVCacheConfig check = c;  // page size, groups, head_dim: validated for every format before printing anything
    check.capacity_pages = 1;
    check.validate();
    configs.push_back(c);
  }
  flashkv::cli::check_output_file(a.json, "--json", /*allow_stdout=*/true);
  std::printf("model: %d layers, %d KV heads, head_dim %d  [%s]\n", a.layers, a.kv_heads, a.head_dim, source.c_str());
  std::printf("batch %lld x %lld tokens, page_size %d, residual %d, sinks %d\n", static_cast<long long>(a.batch),
              static_cast<long long>(tokens), a.page_size, a.residual, a.sinks);
  if (memory > 0) {
    std::printf("memory %s, weights %s (%s)\n", human(static_cast<double>(memory)).c_str(),
                human(static_cast<double>(weights)).c_str(), weights_note.c_str());
  }
  std::printf("%-24s %9s %12s %12s %12s %12s %12s %8s %12s%s\n", "kv_cache_dtype", "bits/elt", "codes", "metadata",
              "residual", "slack", "total", "vs bf16", "per seq", memory > 0 ? "  seqs fit" : "");
  nlohmann::json js;
  js["model"] = {{"layers", a.layers}, {"kv_heads", a.kv_heads}, {"head_dim", a.head_dim}, {"source", source}};
  js["batch"] = a.batch;
  js["tokens"] = tokens;
  const int64_t bf16_bytes =
      flashkv::cli::bf16_reference_bytes(a.layers, a.kv_heads, a.head_dim, a.page_size, a.batch, tokens);
  for (std::size_t fi = 0; fi < formats.size(); ++fi) {
    const std::string& f = formats[fi];
    const KVMemoryReport r = kv_memory_estimate(configs[fi], a.batch, tokens);
    const double per_seq = static_cast<double>(r.total_bytes) / static_cast<double>(a.batch);
    const double ratio = r.total_bytes > 0 ? static_cast<double>(bf16_bytes) / r.total_bytes : 0.0;
    int64_t fit = -1;
    if (memory > 0) fit = memory > weights && per_seq > 0 ? static_cast<int64_t>((memory - weights) / per_seq) : 0;
    std::printf("%-24s %9.4f %12s %12s %12s %12s %12s %7.2fx %12s", f.c_str(), r.bits_per_element,
                human(static_cast<double>(r.code_bytes)).c_str(), human(static_cast<double>(r.metadata_bytes)).c_str(),
                human(static_cast<double>(r.residual_bytes)).c_str(), human(static_cast<double>(r.slack_bytes)).c_str(),
                human(static_cast<double>(r.total_bytes)).c_str(), ratio, human(per_seq).c_str());
    if (memory > 0) std::printf(" %10lld", static_cast<long long>(fit));
    std::printf("\n");
    nlohmann::json jr = {{"kv_cache_dtype", f},         {"bits_per_element", r.bits_per_element},
                         {"code_bytes", r.code_bytes},   {"metadata_bytes", r.metadata_bytes},
                         {"residual_bytes", r.residual_bytes}, {"slack_bytes", r.slack_bytes},
                         {"total_bytes", r.total_bytes}, {"pages", r.pages_used},
                         {"page_bytes", r.page_bytes},   {"ratio_vs_bf16", ratio},
                         {"vs_bf16", flashkv::cli::vs_bf16_text(static_cast<double>(bf16_bytes),
                                                                 static_cast<double>(r.total_bytes))}};
    if (memory > 0) jr["sequences_fit"] = fit;
    js["formats"].push_back(jr);
  }
  std::printf("vs bf16 = bf16 bytes / this format's bytes for the same tokens and pages (as `flashkv generate` reports "
              "it): 1.60x = 1.60x smaller than bf16\n");
  js["bf16_bytes"] = bf16_bytes;
  if (memory > 0) {
    js["memory_bytes"] = memory;
    js["weights_bytes"] = weights;
  }
  if (!a.json.empty()) flashkv::cli::print_or_write_json(js, a.json);
}

void register_kv_mem(CLI::App& root) {
  auto args = std::make_shared<Args>();
  CLI::App* c = root.add_subcommand("kv-mem", "KV-cache memory calculator (codes / metadata / residual / slack)");
  std::string presets;
  for (const Preset& p : kPresets) presets += std::string(presets.empty() ? "" : ", ") + p.name;
  c->add_option("--model", args->model, "preset (" + presets + ") or a checkpoint / HF config.json path");
  using flashkv::cli::add_count_option;
  add_count_option(c, "--layers", args->layers, "number of layers (without --model)", 1, 1 << 20);
  add_count_option(c, "--kv-heads", args->kv_heads, "KV heads (without --model)", 1, 1 << 20);
  add_count_option(c, "--head-dim", args->head_dim, "head_dim (without --model)", 1, 1 << 20);
  add_count_option(c, "--batch", args->batch, "sequences (default 1)", 1, int64_t{1} << 40);
  c->add_option("--tokens", args->tokens, "tokens per sequence, e.g. 4096 or 128k (default 4096)");
  c->add_option("--kv-cache", args->kv_cache,
                "comma-separated kv_cache_dtype list (default bf16,fp8_e4m3,int8,int4,int4_kivi,int2_kivi)");
  c->add_option("--kv-k", args->kv_k, "K format (with --kv-v: one explicit K/V pair)");
  c->add_option("--kv-v", args->kv_v, "V format");
  add_count_option(c, "--page-size", args->page_size, "tokens per page (default 32, a multiple of the KIVI group)", 1,
                   1 << 20);
  add_count_option(c, "--residual", args->residual, "most recent tokens kept bf16 (default 0)", 0, 1 << 30);
  add_count_option(c, "--sinks", args->sinks, "first tokens kept bf16 (default 0)", 0, 1 << 30);
  c->add_option("--memory", args->memory, "device memory, e.g. 141GB: prints how many sequences fit");
  c->add_option("--weights", args->weights, "bytes taken by weights (default: bf16 weights of a preset, else 0)");
  c->add_option("--json", args->json, "write results as JSON to this file ('-' = stdout)");
  c->callback([args] { run(*args); });
}

}  // namespace

FLASHKV_CLI_COMMAND("kv-mem", register_kv_mem);
