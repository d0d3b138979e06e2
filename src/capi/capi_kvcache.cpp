// C ABI of the quantized paged KV cache (include/flashkv/flashkv_kvcache.h over include/flashkv/kvcache.hpp).
// Every call runs inside capi::guard (exceptions → status + flashkv_last_error()); structs honor struct_size.
#include <cstddef>
#include <span>
#include <string>
#include <utility>

#include "capi/capi_common.hpp"
#include "flashkv/flashkv_kvcache.h"
#include "flashkv/kvcache.hpp"

struct flashkv_kv_cache {
  flashkv::PagedKVCache cache;
  explicit flashkv_kv_cache(const flashkv::KVCacheConfig& c) : cache(c) {}
  explicit flashkv_kv_cache(flashkv::PagedKVCache&& c) : cache(std::move(c)) {}
};

namespace flashkv::capi {
namespace {

KVCacheConfig to_config(const flashkv_kv_cache_config* c) {
  if (c == nullptr) throw Error("cfg", "a flashkv_kv_cache_config", "NULL pointer");
  check_struct_size(c->struct_size, offsetof(flashkv_kv_cache_config, capacity_bytes) + sizeof(int64_t),
                    sizeof(flashkv_kv_cache_config), "cfg");
  KVCacheConfig k;
  k.num_layers = c->num_layers;
  k.num_heads_kv = c->num_heads_kv;
  k.head_dim = c->head_dim;
  k.with_kv_cache_dtype(c->kv_cache_dtype ? c->kv_cache_dtype : "bf16");
  k.page_size = c->page_size;
  k.residual_tokens = c->residual_tokens;
  k.sink_tokens = c->sink_tokens;
  if (c->rotation != FLASHKV_KV_ROTATION_NONE && c->rotation != FLASHKV_KV_ROTATION_HADAMARD) {
    throw Error("cfg.rotation", "FLASHKV_KV_ROTATION_NONE (0) or FLASHKV_KV_ROTATION_HADAMARD (1)",
                std::to_string(c->rotation));
  }
  k.rotation = static_cast<KVRotation>(c->rotation);
  k.rotation_seed = c->rotation_seed;
  if (c->num_k_scales < 0 || (c->num_k_scales > 0 && c->k_scales == nullptr)) {
    throw Error("cfg.k_scales", "num_k_scales >= 0 values at a non-NULL pointer", std::to_string(c->num_k_scales));
  }
  if (c->num_v_scales < 0 || (c->num_v_scales > 0 && c->v_scales == nullptr)) {
    throw Error("cfg.v_scales", "num_v_scales >= 0 values at a non-NULL pointer", std::to_string(c->num_v_scales));
  }
  k.k_scales.assign(c->k_scales, c->k_scales + c->num_k_scales);
  k.v_scales.assign(c->v_scales, c->v_scales + c->num_v_scales);
  k.capacity_pages = c->capacity_pages;
  k.capacity_bytes = c->capacity_bytes;
  using T = flashkv_kv_cache_config;
  if (FLASHKV_COVERS(T, c, device)) {
    if (c->device != FLASHKV_DEVICE_CPU && c->device != FLASHKV_DEVICE_CUDA) {
      throw Error("cfg.device", "FLASHKV_DEVICE_CPU (0) or FLASHKV_DEVICE_CUDA (1)", std::to_string(c->device));
    }
    k.device = static_cast<Device>(c->device);
  }
  if (FLASHKV_COVERS(T, c, device_index)) k.device_index = c->device_index;
  return k;
}

KVAttentionOptions to_kv_options(const flashkv_kv_attention_options* c) {
  KVAttentionOptions o;
  if (c == nullptr) return o;
  check_struct_size(c->struct_size, offsetof(flashkv_kv_attention_options, has_softmax_scale),
                    sizeof(flashkv_kv_attention_options), "opts");
  using T = flashkv_kv_attention_options;
  if (FLASHKV_COVERS(T, c, softmax_scale) && c->has_softmax_scale != 0) o.softmax_scale = c->softmax_scale;
  if (FLASHKV_COVERS(T, c, causal)) o.causal = c->causal != 0;
  if (FLASHKV_COVERS(T, c, window_size_left)) o.window_size_left = c->window_size_left;
  if (FLASHKV_COVERS(T, c, softcap)) o.softcap = c->softcap;
  if (FLASHKV_COVERS(T, c, num_splits)) o.num_splits = c->num_splits;
  if (FLASHKV_COVERS(T, c, num_threads)) o.num_threads = c->num_threads;
  return o;
}

void fill_report(const KVMemoryReport& r, flashkv_kv_memory_report* out) {
  if (out == nullptr) throw Error("out", "a flashkv_kv_memory_report", "NULL pointer");
  check_struct_size(out->struct_size, offsetof(flashkv_kv_memory_report, ratio_vs_bf16) + sizeof(double),
                    sizeof(flashkv_kv_memory_report), "out");
  out->num_sequences = r.num_sequences;
  out->num_tokens = r.num_tokens;
  out->token_layers = r.token_layers;
  out->page_bytes = r.page_bytes;
  out->pages_total = r.pages_total;
  out->pages_used = r.pages_used;
  out->pages_free = r.pages_free;
  out->code_bytes = r.code_bytes;
  out->metadata_bytes = r.metadata_bytes;
  out->residual_bytes = r.residual_bytes;
  out->slack_bytes = r.slack_bytes;
  out->total_bytes = r.total_bytes;
  out->pool_bytes = r.pool_bytes;
  out->bits_per_element = r.bits_per_element;
  out->ratio_vs_bf16 = r.ratio_vs_bf16;
}

const PagedKVCache& get(const flashkv_kv_cache* c) {
  if (c == nullptr) throw Error("cache", "a flashkv_kv_cache from flashkv_kv_cache_create", "NULL pointer");
  return c->cache;
}
PagedKVCache& get(flashkv_kv_cache* c) {
  if (c == nullptr) throw Error("cache", "a flashkv_kv_cache from flashkv_kv_cache_create", "NULL pointer");
  return c->cache;
}

}  // namespace
}  // namespace flashkv::capi

