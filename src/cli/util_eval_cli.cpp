#include "cli/util_eval_cli.hpp"

#include "cli/util_parse.hpp"
#include "flashkv/error.hpp"

namespace flashkv::cli {

std::vector<int32_t> parse_token_counts(const std::string& list, const std::string& option) {
  std::vector<int32_t> out;
  for (int64_t v : parse_count_list(list, option, 1, int64_t{1} << 24)) out.push_back(static_cast<int32_t>(v));
  return out;
}

std::vector<double> parse_percents(const std::string& list, const std::string& option) {
  const char* what = "comma-separated percentages in [0, 100] like 0,25,50,75,100";
  std::vector<double> out;
  for (const std::string& s : parse_list(list, option)) {
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (end == s.c_str() || *end != '\0' || !(v >= 0.0 && v <= 100.0)) throw Error(option, what, "'" + s + "'");
    out.push_back(v / 100.0);
  }
  return out;
}

std::vector<KVCacheSpec> parse_kv_list(const std::vector<std::string>& args, const KVCacheSpec& defaults,
                                       int32_t head_dim) {
  std::vector<KVCacheSpec> specs;
  if (args.empty()) return specs;
  for (const std::string& w : parse_kv_format_list(args, "--kv-cache"))
    specs.push_back(eval::fit_kv_spec(eval::parse_format_item(w, defaults), head_dim));
  return specs;
}

}  // namespace flashkv::cli
