// Parsing of --kv-cache list items: "DTYPE[+rN][+sN][+hadamard][+pN]".
#include <cstdlib>

#include "eval/evaluation.hpp"
#include "flashkv/error.hpp"
#include "flashkv/kvcache.hpp"

namespace flashkv::eval {

namespace {
int32_t parse_count(const std::string& item, const std::string& s) {
  if (s.empty() || s.size() > 6 || s.find_first_not_of("0123456789") != std::string::npos)
    throw Error("kv-cache", "DTYPE[+rN][+sN][+hadamard][+pN] with N a non-negative integer", "'" + item + "'");
  return std::atoi(s.c_str());
}
}  // namespace

KVCacheSpec parse_format_item(const std::string& item, const KVCacheSpec& defaults) {
  KVCacheSpec spec = defaults;
  std::size_t plus = item.find('+');
  spec.kv_cache_dtype = item.substr(0, plus);
  parse_kv_cache_dtype(spec.kv_cache_dtype);  // throws Error('kv_cache_dtype', grammar, s)
  while (plus != std::string::npos) {
    const std::size_t next = item.find('+', plus + 1);
    const std::string opt = item.substr(plus + 1, next == std::string::npos ? std::string::npos : next - plus - 1);
    if (opt == "hadamard") spec.rotate = true;
    else if (!opt.empty() && opt[0] == 'r') spec.residual = parse_count(item, opt.substr(1));
    else if (!opt.empty() && opt[0] == 's') spec.sinks = parse_count(item, opt.substr(1));
    else if (!opt.empty() && opt[0] == 'p') spec.page_size = parse_count(item, opt.substr(1));
    else throw Error("kv-cache", "DTYPE[+rN][+sN][+hadamard][+pN]", "'" + item + "' (unknown option '" + opt + "')");
    plus = next;
  }
  return spec;
}

}  // namespace flashkv::eval

namespace flashkv::eval {

KVCacheSpec spec_from_options(const std::string& kv_cache, const std::string& kv_k, const std::string& kv_v,
                              int32_t residual, int32_t sinks, const std::string& rotate, int32_t page_size) {
  KVCacheSpec spec;
  if (!kv_k.empty() || !kv_v.empty()) {
    if (kv_k.empty() || kv_v.empty())
      throw Error("kv-k/kv-v", "both --kv-k and --kv-v", "only --" + std::string(kv_k.empty() ? "kv-v" : "kv-k"));
    if (!kv_cache.empty()) throw Error("kv-cache", "either --kv-cache or --kv-k/--kv-v", "both");
    parse_kv_format(kv_k);
    parse_kv_format(kv_v);
    spec.kv_cache_dtype = "k:" + kv_k + ",v:" + kv_v;
  } else {
    spec.kv_cache_dtype = kv_cache.empty() ? "fp32" : kv_cache;
    parse_kv_cache_dtype(spec.kv_cache_dtype);
  }
  if (residual < 0) throw Error("residual", ">= 0 tokens", std::to_string(residual));
  if (sinks < 0) throw Error("sinks", ">= 0 tokens", std::to_string(sinks));
  if (rotate != "none" && rotate != "hadamard") throw Error("rotate", "'none' or 'hadamard'", "'" + rotate + "'");
  spec.residual = residual;
  spec.sinks = sinks;
  spec.rotate = rotate == "hadamard";
  spec.page_size = page_size;
  return spec;
}

}  // namespace flashkv::eval
