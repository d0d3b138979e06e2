// CLI options shared by the commands that run a model (generate, chat, tokenize, inspect; eval and demo may use them):
// --model NAME|PATH (named models resolved by flashkv::resolve_model), --tokenizer, the KV-cache options and the
// sampler options.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>

#include "flashkv/engine.hpp"

namespace flashkv::cli {

/// Help text of --model: "a named model (smollm2-135m: ..., aidreams260k: ...) or a checkpoint path".
std::string model_option_help(const std::string& default_name);
/// Adds --model (default `default_name`, may be empty = required by the caller) and --tokenizer.
void add_model_options(CLI::App* sub, std::string& model, std::string& tokenizer, const std::string& default_name);

struct KvOptions {
  std::string kv_cache, kv_k, kv_v, rotate = "none";
  int32_t residual = 0, sinks = 0, page_size = 32;
  KVCacheSpec spec() const;  ///< validated (Error naming the option)
};
void add_kv_options(CLI::App* sub, KvOptions& o);

struct SamplerOptions {
  float temperature = 1.0f, top_p = 0.9f;
  int32_t top_k = 0;
  uint64_t seed = 42;
  SamplerConfig config() const;  ///< validated
};
void add_sampler_options(CLI::App* sub, SamplerOptions& o, float default_temperature);

/// --device cpu | cuda | cuda:N: where the Engine runs (EngineOptions::device / device_index); --cuda-graphs on | off
/// (EngineOptions::cuda_graphs, default on; ignored on the CPU).
struct DeviceOptions {
  std::string device = "cpu";
  std::string cuda_graphs = "on";
  /// Parsed; Error naming 'device' (expected "cpu", "cuda" or "cuda:N") or 'cuda-graphs' (expected on / off).
  EngineOptions engine() const;
  bool cuda() const { return engine().device == Device::cuda; }
};
void add_device_option(CLI::App* sub, DeviceOptions& o);
/// The same option with the command's own help text.
void add_device_option(CLI::App* sub, DeviceOptions& o, const std::string& help);
/// One line for the CUDA engine's graph counters, e.g. "cuda graphs on: 98 steps replayed, 0 eager, 3 captures".
std::string cuda_graph_summary(const DeviceOptions& o, const CudaGraphStats& s);
/// The KV spec for the device: --device cuda with no --kv-cache / --kv-k / --kv-v given means bf16 (the CUDA engine
/// decodes no fp32 cache); everything else as KvOptions::spec().
KVCacheSpec kv_spec_for(const KvOptions& kv, const DeviceOptions& dev);

/// An on_token callback that prints each token's bytes to stdout as it comes (nothing when `quiet`).
std::function<void(int32_t, int32_t)> stdout_streamer(const Tokenizer& tok, bool quiet);

}  // namespace flashkv::cli
