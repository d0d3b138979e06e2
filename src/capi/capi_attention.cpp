// C ABI: exact attention entry points (see include/flashkv/flashkv.h and include/flashkv/attention.hpp).
//
// Each function converts its C arguments (flashkv_tensor → TensorView with capi::to_view, options struct → C++
// AttentionOptions honoring struct_size) and calls the C++ API inside capi::guard, so every flashkv::Error becomes a
// status code plus flashkv_last_error() and no exception crosses the ABI.
#include <cstddef>
#include <string>

#include "capi/capi_common.hpp"
#include "flashkv/attention.hpp"

namespace flashkv::capi {
namespace {

/// True if a caller-declared struct of `size` bytes contains the field at [offset, offset + field_size).
constexpr bool covers(uint32_t size, std::size_t offset, std::size_t field_size) {
  return static_cast<std::size_t>(size) >= offset + field_size;
}

#define FLASHKV_OPT_COVERS(size, field) \
  covers(size, offsetof(flashkv_attention_options, field), sizeof(flashkv_attention_options::field))

/// The C options as C++ options; owns the descale views the options point at (so it stays where it was built).
struct Options {
  AttentionOptions o;
  TensorView descale[3];
  Options() = default;
  Options(const Options&) = delete;
  Options& operator=(const Options&) = delete;
};

/// Converts the C options (NULL = defaults) into `out`. Reads only the fields `struct_size` covers (older callers
/// compiled against a shorter struct keep working); rejects sizes this library does not know.
const AttentionOptions& to_options(const flashkv_attention_options* c, Options& out) {
  AttentionOptions& o = out.o;
  if (c == nullptr) return o;
  const uint32_t size = c->struct_size;
  if (size < offsetof(flashkv_attention_options, has_softmax_scale) || size > sizeof(flashkv_attention_options)) {
    throw Error("opts.struct_size",
                std::to_string(offsetof(flashkv_attention_options, has_softmax_scale)) + ".." +
                    std::to_string(sizeof(flashkv_attention_options)) +
                    " bytes (set it to sizeof(flashkv_attention_options) or call flashkv_attention_options_default)",
                std::to_string(size));
  }
  if (FLASHKV_OPT_COVERS(size, softmax_scale) && c->has_softmax_scale != 0) o.softmax_scale = c->softmax_scale;
  if (FLASHKV_OPT_COVERS(size, causal)) o.causal = c->causal != 0;
  if (FLASHKV_OPT_COVERS(size, window_size_left)) o.window_size_left = c->window_size_left;
  if (FLASHKV_OPT_COVERS(size, window_size_right)) o.window_size_right = c->window_size_right;
  if (FLASHKV_OPT_COVERS(size, softcap)) o.softcap = c->softcap;
  if (FLASHKV_OPT_COVERS(size, algorithm)) {
    if (c->algorithm < FLASHKV_ALGO_TILED || c->algorithm > FLASHKV_ALGO_NAIVE) {
      throw Error("opts.algorithm", "FLASHKV_ALGO_TILED (0), FLASHKV_ALGO_V1_ORDER (1) or FLASHKV_ALGO_NAIVE (2)",
                  std::to_string(c->algorithm));
    }
    o.algorithm = static_cast<Algorithm>(c->algorithm);
  }
  if (FLASHKV_OPT_COVERS(size, deterministic)) o.deterministic = c->deterministic != 0;
  if (FLASHKV_OPT_COVERS(size, num_threads)) {
    if (c->num_threads < 0) throw Error("opts.num_threads", ">= 0 (0 = OpenMP default)", std::to_string(c->num_threads));
    o.num_threads = c->num_threads;
  }
  if (FLASHKV_OPT_COVERS(size, stream)) o.stream = c->stream;
  if (FLASHKV_OPT_COVERS(size, kernel_family)) {
    if (c->kernel_family < FLASHKV_KERNEL_AUTO || c->kernel_family > FLASHKV_KERNEL_SM90WS) {
      throw Error("opts.kernel_family",
                  "FLASHKV_KERNEL_AUTO (0), FLASHKV_KERNEL_SM80 (1), FLASHKV_KERNEL_SM90 (2) or FLASHKV_KERNEL_SM90WS (3)",
                  std::to_string(c->kernel_family));
    }
    o.kernel_family = static_cast<KernelFamily>(c->kernel_family);
  }
  const flashkv_tensor* descale[3] = {nullptr, nullptr, nullptr};
  if (FLASHKV_OPT_COVERS(size, q_descale)) descale[0] = c->q_descale;
  if (FLASHKV_OPT_COVERS(size, k_descale)) descale[1] = c->k_descale;
  if (FLASHKV_OPT_COVERS(size, v_descale)) descale[2] = c->v_descale;
  const char* names[3] = {"opts.q_descale", "opts.k_descale", "opts.v_descale"};
  const TensorView** slots[3] = {&o.q_descale, &o.k_descale, &o.v_descale};
  for (int i = 0; i < 3; ++i) {
    if (descale[i] == nullptr) continue;
    out.descale[i] = to_view(descale[i], names[i]);
    *slots[i] = &out.descale[i];
  }
  return o;
}

#undef FLASHKV_OPT_COVERS

}  // namespace
}  // namespace flashkv::capi

