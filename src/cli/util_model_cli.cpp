// Shared model / KV-cache / sampler options of the model-running commands.
#include "cli/util_model_cli.hpp"

#include <cstdio>

#include "cli/util_parse.hpp"
#include "eval/evaluation.hpp"
#include "flashkv/error.hpp"
#include "flashkv/kvcache.hpp"

namespace flashkv::cli {

std::string model_option_help(const std::string& default_name) {
  std::string s = "a named model (";
  bool first = true;
  for (const ModelAlias& a : model_aliases()) {
    s += (first ? "" : "; ") + a.name + ": " + a.description;
    first = false;
  }
  s += ") or a checkpoint path (llama2.c .bin or GGUF)";
  if (!default_name.empty()) s += "; default " + default_name;
  return s;
}

void add_model_options(CLI::App* sub, std::string& model, std::string& tokenizer, const std::string& default_name) {
  model = default_name;
  sub->add_option("--model", model, model_option_help(default_name));
  sub->add_option("--tokenizer", tokenizer,
                  "llama2.c tokenizer file (default: the named model's, or the vocabulary embedded in a GGUF)");
}

KVCacheSpec KvOptions::spec() const {
  return eval::spec_from_options(kv_cache, kv_k, kv_v, residual, sinks, rotate, page_size);
}

void add_kv_options(CLI::App* sub, KvOptions& o) {
  add_nonempty_option(sub, "--kv-cache", o.kv_cache, std::string("KV cache format (default fp32). ") + kv_cache_dtype_grammar());
  add_nonempty_option(sub, "--kv-k", o.kv_k, "K format (with --kv-v) instead of --kv-cache");
  add_nonempty_option(sub, "--kv-v", o.kv_v, "V format (with --kv-k)");
  add_count_option(sub, "--residual", o.residual, "most recent tokens kept in bf16 (KIVI residual window)", 0, 1 << 30);
  add_count_option(sub, "--sinks", o.sinks, "first tokens kept in bf16", 0, 1 << 30);
  sub->add_option("--rotate", o.rotate, "none | hadamard (rotation before quantization)");
  add_count_option(sub, "--page-size", o.page_size, "tokens per cache page (power of two, 16-256)", 1, 1 << 20);
}

EngineOptions DeviceOptions::engine() const {
  EngineOptions o = parse_engine_device(device, "device");
  if (cuda_graphs != "on" && cuda_graphs != "off") throw Error("cuda-graphs", "on or off", "'" + cuda_graphs + "'");
  o.cuda_graphs = cuda_graphs == "on";
  return o;
}

void add_device_option(CLI::App* sub, DeviceOptions& o) {
  add_device_option(sub, o,
                    "where the model runs: cpu (default) or cuda / cuda:N (bf16 weights, cuBLAS, CUDA attention and "
                    "paged decode; --kv-cache defaults to bf16 there)");
}
void add_device_option(CLI::App* sub, DeviceOptions& o, const std::string& help) {
  sub->add_option("--device", o.device, help);
  sub->add_option("--cuda-graphs", o.cuda_graphs,
                  "on (default) | off: with --device cuda, replay each decode step from a CUDA graph of its bucket "
                  "(batch, page-table stride, splits), or launch every kernel (the same results)");
}

std::string cuda_graph_summary(const DeviceOptions& o, const CudaGraphStats& s) {
  std::string line = "cuda graphs " + o.cuda_graphs + ": " + std::to_string(s.graph_steps) + " decode steps replayed, " +
                     std::to_string(s.eager_steps) + " eager, " + std::to_string(s.captures) + " captures";
  if (s.evictions > 0) line += ", " + std::to_string(s.evictions) + " evicted";
  if (s.capture_failures > 0)
    line += ", " + std::to_string(s.capture_failures) + " FAILED captures (last: " + s.last_capture_error + ")";
  return line;
}

KVCacheSpec kv_spec_for(const KvOptions& kv, const DeviceOptions& dev) {
  if (dev.cuda() && kv.kv_cache.empty() && kv.kv_k.empty() && kv.kv_v.empty()) {
    KvOptions k = kv;
    k.kv_cache = "bf16";
    return k.spec();
  }
  return kv.spec();
}

SamplerConfig SamplerOptions::config() const {
  SamplerConfig sc{temperature, top_p, top_k, seed};
  sc.validate();
  return sc;
}

void add_sampler_options(CLI::App* sub, SamplerOptions& o, float default_temperature) {
  o.temperature = default_temperature;
  sub->add_option("--temperature", o.temperature,
                  "0 = greedy (default " + std::to_string(default_temperature).substr(0, 3) + ")");
  sub->add_option("--top-p", o.top_p, "nucleus sampling threshold in (0, 1] (default 0.9)");
  add_count_option(sub, "--top-k", o.top_k, "keep the k most probable tokens (0 = off)", 0, 1 << 30);
  sub->add_option("--seed", o.seed, "sampler seed (default 42)");
}

std::function<void(int32_t, int32_t)> stdout_streamer(const Tokenizer& tok, bool quiet) {
  if (quiet) return {};
  return [&tok](int32_t prev, int32_t t) {
    std::fputs(tok.decode_piece(prev, t).c_str(), stdout);
    std::fflush(stdout);
  };
}

}  // namespace flashkv::cli
