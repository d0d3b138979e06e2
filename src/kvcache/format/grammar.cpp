// kv_cache_dtype grammar, KVFormatSpec names, per-format byte counts (from the format trait, format/traits.hpp) and
// KVCacheConfig validation (see include/flashkv/kvcache.hpp for the grammar and the memory formula).
#include <limits>
#include <string>
#include <utility>

#include "flashkv/kvcache.hpp"
#include "kvcache/format/traits.hpp"

namespace flashkv {

// The trait's format ids are the public enumerators (C ABI values).
static_assert(static_cast<int32_t>(KVFormat::fp32) == static_cast<int32_t>(kv::KVFormatId::fp32) &&
              static_cast<int32_t>(KVFormat::bf16) == static_cast<int32_t>(kv::KVFormatId::bf16) &&
              static_cast<int32_t>(KVFormat::fp16) == static_cast<int32_t>(kv::KVFormatId::fp16) &&
              static_cast<int32_t>(KVFormat::fp8_e4m3) == static_cast<int32_t>(kv::KVFormatId::fp8_e4m3) &&
              static_cast<int32_t>(KVFormat::fp8_e5m2) == static_cast<int32_t>(kv::KVFormatId::fp8_e5m2) &&
              static_cast<int32_t>(KVFormat::int8) == static_cast<int32_t>(kv::KVFormatId::int8) &&
              static_cast<int32_t>(KVFormat::int4) == static_cast<int32_t>(kv::KVFormatId::int4) &&
              static_cast<int32_t>(KVFormat::int4_kivi) == static_cast<int32_t>(kv::KVFormatId::int4_kivi) &&
              static_cast<int32_t>(KVFormat::int2_kivi) == static_cast<int32_t>(kv::KVFormatId::int2_kivi),
              "KVFormat and kv::KVFormatId must agree");

namespace {

constexpr const char* kGrammar =
    "FORMAT or 'k:FORMAT,v:FORMAT' where FORMAT = NAME[_gN] and NAME is one of fp32|float32, bf16|bfloat16|auto, "
    "fp16|float16|half, fp8_e4m3|fp8, fp8_e5m2, fp8_e4m3_dynamic|fp8_per_token_head, fp8_e5m2_dynamic, "
    "int8|int8_per_token_head, int4|int4_per_token_head, int4_kivi, int2_kivi (N: int8/int4 32|64|128|256, "
    "KIVI 16|32|64|128)";

[[noreturn]] void bad(const std::string& s, const std::string& why = "") {
  throw Error("kv_cache_dtype", std::string(kGrammar), "'" + s + "'" + (why.empty() ? "" : " (" + why + ")"));
}

bool parse_name(const std::string& n, KVFormatSpec* spec) {
  struct Entry {
    const char* name;
    KVFormat f;
    bool dynamic;
  };
  static const Entry table[] = {
      {"fp32", KVFormat::fp32, false},           {"float32", KVFormat::fp32, false},
      {"bf16", KVFormat::bf16, false},           {"bfloat16", KVFormat::bf16, false},
      {"auto", KVFormat::bf16, false},           {"fp16", KVFormat::fp16, false},
      {"float16", KVFormat::fp16, false},        {"half", KVFormat::fp16, false},
      {"fp8", KVFormat::fp8_e4m3, false},        {"fp8_e4m3", KVFormat::fp8_e4m3, false},
      {"fp8_e5m2", KVFormat::fp8_e5m2, false},   {"fp8_e4m3_dynamic", KVFormat::fp8_e4m3, true},
      {"fp8_per_token_head", KVFormat::fp8_e4m3, true}, {"fp8_e5m2_dynamic", KVFormat::fp8_e5m2, true},
      {"int8", KVFormat::int8, false},           {"int8_per_token_head", KVFormat::int8, false},
      {"int4", KVFormat::int4, false},           {"int4_per_token_head", KVFormat::int4, false},
      {"int4_kivi", KVFormat::int4_kivi, false}, {"int2_kivi", KVFormat::int2_kivi, false},
  };
  for (const Entry& e : table) {
    if (n == e.name) {
      spec->format = e.f;
      spec->dynamic_scale = e.dynamic;
      spec->group_size = 0;
      return true;
    }
  }
  return false;
}

bool allowed_group(const KVFormatSpec& s, int32_t g) {
  if (s.format == KVFormat::int8 || s.format == KVFormat::int4) return g == 32 || g == 64 || g == 128 || g == 256;
  if (s.is_kivi()) return g == 16 || g == 32 || g == 64 || g == 128;
  return false;
}

int32_t kivi_group(const KVFormatSpec& s) { return s.group_size > 0 ? s.group_size : 32; }

}  // namespace

const char* kv_cache_dtype_grammar() { return kGrammar; }

std::string KVFormatSpec::name() const {
  std::string n;
  switch (format) {
    case KVFormat::fp32: return "fp32";
    case KVFormat::bf16: return "bf16";
    case KVFormat::fp16: return "fp16";
    case KVFormat::fp8_e4m3: return dynamic_scale ? "fp8_e4m3_dynamic" : "fp8_e4m3";
    case KVFormat::fp8_e5m2: return dynamic_scale ? "fp8_e5m2_dynamic" : "fp8_e5m2";
    case KVFormat::int8: n = "int8"; break;
    case KVFormat::int4: n = "int4"; break;
    case KVFormat::int4_kivi: n = "int4_kivi"; break;
    case KVFormat::int2_kivi: n = "int2_kivi"; break;
  }
  if (group_size > 0) n += "_g" + std::to_string(group_size);
  return n;
}

int32_t KVFormatSpec::code_bits() const {
  switch (format) {
    case KVFormat::fp32: return 32;
    case KVFormat::bf16:
    case KVFormat::fp16: return 16;
    case KVFormat::fp8_e4m3:
    case KVFormat::fp8_e5m2:
    case KVFormat::int8: return 8;
    case KVFormat::int4:
    case KVFormat::int4_kivi: return 4;
    case KVFormat::int2_kivi: return 2;
  }
  return 0;
}

KVFormatSpec parse_kv_format(const std::string& s) {
  KVFormatSpec spec;
  if (parse_name(s, &spec)) return spec;
  const auto pos = s.rfind("_g");
  if (pos == std::string::npos || pos + 2 >= s.size()) bad(s, "unknown format name");
  const std::string base = s.substr(0, pos);
  const std::string num = s.substr(pos + 2);
  if (!parse_name(base, &spec)) bad(s, "unknown format name '" + base + "'");
  for (char c : num) {
    if (c < '0' || c > '9') bad(s, "group size '" + num + "' is not a number");
  }
  if (num.size() > 6) bad(s, "group size '" + num + "' too large");
  const int32_t g = std::stoi(num);
  if (!allowed_group(spec, g)) bad(s, "group size " + num + " not allowed for " + base);
  spec.group_size = g;
  return spec;
}

std::pair<KVFormatSpec, KVFormatSpec> parse_kv_cache_dtype(const std::string& s) {
  if (s.rfind("k:", 0) == 0) {
    const auto comma = s.find(",v:");
    if (comma == std::string::npos) bad(s, "explicit form must be 'k:FORMAT,v:FORMAT'");
    const std::string k = s.substr(2, comma - 2);
    const std::string v = s.substr(comma + 3);
    KVFormatSpec ks, vs;
    try {
      ks = parse_kv_format(k);
      vs = parse_kv_format(v);
    } catch (const Error&) {
      bad(s, "bad K or V format");
    }
    return {ks, vs};
  }
  KVFormatSpec f = parse_kv_format(s);
  return {f, f};
}

KVCacheConfig& KVCacheConfig::with_kv_cache_dtype(const std::string& kv_cache_dtype) {
  auto [k, v] = parse_kv_cache_dtype(kv_cache_dtype);
  k_format = k;
  v_format = v;
  return *this;
}

KVFormatBytes kv_format_bytes(const KVFormatSpec& spec, bool is_key, int32_t head_dim, int32_t page_size) {
  const std::string half = is_key ? "k_format" : "v_format";
  const int64_t d = head_dim;
  const int32_t bits = spec.code_bits();
  if (bits == 4 && d % 2 != 0) throw Error("head_dim", "a multiple of 2 for 4-bit formats", std::to_string(d));
  if (bits == 2 && d % 4 != 0) throw Error("head_dim", "a multiple of 4 for 2-bit formats", std::to_string(d));
  const kv::KVHalfFormat f =
      kv::describe(static_cast<kv::KVFormatId>(spec.format), spec.dynamic_scale, spec.group_size, is_key, head_dim);
  if (f.code_bytes == 0 && d > 0) throw Error(half, "a KVFormat value 0..8", std::to_string(static_cast<int>(spec.format)));
  if (f.scaling == kv::KVScaling::token_affine && (f.group <= 0 || d % f.group != 0)) {
    throw Error("head_dim", "divisible by the " + half + " group size " + std::to_string(f.group) + " (" + spec.name() + ")",
                std::to_string(d));
  }
  if (f.scaling == kv::KVScaling::channel_affine && page_size % f.tokens_per_unit != 0) {
    throw Error("page_size", "a multiple of the k_format group size " + std::to_string(f.tokens_per_unit) + " (" +
                                 spec.name() + "; a key group must not straddle a page)",
                std::to_string(page_size));
  }
  KVFormatBytes b;
  b.code_bytes_per_token_head = f.code_bytes;
  b.meta_bytes_per_group = f.meta_bytes_per_unit;
  b.tokens_per_group = f.tokens_per_unit;
  b.meta_bytes_per_page_head = f.meta_bytes_per_page_head(page_size);
  return b;
}

void KVCacheConfig::validate() const {
  if (num_layers < 1) throw Error("num_layers", ">= 1", std::to_string(num_layers));
  if (num_heads_kv < 1) throw Error("num_heads_kv", ">= 1", std::to_string(num_heads_kv));
  if (head_dim < 1 || head_dim > 256) throw Error("head_dim", "1..256", std::to_string(head_dim));
  if (page_size < 16 || page_size > 256 || (page_size & (page_size - 1)) != 0) {
    throw Error("page_size", "a power of two in [16, 256]", std::to_string(page_size));
  }
  if (residual_tokens < 0) throw Error("residual_tokens", ">= 0", std::to_string(residual_tokens));
  if (sink_tokens < 0) throw Error("sink_tokens", ">= 0", std::to_string(sink_tokens));
  if (residual_tokens > (1 << 20)) throw Error("residual_tokens", "<= 1048576", std::to_string(residual_tokens));
  if (sink_tokens > (1 << 20)) throw Error("sink_tokens", "<= 1048576", std::to_string(sink_tokens));
  if (rotation != KVRotation::none && rotation != KVRotation::hadamard) {
    throw Error("rotation", "none (0) or hadamard (1)", std::to_string(static_cast<int>(rotation)));
  }
  for (const KVFormatSpec* f : {&k_format, &v_format}) {
    const int fi = static_cast<int>(f->format);
    if (fi < 0 || fi > static_cast<int>(KVFormat::int2_kivi)) {
      throw Error(f == &k_format ? "k_format" : "v_format", "a KVFormat value 0..8", std::to_string(fi));
    }
    if (f->group_size != 0 && !allowed_group(*f, f->group_size)) {
      throw Error(f == &k_format ? "k_format.group_size" : "v_format.group_size",
                  "0 or an allowed group size for " + KVFormatSpec{f->format, 0, f->dynamic_scale}.name(),
                  std::to_string(f->group_size));
    }
  }
  (void)kv_format_bytes(k_format, true, head_dim, page_size);
  (void)kv_format_bytes(v_format, false, head_dim, page_size);
  if (v_format.is_kivi() && page_size % kivi_group(v_format) != 0) {
    throw Error("page_size", "a multiple of the v_format group size " + std::to_string(kivi_group(v_format)) + " (" +
                                 v_format.name() + "; KIVI quantizes K and V in groups of G tokens)",
                std::to_string(page_size));
  }
  const bool any_quant = k_format.is_quantized() || v_format.is_quantized();
  if (rotation == KVRotation::hadamard && any_quant && (head_dim & (head_dim - 1)) != 0) {
    throw Error("head_dim", "a power of two with rotation = hadamard", std::to_string(head_dim));
  }
  auto check_scales = [&](const std::vector<float>& s, const char* name) {
    if (!s.empty() && s.size() != 1 && s.size() != static_cast<size_t>(num_heads_kv)) {
      throw Error(name, "0, 1 or num_heads_kv (" + std::to_string(num_heads_kv) + ") values", std::to_string(s.size()));
    }
    for (float x : s) {
      if (!(x > 0.0f) || x == std::numeric_limits<float>::infinity()) {
        throw Error(name, "finite values > 0", std::to_string(x));
      }
    }
  };
  check_scales(k_scales, "k_scales");
  check_scales(v_scales, "v_scales");
  if (capacity_pages < 0) throw Error("capacity_pages", ">= 0 (0 = set by capacity_bytes or growing)", std::to_string(capacity_pages));
  if (capacity_bytes < 0) throw Error("capacity_bytes", ">= 0 (0 = set by capacity_pages or growing)", std::to_string(capacity_bytes));
  if (capacity_pages > 0 && capacity_bytes > 0) {
    throw Error("capacity_pages/capacity_bytes", "at most one of them > 0 (both 0: a pool that grows on demand)",
                std::to_string(capacity_pages) + " and " + std::to_string(capacity_bytes));
  }
  if (device != Device::cpu && device != Device::cuda) {
    throw Error("device", "cpu or cuda", "enum value " + std::to_string(static_cast<int>(device)));
  }
  if (device_index < 0) throw Error("device_index", ">= 0", std::to_string(device_index));
}

}  // namespace flashkv