using flashkv::capi::guard;
using flashkv::capi::Options;
using flashkv::capi::to_options;
using flashkv::capi::to_view;

extern "C" {

flashkv_status flashkv_attention_forward(const flashkv_tensor* q, const flashkv_tensor* k, const flashkv_tensor* v,
                                         const flashkv_tensor* out, const flashkv_tensor* lse,
                                         const flashkv_attention_options* opts) {
  return guard([&] {
    Options co;
    const flashkv::TensorView tq = to_view(q, "q"), tk = to_view(k, "k"), tv = to_view(v, "v");
    const flashkv::TensorView tout = to_view(out, "out");
    flashkv::TensorView tlse;
    if (lse != nullptr) tlse = to_view(lse, "lse");
    flashkv::attention_forward(tq, tk, tv, tout, lse != nullptr ? &tlse : nullptr, to_options(opts, co));
  });
}

flashkv_status flashkv_attention_backward(const flashkv_tensor* q, const flashkv_tensor* k, const flashkv_tensor* v,
                                          const flashkv_tensor* out, const flashkv_tensor* lse,
                                          const flashkv_tensor* dout, const flashkv_tensor* dq,
                                          const flashkv_tensor* dk, const flashkv_tensor* dv,
                                          const flashkv_attention_options* opts) {
  return guard([&] {
    Options co;
    flashkv::attention_backward(to_view(q, "q"), to_view(k, "k"), to_view(v, "v"), to_view(out, "out"),
                                to_view(lse, "lse"), to_view(dout, "dout"), to_view(dq, "dq"), to_view(dk, "dk"),
                                to_view(dv, "dv"), to_options(opts, co));
  });
}

flashkv_status flashkv_attention_varlen_forward(const flashkv_tensor* q, const flashkv_tensor* k,
                                                const flashkv_tensor* v, const flashkv_tensor* cu_seqlens_q,
                                                const flashkv_tensor* cu_seqlens_k, int64_t max_seqlen_q,
                                                int64_t max_seqlen_k, const flashkv_tensor* out,
                                                const flashkv_tensor* lse, const flashkv_attention_options* opts) {
  return guard([&] {
    Options co;
    const flashkv::TensorView tq = to_view(q, "q"), tk = to_view(k, "k"), tv = to_view(v, "v");
    const flashkv::TensorView tcq = to_view(cu_seqlens_q, "cu_seqlens_q");
    const flashkv::TensorView tck = to_view(cu_seqlens_k, "cu_seqlens_k");
    const flashkv::TensorView tout = to_view(out, "out");
    flashkv::TensorView tlse;
    if (lse != nullptr) tlse = to_view(lse, "lse");
    flashkv::attention_varlen_forward(tq, tk, tv, tcq, tck, max_seqlen_q, max_seqlen_k, tout,
                                      lse != nullptr ? &tlse : nullptr, to_options(opts, co));
  });
}

flashkv_status flashkv_attention_varlen_backward(const flashkv_tensor* q, const flashkv_tensor* k,
                                                 const flashkv_tensor* v, const flashkv_tensor* cu_seqlens_q,
                                                 const flashkv_tensor* cu_seqlens_k, int64_t max_seqlen_q,
                                                 int64_t max_seqlen_k, const flashkv_tensor* out,
                                                 const flashkv_tensor* lse, const flashkv_tensor* dout,
                                                 const flashkv_tensor* dq, const flashkv_tensor* dk,
                                                 const flashkv_tensor* dv, const flashkv_attention_options* opts) {
  return guard([&] {
    Options co;
    flashkv::attention_varlen_backward(to_view(q, "q"), to_view(k, "k"), to_view(v, "v"),
                                       to_view(cu_seqlens_q, "cu_seqlens_q"), to_view(cu_seqlens_k, "cu_seqlens_k"),
                                       max_seqlen_q, max_seqlen_k, to_view(out, "out"), to_view(lse, "lse"),
                                       to_view(dout, "dout"), to_view(dq, "dq"), to_view(dk, "dk"),
                                       to_view(dv, "dv"), to_options(opts, co));
  });
}

}  // extern "C"