using flashkv::capi::guard;

extern "C" {

flashkv_status flashkv_kv_cache_config_default(flashkv_kv_cache_config* cfg) {
  return guard([&] {
    if (cfg == nullptr) throw flashkv::Error("cfg", "a flashkv_kv_cache_config", "NULL pointer");
    *cfg = flashkv_kv_cache_config{};
    cfg->struct_size = sizeof(flashkv_kv_cache_config);
    cfg->num_layers = 1;
    cfg->num_heads_kv = 1;
    cfg->head_dim = 128;
    cfg->kv_cache_dtype = "bf16";
    cfg->page_size = 16;
  });
}

flashkv_status flashkv_kv_attention_options_default(flashkv_kv_attention_options* opts) {
  return guard([&] {
    if (opts == nullptr) throw flashkv::Error("opts", "a flashkv_kv_attention_options", "NULL pointer");
    *opts = flashkv_kv_attention_options{};
    opts->struct_size = sizeof(flashkv_kv_attention_options);
    opts->causal = 1;
    opts->window_size_left = -1;
  });
}

flashkv_status flashkv_kv_cache_create(const flashkv_kv_cache_config* cfg, flashkv_kv_cache** out) {
  return guard([&] {
    if (out == nullptr) throw flashkv::Error("out", "a flashkv_kv_cache* to fill", "NULL pointer");
    *out = nullptr;
    *out = new flashkv_kv_cache(flashkv::capi::to_config(cfg));
  });
}

flashkv_status flashkv_kv_cache_free(flashkv_kv_cache* cache) {
  return guard([&] { delete cache; });
}

flashkv_status flashkv_kv_cache_to(const flashkv_kv_cache* cache, int32_t device, int32_t device_index,
                                   flashkv_kv_cache** out) {
  return guard([&] {
    if (out == nullptr) throw flashkv::Error("out", "a flashkv_kv_cache* to fill", "NULL pointer");
    *out = nullptr;
    if (device != FLASHKV_DEVICE_CPU && device != FLASHKV_DEVICE_CUDA) {
      throw flashkv::Error("device", "FLASHKV_DEVICE_CPU (0) or FLASHKV_DEVICE_CUDA (1)", std::to_string(device));
    }
    *out = new flashkv_kv_cache(flashkv::capi::get(cache).to(static_cast<flashkv::Device>(device), device_index));
  });
}

flashkv_status flashkv_kv_cache_add_sequence(flashkv_kv_cache* cache, int64_t seq_id) {
  return guard([&] { flashkv::capi::get(cache).add_sequence(seq_id); });
}

flashkv_status flashkv_kv_cache_remove_sequence(flashkv_kv_cache* cache, int64_t seq_id) {
  return guard([&] { flashkv::capi::get(cache).remove_sequence(seq_id); });
}

flashkv_status flashkv_kv_cache_seq_len(const flashkv_kv_cache* cache, int64_t seq_id, int32_t layer, int64_t* out) {
  return guard([&] {
    if (out == nullptr) throw flashkv::Error("out", "an int64_t* to fill", "NULL pointer");
    *out = flashkv::capi::get(cache).seq_len(seq_id, layer);
  });
}

flashkv_status flashkv_kv_cache_append(flashkv_kv_cache* cache, int64_t seq_id, int32_t layer, const flashkv_tensor* k,
                                       const flashkv_tensor* v) {
  return guard([&] {
    flashkv::PagedKVCache& c = flashkv::capi::get(cache);
    c.append(seq_id, layer, flashkv::capi::to_view(k, "k"), flashkv::capi::to_view(v, "v"));
  });
}

flashkv_status flashkv_kv_cache_attention(const flashkv_kv_cache* cache, const int64_t* seq_ids, int32_t batch,
                                          const int32_t* cu_seqlens_q, int32_t layer, const flashkv_tensor* q,
                                          const flashkv_tensor* out, const flashkv_tensor* lse,
                                          const flashkv_kv_attention_options* opts) {
  return guard([&] {
    const flashkv::PagedKVCache& c = flashkv::capi::get(cache);
    if (batch < 0) throw flashkv::Error("batch", ">= 0", std::to_string(batch));
    if (batch > 0 && seq_ids == nullptr) throw flashkv::Error("seq_ids", "batch values", "NULL pointer");
    if (cu_seqlens_q == nullptr) throw flashkv::Error("cu_seqlens_q", "batch + 1 values", "NULL pointer");
    const flashkv::TensorView qv = flashkv::capi::to_view(q, "q");
    const flashkv::TensorView ov = flashkv::capi::to_view(out, "out");
    flashkv::TensorView lv;
    if (lse != nullptr) lv = flashkv::capi::to_view(lse, "lse");
    c.attention(std::span<const int64_t>(seq_ids, static_cast<size_t>(batch)),
                std::span<const int32_t>(cu_seqlens_q, static_cast<size_t>(batch) + 1), layer, qv, ov,
                lse != nullptr ? &lv : nullptr, flashkv::capi::to_kv_options(opts));
  });
}

flashkv_status flashkv_kv_cache_memory_report(const flashkv_kv_cache* cache, flashkv_kv_memory_report* out) {
  return guard([&] { flashkv::capi::fill_report(flashkv::capi::get(cache).memory_report(), out); });
}

flashkv_status flashkv_kv_cache_dequantize(const flashkv_kv_cache* cache, int64_t seq_id, int32_t layer,
                                           const flashkv_tensor* k_out, const flashkv_tensor* v_out) {
  return guard([&] {
    flashkv::capi::get(cache).dequantize(seq_id, layer, flashkv::capi::to_view(k_out, "k_out"),
                                         flashkv::capi::to_view(v_out, "v_out"));
  });
}

flashkv_status flashkv_kv_memory_estimate(const flashkv_kv_cache_config* cfg, int64_t batch, int64_t tokens,
                                          flashkv_kv_memory_report* out) {
  return guard([&] {
    flashkv::KVCacheConfig c = flashkv::capi::to_config(cfg);
    flashkv::capi::fill_report(flashkv::kv_memory_estimate(c, batch, tokens), out);
  });
}

}  // extern "C"
