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

namespace flashkv::eval {

namespace {
bool group_fits(const KVFormatSpec& f, bool is_key, int32_t g, int32_t head_dim, int32_t page_size) {
  if (f.is_kivi()) return page_size % g == 0 && (is_key || head_dim % g == 0);
  return head_dim % g == 0;  // int8 / int4 channel groups
}
/// The largest allowed KIVI group <= 32 (the default) that fits, 0 if none.
int32_t best_kivi_group(bool key, bool value, int32_t head_dim, int32_t page_size) {
  for (int32_t g : {32, 16}) {
    const KVFormatSpec probe{KVFormat::int4_kivi, g, false};
    if ((!key || group_fits(probe, true, g, head_dim, page_size)) &&
        (!value || group_fits(probe, false, g, head_dim, page_size)))
      return g;
  }
  return 0;
}
std::string half_name(const KVFormatSpec& f) { return f.name(); }
}  // namespace

KVCacheSpec fit_kv_spec(const KVCacheSpec& spec, int32_t head_dim) {
  auto [k, v] = parse_kv_cache_dtype(spec.kv_cache_dtype);
  const bool single = spec.kv_cache_dtype.rfind("k:", 0) != 0;
  // Default KIVI group (32) that does not fit this model: the largest allowed group that fits.
  if (single && k.is_kivi() && k.group_size == 0) {
    const int32_t g = best_kivi_group(true, true, head_dim, spec.page_size);
    if (g != 32 && g != 0) k.group_size = v.group_size = g;
  } else {
    if (k.is_kivi() && k.group_size == 0) {
      const int32_t g = best_kivi_group(true, false, head_dim, spec.page_size);
      if (g != 32 && g != 0) k.group_size = g;
    }
    if (v.is_kivi() && v.group_size == 0) {
      const int32_t g = best_kivi_group(false, true, head_dim, spec.page_size);
      if (g != 32 && g != 0) v.group_size = g;
    }
  }
  // An explicit group that does not fit: say which spelling does.
  for (int half = 0; half < 2; ++half) {
    const KVFormatSpec& f = half == 0 ? k : v;
    const int32_t g = f.group_size > 0 ? f.group_size : (f.is_kivi() ? 32 : 0);
    if (g == 0 || group_fits(f, half == 0, g, head_dim, spec.page_size)) continue;
    std::string hint;
    if (f.is_kivi()) {
      const int32_t b = best_kivi_group(half == 0, half == 1, head_dim, spec.page_size);
      KVFormatSpec ok = f;
      ok.group_size = 0;
      hint = b ? "use " + KVFormatSpec{f.format, b, false}.name() + " (or " + ok.name() +
                     ": the largest group that fits is picked)"
               : "no KIVI group fits head_dim " + std::to_string(head_dim) + " and page size " +
                     std::to_string(spec.page_size);
    } else {
      KVFormatSpec ok = f;
      ok.group_size = 0;
      hint = "use " + ok.name() + " (one group per head)";
    }
    throw Error("kv-cache",
                "a group size that divides " + std::string(f.is_kivi() && half == 0 ? "the page size " + std::to_string(spec.page_size)
                                                                                  : "head_dim " + std::to_string(head_dim)) +
                    "; " + hint,
                "'" + spec.kv_cache_dtype + "' (group " + std::to_string(g) + ")");
  }
  KVCacheSpec out = spec;
  out.kv_cache_dtype = single ? half_name(k) : "k:" + half_name(k) + ",v:" + half_name(v);
  return out;
}

}  // namespace flashkv::eval
