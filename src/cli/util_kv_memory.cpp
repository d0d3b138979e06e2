#include "cli/util_kv_memory.hpp"

#include <fmt/format.h>

#include "flashkv/kvcache.hpp"

namespace flashkv::cli {

int64_t bf16_reference_bytes(int32_t layers, int32_t kv_heads, int32_t head_dim, int32_t page_size, int64_t batch,
                             int64_t tokens) {
  KVCacheConfig bf;
  bf.num_layers = layers;
  bf.num_heads_kv = kv_heads;
  bf.head_dim = head_dim;
  bf.page_size = page_size;
  bf.with_kv_cache_dtype("bf16");
  return kv_memory_estimate(bf, batch, tokens).total_bytes;
}

std::string vs_bf16_text(double bf16_bytes, double bytes) {
  if (!(bytes > 0) || !(bf16_bytes > 0)) return "n/a vs bf16";
  const double r = bf16_bytes / bytes;
  const std::string s = fmt::format("{:.2f}", r >= 1 ? r : 1.0 / r);
  if (s == "1.00") return "the same as bf16";
  return s + (r > 1 ? "x smaller than bf16" : "x larger than bf16");
}

}  // namespace flashkv::cli
