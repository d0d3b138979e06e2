// The KV memory formula (kv_memory_estimate) and KVMemoryReport::to_string. The formula mirrors exactly what
// PagedKVCache allocates (tested against memory_report()):
//   per sequence and layer: n_q = round_down(max(0, T − S − R), Gq) quantized tokens,
//     codes = n_q · H · (code_k + code_v), metadata = H · (n_q / tpg_k · meta_group_k + n_q / tpg_v · meta_group_v)
//   pages per sequence = ceil(n_q / page_size); page_bytes = L · H · (page_size·(code_k + code_v) + meta_k + meta_v)
//   residual (bf16 sinks + ring) per sequence = 2 · L · H · d · 2 B · (S + R + Gq − 1)
//   slack = pages · page_bytes − codes − metadata
#include <cstdio>
#include <string>

#include "kvcache/cache/cache_impl.hpp"

namespace flashkv {

KVMemoryReport kv_memory_estimate(const KVCacheConfig& config, int64_t batch, int64_t tokens) {
  if (batch < 0) throw Error("batch", ">= 0", std::to_string(batch));
  if (tokens < 0) throw Error("tokens", ">= 0", std::to_string(tokens));
  KVCacheConfig c = config;
  c.capacity_pages = 1;
  c.capacity_bytes = 0;
  c.validate();
  const int64_t L = c.num_layers, H = c.num_heads_kv, d = c.head_dim, P = c.page_size;
  const KVFormatBytes kb = kv_format_bytes(c.k_format, true, c.head_dim, c.page_size);
  const KVFormatBytes vb = kv_format_bytes(c.v_format, false, c.head_dim, c.page_size);
  int64_t gq = 1;
  if (c.k_format.is_kivi()) gq = kb.tokens_per_group;
  if (c.v_format.is_kivi()) gq = std::max<int64_t>(gq, c.v_format.group_size > 0 ? c.v_format.group_size : 32);
  const int64_t ring = c.residual_tokens + gq - 1;
  int64_t nq = tokens - c.sink_tokens - c.residual_tokens;
  nq = nq <= 0 ? 0 : nq / gq * gq;
  const int64_t pages_per_seq = (nq + P - 1) / P;

  KVMemoryReport r;
  r.page_bytes = L * H * (P * (kb.code_bytes_per_token_head + vb.code_bytes_per_token_head) +
                          kb.meta_bytes_per_page_head + vb.meta_bytes_per_page_head);
  r.num_sequences = batch;
  r.token_layers = batch * L * tokens;
  r.num_tokens = batch * tokens;
  r.pages_used = batch * pages_per_seq;
  r.pages_total = r.pages_used;
  r.pages_free = 0;
  r.pool_bytes = r.pages_total * r.page_bytes;
  r.code_bytes = batch * L * nq * H * (kb.code_bytes_per_token_head + vb.code_bytes_per_token_head);
  r.metadata_bytes = batch * L * H *
                     (nq / kb.tokens_per_group * kb.meta_bytes_per_group + nq / vb.tokens_per_group * vb.meta_bytes_per_group);
  r.residual_bytes = batch * L * 2 * H * d * 2 * (c.sink_tokens + ring);
  r.slack_bytes = r.pages_used * r.page_bytes - r.code_bytes - r.metadata_bytes;
  r.total_bytes = r.code_bytes + r.metadata_bytes + r.residual_bytes + r.slack_bytes;
  if (r.token_layers > 0) {
    r.bits_per_element = static_cast<double>(r.total_bytes) * 8.0 / (2.0 * static_cast<double>(r.token_layers) * H * d);
    r.ratio_vs_bf16 = 16.0 / r.bits_per_element;
  }
  return r;
}

std::string KVMemoryReport::to_string() const {
  char buf[1024];
  std::snprintf(buf, sizeof(buf),
                "sequences %lld, tokens %lld\n"
                "codes     %lld B\nmetadata  %lld B\nresidual  %lld B\nslack     %lld B\ntotal     %lld B\n"
                "pages     %lld used / %lld total (%lld B each), pool %lld B\n"
                "bits/element %.4f, ratio vs bf16 %.3fx\n",
                static_cast<long long>(num_sequences), static_cast<long long>(num_tokens),
                static_cast<long long>(code_bytes), static_cast<long long>(metadata_bytes),
                static_cast<long long>(residual_bytes), static_cast<long long>(slack_bytes),
                static_cast<long long>(total_bytes), static_cast<long long>(pages_used),
                static_cast<long long>(pages_total), static_cast<long long>(page_bytes),
                static_cast<long long>(pool_bytes), bits_per_element, ratio_vs_bf16);
  return buf;
}

}  // namespace flashkv
