// C ABI of the CUDA-only entry points (include/flashkv/flashkv_cuda.h). Compiled in every build; without the CUDA
// backend (FLASHKV_HAS_CUDA undefined) the functions report FLASHKV_ERROR_UNSUPPORTED.
#include <cstring>

#include "capi/capi_common.hpp"
#include "flashkv/flashkv_cuda.h"
#if defined(FLASHKV_HAS_CUDA)
#include "cuda/decode_cuda.hpp"
#endif

using flashkv::capi::guard;
using flashkv::capi::to_view;

extern "C" {

flashkv_status flashkv_decode_options_default(flashkv_decode_options* opts) {
  return guard([&] {
    if (opts == nullptr) throw flashkv::Error("opts", "a flashkv_decode_options pointer", "NULL pointer");
    *opts = flashkv_decode_options{};
    opts->struct_size = static_cast<uint32_t>(sizeof(flashkv_decode_options));
    opts->causal = 1;
  });
}

flashkv_status flashkv_cuda_decode(const flashkv_tensor* q, const flashkv_tensor* k_cache,
                                   const flashkv_tensor* v_cache, const flashkv_tensor* page_table,
                                   const flashkv_tensor* cache_seqlens, const flashkv_tensor* k_new,
                                   const flashkv_tensor* v_new, const flashkv_tensor* out, const flashkv_tensor* lse,
                                   const flashkv_decode_options* opts) {
  return guard([&] {
#if defined(FLASHKV_HAS_CUDA)
    flashkv_decode_options o{};
    o.struct_size = sizeof(o);
    o.causal = 1;
    if (opts != nullptr) {
      const size_t n = opts->struct_size < sizeof(o) ? opts->struct_size : sizeof(o);
      std::memcpy(&o, opts, n);
    }
    flashkv::cuda::DecodeOptions d;
    if (o.has_softmax_scale) d.softmax_scale = o.softmax_scale;
    d.causal = o.causal != 0;
    d.softcap = o.softcap;
    d.num_splits = o.num_splits;
    d.max_seqlen_k = o.max_seqlen_k;
    d.stream = o.stream;
    const flashkv::TensorView qv = to_view(q, "q"), kv = to_view(k_cache, "k_cache"), vv = to_view(v_cache, "v_cache");
    const flashkv::TensorView sv = to_view(cache_seqlens, "cache_seqlens"), ov = to_view(out, "out");
    flashkv::TensorView ptv, knv, vnv, lv;
    if (page_table) ptv = to_view(page_table, "page_table");
    if (k_new) knv = to_view(k_new, "k_new");
    if (v_new) vnv = to_view(v_new, "v_new");
    if (lse) lv = to_view(lse, "lse");
    flashkv::cuda::decode_attention_cuda(qv, kv, vv, page_table ? &ptv : nullptr, sv, k_new ? &knv : nullptr,
                                         v_new ? &vnv : nullptr, ov, lse ? &lv : nullptr, d);
#else
    (void)q, (void)k_cache, (void)v_cache, (void)page_table, (void)cache_seqlens, (void)k_new, (void)v_new,
        (void)out, (void)lse, (void)opts;
    throw flashkv::UnsupportedError("flashkv: this build has no CUDA backend (configure with -DFLASHKV_CUDA=ON)");
#endif
  });
}

}  // extern "C"
