#include "cli/util_eval_cli.hpp"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "flashkv/error.hpp"

namespace flashkv::cli {

namespace {
std::vector<std::string> split_commas(const std::string& list, const std::string& option, const char* what) {
  std::vector<std::string> out;
  std::string item;
  std::stringstream ss(list);
  while (std::getline(ss, item, ',')) out.push_back(item);
  if (!list.empty() && list.back() == ',') out.push_back("");
  if (out.empty()) throw Error(option, what, "''");
  for (const auto& s : out)
    if (s.empty()) throw Error(option, std::string(what) + " (no empty items)", "'" + list + "'");
  return out;
}
}  // namespace

std::vector<int32_t> parse_token_counts(const std::string& list, const std::string& option) {
  const char* what = "comma-separated token counts like 512,2k,8k";
  std::vector<int32_t> out;
  for (const std::string& s : split_commas(list, option, what)) {
    std::string num = s;
    int64_t mult = 1;
    if (num.back() == 'k' || num.back() == 'K') mult = 1024, num.pop_back();
    if (num.empty() || num.size() > 8 || num.find_first_not_of("0123456789") != std::string::npos)
      throw Error(option, what, "'" + s + "'");
    const int64_t v = std::stoll(num) * mult;
    if (v < 1 || v > (int64_t{1} << 24)) throw Error(option, "counts in 1..16M", "'" + s + "'");
    out.push_back(static_cast<int32_t>(v));
  }
  return out;
}

std::vector<double> parse_percents(const std::string& list, const std::string& option) {
  const char* what = "comma-separated percentages in [0, 100] like 0,25,50,75,100";
  std::vector<double> out;
  for (const std::string& s : split_commas(list, option, what)) {
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (end == s.c_str() || *end != '\0' || !(v >= 0.0 && v <= 100.0)) throw Error(option, what, "'" + s + "'");
    out.push_back(v / 100.0);
  }
  return out;
}

std::vector<KVCacheSpec> parse_kv_list(const std::vector<std::string>& items, const KVCacheSpec& defaults,
                                       int32_t head_dim) {
  std::vector<KVCacheSpec> specs;
  for (const auto& item : items) {
    std::istringstream ss(item);  // also accept one quoted, space-separated list
    std::string w;
    int n = 0;
    while (ss >> w) {
      specs.push_back(eval::fit_kv_spec(eval::parse_format_item(w, defaults), head_dim));
      ++n;
    }
    if (n == 0) throw Error("kv-cache", "a KV format such as int8 or int2_kivi+r128 (no empty items)", "''");
  }
  return specs;
}

void check_output_file(const std::string& path, const std::string& option) {
  if (path.empty() || path == "-") return;
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw Error(option, "a file path", "'" + path + "' (a directory)");
  const bool existed = fs::exists(path, ec);
  {
    std::ofstream f(path, std::ios::app);
    if (!f) throw Error(option, "a writable file path", "'" + path + "'");
  }
  if (!existed) fs::remove(path, ec);
}

void check_output_dir(const std::string& path, const std::string& option) {
  if (path.empty()) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(path, ec);
  if (!fs::is_directory(path, ec) || ::access(path.c_str(), W_OK) != 0)
    throw Error(option, "a writable directory", "'" + path + "'");
}

}  // namespace flashkv::cli
