// Option parsing shared by the model-evaluation commands (eval, eval passkey, bench engine, demo), on top of the one
// parser for counts and lists (util_parse.hpp): token-count lists, percent lists, --kv-cache format lists fitted to
// the model, the evaluation's device and reference (--device, --reference). Errors are flashkv::Error naming the option (CLI exit 2, one line). Output paths: util_output.hpp.
#pragma once

#include <string>
#include <vector>

#include "cli/util_model_cli.hpp"
#include "eval/evaluation.hpp"

namespace flashkv::cli {

/// "512,2k,8k" → {512, 2048, 8192}: parse_count_list with counts in 1..2^24 tokens.
std::vector<int32_t> parse_token_counts(const std::string& list, const std::string& option);
/// "0,25,50,75,100" → {0, 0.25, ...}: comma-separated percentages in [0, 100] (parse_list's items).
std::vector<double> parse_percents(const std::string& list, const std::string& option);
/// --kv-cache arguments (items separated by commas and/or spaces, parse_kv_format_list): DTYPE[+rN][+sN][+hadamard]
/// [+pN] with the given defaults, fitted to the model's head_dim (eval::fit_kv_spec). No arguments → an empty list
/// (the command's default set); an empty item throws Error('--kv-cache').
std::vector<KVCacheSpec> parse_kv_list(const std::vector<std::string>& args, const KVCacheSpec& defaults,
                                       int32_t head_dim);

/// --reference device|cpu (default device): what eval / eval passkey / demo compare every format with
/// (eval::EvalTarget: the same device's widest cache, or the CPU engine's fp32 cache).
void add_reference_option(CLI::App* sub, std::string& reference);
/// --device (help for the evaluation commands) and --reference.
void add_eval_device_options(CLI::App* sub, DeviceOptions& device, std::string& reference);
/// The target of --device / --reference. Error naming 'device' or 'reference' for a bad value.
eval::EvalTarget eval_target(const DeviceOptions& device, const std::string& reference);
/// The formats a command runs on `target`, checked BEFORE any work: an explicit --kv-cache list (explicit = true) is
/// checked whole (the first format the device cannot run is an UnsupportedError: exit 2, one line); a command's
/// default list keeps what the device runs and returns the rest in `skipped` with the reason.
std::vector<KVCacheSpec> formats_for_target(const Model& model, const std::vector<KVCacheSpec>& specs, bool explicit_list,
                                            const eval::EvalTarget& target, std::vector<eval::SkippedFormat>& skipped);
/// "device: cuda:0 (...); reference = bf16 cache on cuda:0 (...)" then one line per skipped format (stdout).
void print_target(const eval::EvalTarget& target, const std::vector<eval::SkippedFormat>& skipped);
/// "fp32 cache" on a CPU-only target (the wording of the CPU commands), else EvalTarget::reference_name().
std::string reference_text(const eval::EvalTarget& target);

}  // namespace flashkv::cli
