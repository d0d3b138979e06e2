// flashkv demo: the main job in one command — a model run once per KV format (fp32 reference, bf16, fp8_e4m3, int8,
// int4, int4 KIVI, int2 KIVI + residual) at one context, one side-by-side table, then the generated texts:
//   quality    perplexity / KL(fp32 cache ‖ format) / same top-1 on real prose (default: the GPL-3 text Debian ships in
//              base-files, /usr/share/common-licenses/GPL-3) with llama-perplexity's protocol at n_ctx = the demo
//              context (eval/perplexity.hpp), prefilled through the cache;
//   retrieval  passkey trials at the demo context (eval/passkey.hpp), when the model's context holds the prompt;
//   greedy     a greedy continuation of the prompt per format, its decode tok/s, and the first step at which it
//              differs from the reference's.
// The first row is the reference (DemoOptions::target: the fp32 cache on the CPU; on CUDA the device's bf16 cache, or
// the CPU's fp32 one); an "fp32" entry of the format list stands for it. On a device, formats of the DEFAULT list that
// the device cannot run are left out and listed with the reason (DemoResult::skipped); a format of an explicit list
// that it cannot run is an UnsupportedError before any work.
#pragma once

#include <string>
#include <vector>

#include "eval/passkey.hpp"
#include <nlohmann/json.hpp>

#include "eval/perplexity.hpp"

namespace flashkv::eval {

/// The demo's formats: fp32, bf16, fp8_e4m3, int8, int4, int4_kivi, int2_kivi+r32 (page_size 32), fitted to head_dim
/// (fit_kv_spec: KIVI G = 32, or 16 where head_dim is 16).
std::vector<KVCacheSpec> demo_formats(int32_t head_dim = 128);
/// The KIVI group size used by demo_formats(head_dim).
int32_t demo_kivi_group(int32_t head_dim);

struct DemoOptions {
  std::string text_path = "/usr/share/common-licenses/GPL-3";  ///< prose for the quality columns
  int32_t context = 2048;        ///< n_ctx of the quality chunk and the passkey budget (capped at the model's context)
  int32_t chunks = 1;            ///< quality chunks of `context` tokens
  std::vector<double> passkey_depths = {0.25, 0.75};  ///< one key each
  std::string prompt;            ///< greedy prompt; "" = BOS (llama2.c) or a fixed chat question (chat models)
  int32_t steps = 0;             ///< greedy tokens per format; 0 = 48 (up to the context end)
  int32_t repeats = 0;           ///< greedy runs per format, best decode time kept; 0 = 3 for tiny models, else 1
  std::vector<KVCacheSpec> formats;  ///< empty = demo_formats(model head_dim)
  EvalTarget target;             ///< device of the formats and the reference (default: the CPU, fp32 reference)
};

struct DemoRow {
  KVCacheSpec spec;
  std::string label;
  double bytes_per_token = 0.0, effective_bits = 0.0, ratio_vs_bf16 = 0.0;
  double prefill_tok_s = 0.0, decode_tok_s = 0.0;
  TextStats quality;                 ///< reference row: PPL only (KLD 0, top-1 1)
  int32_t passkey_ok = 0, passkey_trials = 0;
  std::vector<int32_t> greedy_tokens;
  std::string greedy_text;
  int32_t greedy_divergence = -1;    ///< first generated step that differs from the reference's text; −1 = none
};

struct DemoResult {
  int32_t context = 0;               ///< n_ctx used
  int64_t text_bytes = 0, scored_tokens = 0;
  std::string passkey_note;          ///< why there is no retrieval column, or ""
  std::vector<int32_t> prompt_tokens;
  std::string prompt_text;           ///< what the greedy rows continue (as shown)
  std::vector<DemoRow> rows;         ///< the reference first
  std::vector<SkippedFormat> skipped;  ///< default formats the device cannot run, with the reason
  std::string device = "cpu", reference_device = "cpu";
};

/// The formats the demo runs besides the reference, checked on options.target before any work (see the file
/// comment): `specs` in order, `skipped` the default formats the device cannot run. Throws UnsupportedError.
struct DemoPlan {
  std::vector<KVCacheSpec> specs;
  std::vector<SkippedFormat> skipped;
};
DemoPlan plan_demo(const Model& model, const DemoOptions& options);

/// Runs the demo (see the file comment) on `plan` (nullptr: plan_demo(options)). Progress counts tokens fed to every
/// cache.
DemoResult run_demo(const LoadedModel& lm, const DemoOptions& options, const Progress& progress = {},
                    const DemoPlan* plan = nullptr);

/// The demo table (markdown pipes).
std::string demo_table(const DemoResult& r);
nlohmann::json demo_to_json(const DemoResult& r);

}  // namespace flashkv::eval
