#include "cli/util_parse.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <utility>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "flashkv/error.hpp"

namespace flashkv::cli {
namespace {

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

std::string trim(const std::string& s) {
  std::size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

std::string range_text(int64_t min, int64_t max) {
  if (max == std::numeric_limits<int64_t>::max()) return ">= " + std::to_string(min);
  return "in " + std::to_string(min) + ".." + std::to_string(max);
}

/// Splits at commas; every item must be non-empty after trimming.
std::vector<std::string> split_items(const std::string& s, const std::string& option, const char* what) {
  std::vector<std::string> items;
  if (trim(s).empty()) throw Error(option, std::string("a comma-separated list of ") + what, "an empty list");
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = s.find(',', start);
    const std::string item = trim(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (item.empty()) {
      throw Error(option, std::string("a comma-separated list of ") + what + " without empty items",
                  in_quotes(s) + " (item " + std::to_string(items.size() + 1) + " is empty)");
    }
    items.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return items;
}

}  // namespace

int64_t parse_count(const std::string& s_in, const std::string& option, int64_t min, int64_t max) {
  const std::string s = trim(s_in);
  const std::string expected = "a count like 4096, 4k or 128k (k = 1024, m = 1048576), " + range_text(min, max);
  int64_t mult = 1;
  std::string digits = s;
  if (!s.empty()) {
    const char last = static_cast<char>(std::tolower(static_cast<unsigned char>(s.back())));
    if (last == 'k' || last == 'm') {
      mult = last == 'k' ? 1024 : 1048576;
      digits = s.substr(0, s.size() - 1);
    }
  }
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) {
    throw Error(option, expected, in_quotes(s_in));
  }
  int64_t v = 0;
  for (char c : digits) {
    const int64_t d = c - '0';
    if (v > (std::numeric_limits<int64_t>::max() - d) / 10) throw Error(option, expected, in_quotes(s_in) + " (too large)");
    v = v * 10 + d;
  }
  if (v > std::numeric_limits<int64_t>::max() / mult) throw Error(option, expected, in_quotes(s_in) + " (too large)");
  v *= mult;
  if (v < min || v > max) throw Error(option, expected, in_quotes(s_in) + (mult > 1 ? " = " + std::to_string(v) : ""));
  return v;
}

std::vector<int64_t> parse_count_list(const std::string& s, const std::string& option, int64_t min, int64_t max) {
  std::vector<int64_t> out;
  for (const std::string& item : split_items(s, option, "counts")) out.push_back(parse_count(item, option, min, max));
  return out;
}

int64_t parse_bytes(const std::string& s, const std::string& option) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (const std::exception&) {
    throw Error(option, "a size like 141GB, 16GiB or 123456 (bytes)", in_quotes(s));
  }
  const std::string unit = s.substr(pos);
  double mult = 0;
  const std::pair<const char*, double> units[] = {{"", 1},       {"B", 1},          {"KB", 1e3},      {"MB", 1e6},
                                                  {"GB", 1e9},   {"TB", 1e12},      {"KiB", 1024.0},  {"MiB", 1048576.0},
                                                  {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  for (const auto& [u, m] : units) {
    if (unit == u) mult = m;
  }
  if (mult == 0 || !(v >= 0) || !std::isfinite(v)) {
    throw Error(option, "a size like 141GB, 16GiB or 123456 (units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)", in_quotes(s));
  }
  if (v * mult >= 9.2e18) throw Error(option, "a size below 8 EiB (byte counts are int64)", in_quotes(s));
  return static_cast<int64_t>(std::llround(v * mult));
}

std::vector<std::string> parse_list(const std::string& s, const std::string& option) {
  return split_items(s, option, "names");
}

std::vector<std::string> parse_kv_format_list(const std::vector<std::string>& args, const std::string& option) {
  std::vector<std::string> words;
  std::string all;
  for (const std::string& a : args) all += (all.empty() ? "" : " ") + a;
  if (trim(all).empty()) throw Error(option, "a list of kv_cache_dtype formats, e.g. bf16,int8,k:int8,v:int4", "an empty list");
  // Words separated by commas and/or spaces; a comma with no word before it (leading, doubled) or after it
  // (trailing) is an empty item.
  auto empty_item = [&] {
    return Error(option, "a list of kv_cache_dtype formats without empty items",
                 in_quotes(all) + " (item " + std::to_string(words.size() + 1) + " is empty)");
  };
  std::string cur;
  bool pending_comma = false;  // a comma since the last word
  auto push = [&] {
    if (cur.empty()) return;
    words.push_back(cur);
    cur.clear();
    pending_comma = false;
  };
  for (char c : all) {
    if (c == ',') {
      push();
      if (words.empty() || pending_comma) throw empty_item();
      pending_comma = true;
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      push();
    } else {
      cur += c;
    }
  }
  push();
  if (pending_comma) throw empty_item();
  // "k:A" followed by "v:B" is one K/V pair.
  std::vector<std::string> items;
  for (std::size_t i = 0; i < words.size(); ++i) {
    if (words[i].rfind("k:", 0) == 0 && i + 1 < words.size() && words[i + 1].rfind("v:", 0) == 0) {
      items.push_back(words[i] + "," + words[i + 1]);
      ++i;
    } else {
      items.push_back(words[i]);
    }
  }
  return items;
}

CLI::Option* add_count_list_option(CLI::App* app, const std::string& name, std::vector<int64_t>& target,
                                   const std::string& help, int64_t min, int64_t max) {
  std::string shown;
  for (int64_t v : target) shown += (shown.empty() ? "" : ",") + std::to_string(v);
  CLI::Option* o = app->add_option_function<std::string>(
      name, [&target, name, min, max](const std::string& s) { target = parse_count_list(s, name, min, max); }, help);
  o->default_str(shown);
  return o;
}

CLI::Option* add_nonempty_option(CLI::App* app, const std::string& name, std::string& target, const std::string& help) {
  return app->add_option_function<std::string>(
      name,
      [&target, name](const std::string& s) {
        if (trim(s).empty()) throw Error(name, "a non-empty value (leave the option out for the default)", "''");
        target = s;
      },
      help);
}

int resolve_threads(int64_t requested, const std::string& option) {
  if (requested < 0 || requested > 4096) {
    throw Error(option, "0 (all cores) or a thread count 1..4096", std::to_string(requested));
  }
#if defined(_OPENMP)
  return requested > 0 ? static_cast<int>(requested) : omp_get_max_threads();
#else
  return 1;
#endif
}

}  // namespace flashkv::cli
