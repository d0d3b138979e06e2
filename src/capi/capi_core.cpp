// C ABI: version, errors, tensor conversion (see include/flashkv/flashkv.h).
#include <string>

#include "capi/capi_common.hpp"
#include "core/path_log.hpp"
#include "flashkv/attention.hpp"

namespace flashkv::capi {

namespace {
thread_local std::string g_last_error;
}

void set_last_error(const std::string& msg) { g_last_error = msg; }
const char* last_error_c_str() { return g_last_error.c_str(); }

TensorView to_view(const flashkv_tensor* t, const char* name) {
  if (t == nullptr) throw Error(name, "a tensor", "NULL pointer");
  if (t->ndim < 0 || t->ndim > FLASHKV_MAX_DIMS) {
    throw Error(std::string(name) + ".ndim", "0.." + std::to_string(FLASHKV_MAX_DIMS), std::to_string(t->ndim));
  }
  if (t->dtype < FLASHKV_DTYPE_FLOAT32 || t->dtype > FLASHKV_DTYPE_FLOAT8_E4M3FN) {
    throw TypeError(std::string(name) + ".dtype", "a flashkv_dtype value 0..6", std::to_string(t->dtype));
  }
  if (t->device != FLASHKV_DEVICE_CPU && t->device != FLASHKV_DEVICE_CUDA) {
    throw TypeError(std::string(name) + ".device", "FLASHKV_DEVICE_CPU (0) or FLASHKV_DEVICE_CUDA (1)",
                    std::to_string(t->device));
  }
  TensorView v;
  v.data = t->data;
  v.dtype = static_cast<DType>(t->dtype);
  v.device = static_cast<Device>(t->device);
  v.device_index = t->device_index;
  v.ndim = t->ndim;
  for (int d = 0; d < t->ndim; ++d) {
    v.shape[d] = t->shape[d];
    v.strides[d] = t->strides[d];
  }
  return v;
}

}  // namespace flashkv::capi

extern "C" {

const char* flashkv_version(void) { return flashkv::version(); }
int32_t flashkv_abi_version(void) { return FLASHKV_ABI_VERSION; }
const char* flashkv_last_error(void) { return flashkv::capi::last_error_c_str(); }
const char* flashkv_last_kernel_path(void) { return flashkv::core::last_path().c_str(); }

flashkv_status flashkv_attention_options_default(flashkv_attention_options* opts) {
  return flashkv::capi::guard([&] {
    if (opts == nullptr) throw flashkv::Error("opts", "a flashkv_attention_options pointer", "NULL pointer");
    const flashkv::AttentionOptions d;  // the C++ defaults are the single source of truth
    *opts = flashkv_attention_options{};
    opts->struct_size = static_cast<uint32_t>(sizeof(flashkv_attention_options));
    opts->has_softmax_scale = d.softmax_scale.has_value() ? 1 : 0;
    opts->softmax_scale = d.softmax_scale.value_or(0.0f);
    opts->causal = d.causal ? 1 : 0;
    opts->window_size_left = d.window_size_left;
    opts->window_size_right = d.window_size_right;
    opts->softcap = d.softcap;
    opts->algorithm = static_cast<int32_t>(d.algorithm);
    opts->deterministic = d.deterministic ? 1 : 0;
    opts->num_threads = d.num_threads;
    opts->stream = d.stream;
    opts->kernel_family = static_cast<int32_t>(d.kernel_family);
    opts->q_descale = opts->k_descale = opts->v_descale = nullptr;
  });
}

}  // extern "C"
