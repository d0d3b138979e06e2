// Option parsing shared by the model-evaluation commands (eval, eval passkey, bench engine, demo): token-count lists,
// percent lists, --kv-cache format lists, early output-path checks. Errors are flashkv::Error naming the option
// (CLI exit 2, one line).
#pragma once

#include <string>
#include <vector>

#include "eval/evaluation.hpp"

namespace flashkv::cli {

/// "512,2k,8k" → {512, 2048, 8192}: comma-separated positive counts, optional k/K suffix (× 1024). Empty items,
/// non-numbers and values above 2^24 throw Error(option, ...).
std::vector<int32_t> parse_token_counts(const std::string& list, const std::string& option);
/// "0,25,50,75,100" → {0, 0.25, ...}: comma-separated percentages in [0, 100].
std::vector<double> parse_percents(const std::string& list, const std::string& option);
/// --kv-cache items (each may itself be a space-separated list): DTYPE[+rN][+sN][+hadamard][+pN] with the given
/// defaults, fitted to the model's head_dim (eval::fit_kv_spec). An empty item throws Error('kv-cache').
std::vector<KVCacheSpec> parse_kv_list(const std::vector<std::string>& items, const KVCacheSpec& defaults,
                                       int32_t head_dim);
/// Throws Error(option, "a writable file", path) unless `path` is "" / "-" or a file that can be created or
/// overwritten (checked before any work; an existing file is left as it is).
void check_output_file(const std::string& path, const std::string& option);
/// Same for a directory that will hold output files (created if missing).
void check_output_dir(const std::string& path, const std::string& option);

}  // namespace flashkv::cli
