// Output of flashkv eval / demo: aligned text table, JSON, SVG plot (KL vs effective bits), progress bar with ETA.
#pragma once

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/evaluation.hpp"
#include "eval/passkey.hpp"
#include "eval/perplexity.hpp"
#include "eval/speed.hpp"

namespace flashkv::eval {

/// A markdown-compatible table with columns padded to the widest cell (widths in UTF-8 code points).
std::string markdown_table(const std::vector<std::string>& head, const std::vector<std::vector<std::string>>& cells);

/// Side-by-side table (markdown-compatible pipes): format, bytes/token, bits, ×bf16, decode tok/s, mean KL, top-1,
/// Δll, first divergence. `greedy` adds the demo's free-running greedy divergence column.
std::string format_table(const std::vector<FormatRow>& rows, bool greedy);

/// JSON array of rows (all numbers; KL in nats, bytes per token over all layers, K and V).
nlohmann::json rows_to_json(const std::vector<FormatRow>& rows);

/// Writes an SVG scatter plot of mean KL (log scale) against effective bits per element, one labelled point per
/// format (formats with KL = 0, such as the fp32 reference, are named in a caption instead of drawn). `reference`
/// names the y axis' reference ("fp32 cache", "bf16 cache on cuda:0"). Throws IoError if the file cannot be written.
void write_kl_plot_svg(const std::vector<FormatRow>& rows, const std::string& title, const std::string& path,
                       const std::string& reference = "fp32 cache");

/// Markdown table of a text evaluation (perplexity.hpp): the fp32 reference row, then one row per format with PPL,
/// ΔPPL, mean / 99% / max KLD, RMS Δp, same top-1 (each ± as llama-perplexity prints it), bits and bytes per token.
std::string text_table(const TextResult& r);
nlohmann::json text_to_json(const TextResult& r);

/// Markdown table of a passkey run: success per context and overall, answers identical to fp32's, mean first
/// divergence of the answers that differ.
std::string passkey_table(const PasskeyResult& r);
nlohmann::json passkey_to_json(const PasskeyResult& r);

/// Markdown table of engine speed rows (speed.hpp).
std::string speed_table(const std::vector<SpeedRow>& rows);
nlohmann::json speed_to_json(const std::vector<SpeedRow>& rows);

/// {"device": "cuda:0", "reference": {"device", "kv_cache_dtype", "name"}} of an evaluation target, and the formats a
/// default list left out ([{"label", "kv_cache_dtype", "reason"}]).
nlohmann::json target_to_json(const EvalTarget& target);
nlohmann::json skipped_to_json(const std::vector<SkippedFormat>& skipped);

/// Where and when a result was measured: the exact command line (/proc/self/cmdline), ISO date, CPU model, hardware
/// threads, OpenMP threads, load average (1/5/15 min) at the call, flashkv version.
nlohmann::json run_info();
/// "load average 1.93 2.10 2.30" read now (for progress lines and JSON).
std::string load_average();

/// Progress bar on stderr: "[#####.....]  42% 1234/2900 tokens  ETA 3.1s". Draws only when enabled (the CLI enables
/// it when stderr is a terminal or --progress is given), at most 10 times per second; finish() ends the line.
class ProgressBar {
 public:
  ProgressBar(bool enabled, std::string unit) : enabled_(enabled), unit_(std::move(unit)), start_(clock::now()) {}
  void update(int64_t done, int64_t total);
  void finish();

 private:
  using clock = std::chrono::steady_clock;
  bool enabled_;
  bool drawn_ = false;
  std::string unit_;
  clock::time_point start_, last_{};
};

}  // namespace flashkv::eval
