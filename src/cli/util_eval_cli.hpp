// Option parsing shared by the model-evaluation commands (eval, eval passkey, bench engine, demo), on top of the one
// parser for counts and lists (util_parse.hpp): token-count lists, percent lists, --kv-cache format lists fitted to
// the model. Errors are flashkv::Error naming the option (CLI exit 2, one line). Output paths: util_output.hpp.
#pragma once

#include <string>
#include <vector>

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

}  // namespace flashkv::cli
