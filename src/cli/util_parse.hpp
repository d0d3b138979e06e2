// The one parser for counts, lists and thread counts of every `flashkv` command (issue 10 item 13), so that the same
// spelling means the same thing everywhere:
//   * counts (token counts, sequence lengths, head dims, steps): decimal digits with an optional k/K (× 1024) or
//     m/M (× 1048576) suffix — "4096", "4k", "128k", "1m"; range-checked, overflow-checked;
//   * lists: comma-separated, no empty list and no empty item ("64,,128", ",int8", "" are errors naming the item);
//   * KV-format lists (--kv-cache, --formats): items separated by commas or spaces, "k:A,v:B" is one item;
//   * --threads N: N >= 1 threads exactly; 0 = all cores (the OpenMP default: OMP_NUM_THREADS if set, else every
//     hardware thread); negative is an error.
// Every error is a flashkv::Error naming the option with expected vs actual: main() prints one line and exits 2.
#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace flashkv::cli {

/// "4096", "4k" (4096), "128K", "1m" (1048576) -> the count, which must lie in [min, max].
int64_t parse_count(const std::string& s, const std::string& option, int64_t min = 0,
                    int64_t max = std::numeric_limits<int64_t>::max());

/// A comma-separated list of counts (each as parse_count, in [min, max]); at least one item.
std::vector<int64_t> parse_count_list(const std::string& s, const std::string& option, int64_t min = 0,
                                      int64_t max = std::numeric_limits<int64_t>::max());

/// "141GB", "16GiB", "1.5TB", "123456" -> bytes (decimal units: 1 GB = 10^9 B; binary: 1 GiB = 2^30 B; units B, KB,
/// MB, GB, TB, KiB, MiB, GiB, TiB); non-negative, below 8 EiB.
int64_t parse_bytes(const std::string& s, const std::string& option);

/// A comma-separated list of non-empty words (surrounding spaces trimmed); at least one item.
std::vector<std::string> parse_list(const std::string& s, const std::string& option);

/// kv_cache_dtype items from one or more arguments: separated by commas and/or spaces, "k:A,v:B" kept as one item
/// (also "k:A v:B"); at least one item, no empty item.
std::vector<std::string> parse_kv_format_list(const std::vector<std::string>& args, const std::string& option);

/// --threads: n >= 1 -> n; 0 -> all cores (omp_get_max_threads()); negative -> Error.
int resolve_threads(int64_t requested, const std::string& option = "--threads");

// ---- CLI11 glue: options parsed by the functions above while the command line is read ---------------------------

/// An option taking one count (parse_count in [min, max]) into `target` (any integer type); the default shown in
/// --help is target's current value.
template <class Int>
CLI::Option* add_count_option(CLI::App* app, const std::string& name, Int& target, const std::string& help,
                              int64_t min, int64_t max) {
  static_assert(std::is_integral_v<Int>);
  max = std::min<int64_t>(max, static_cast<int64_t>(std::numeric_limits<Int>::max()));
  CLI::Option* o = app->add_option_function<std::string>(
      name, [&target, name, min, max](const std::string& s) { target = static_cast<Int>(parse_count(s, name, min, max)); },
      help);
  o->default_str(std::to_string(target));
  return o;
}

/// An option taking a comma-separated list of counts (parse_count_list) into `target`.
CLI::Option* add_count_list_option(CLI::App* app, const std::string& name, std::vector<int64_t>& target,
                                   const std::string& help, int64_t min, int64_t max);

/// An option taking one non-empty string (an explicitly empty value, e.g. --kv-cache "", is an error, never the
/// default).
CLI::Option* add_nonempty_option(CLI::App* app, const std::string& name, std::string& target, const std::string& help);

/// The help text of a --threads option (one wording everywhere).
inline constexpr const char* kThreadsHelp = "CPU threads (0 = all cores: OMP_NUM_THREADS if set, else every hardware thread)";

}  // namespace flashkv::cli
