// C ABI of paged decode over 16-bit cache tensors (include/flashkv/flashkv_cuda.h) over flashkv::paged_decode
// (include/flashkv/decode.hpp): the tensors' device decides where it runs (CPU tensors: the CPU decode; CUDA tensors:
// the CUDA backend, or FLASHKV_ERROR_UNSUPPORTED in a build without it).
#include <cstring>

#include "capi/capi_common.hpp"
#include "flashkv/decode.hpp"
#include "flashkv/flashkv_cuda.h"

using flashkv::capi::guard;
using flashkv::capi::to_view;

extern "C" {

flashkv_status flashkv_decode_options_default(flashkv_decode_options* opts) {
  return guard([&] {
    if (opts == nullptr) throw flashkv::Error("opts", "a flashkv_decode_options pointer", "NULL pointer");
    *opts = flashkv_decode_options{};
    opts->struct_size = static_cast<uint32_t>(sizeof(flashkv_decode_options));
    opts->causal = 1;
    opts->window_size_left = -1;
  });
}

flashkv_status flashkv_cuda_decode(const flashkv_tensor* q, const flashkv_tensor* k_cache,
                                   const flashkv_tensor* v_cache, const flashkv_tensor* page_table,
                                   const flashkv_tensor* cache_seqlens, const flashkv_tensor* k_new,
                                   const flashkv_tensor* v_new, const flashkv_tensor* out, const flashkv_tensor* lse,
                                   const flashkv_decode_options* opts) {
  return guard([&] {
    flashkv_decode_options o{};
    o.struct_size = sizeof(o);
    o.causal = 1;
    o.window_size_left = -1;
    if (opts != nullptr) {  // older callers pass a shorter struct: the missing fields keep their defaults
      const size_t n = opts->struct_size < sizeof(o) ? opts->struct_size : sizeof(o);
      std::memcpy(&o, opts, n);
    }
    flashkv::DecodeOptions d;
    if (o.has_softmax_scale) d.softmax_scale = o.softmax_scale;
    d.causal = o.causal != 0;
    d.softcap = o.softcap;
    d.num_splits = o.num_splits;
    d.max_seqlen_k = o.max_seqlen_k;
    d.stream = o.stream;
    d.window_size_left = o.window_size_left;
    d.num_threads = o.num_threads;
    const flashkv::TensorView qv = to_view(q, "q"), kv = to_view(k_cache, "k_cache"), vv = to_view(v_cache, "v_cache");
    const flashkv::TensorView sv = to_view(cache_seqlens, "cache_seqlens"), ov = to_view(out, "out");
    flashkv::TensorView ptv, knv, vnv, lv;
    if (page_table) ptv = to_view(page_table, "page_table");
    if (k_new) knv = to_view(k_new, "k_new");
    if (v_new) vnv = to_view(v_new, "v_new");
    if (lse) lv = to_view(lse, "lse");
    flashkv::paged_decode(qv, kv, vv, page_table ? &ptv : nullptr, sv, k_new ? &knv : nullptr, v_new ? &vnv : nullptr,
                          ov, lse ? &lv : nullptr, d);
  });
}

}  // extern "C"
