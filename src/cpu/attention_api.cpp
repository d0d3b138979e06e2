// Public C++ entry points (flashkv/attention.hpp): validate into an AttentionProblem (src/core/validate.hpp), then run
// it on its device — the CPU kernels for Device::cpu, the registered DeviceBackend (src/core/backend.hpp) for
// Device::cuda, or UnsupportedError. Never a silent fallback to another device or variant.
#include <string>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "core/backend.hpp"
#include "core/path_log.hpp"
#include "core/validate.hpp"
#include "cpu/attention_cpu.hpp"
#include "flashkv/attention.hpp"
#include "flashkv/error.hpp"

namespace flashkv {
namespace {

/// "attention_forward cpu tiled float32 hdim64 varlen causal" (the CPU kernels have one path per algorithm).
std::string cpu_path(const char* op, const core::AttentionProblem& p) {
  std::string s = std::string(op) + " cpu " + (p.is_backward ? "fa2-bwd" : algorithm_name(p.algorithm)) + " " +
                  dtype_name(p.dtype) + " hdim" + std::to_string(p.head_dim);
  if (p.is_varlen) s += " varlen";
  if (p.causal) s += " causal";
  return s;
}

void run_forward(const core::AttentionProblem& p) {
  if (p.device == Device::cpu) {
    core::record_path(cpu_path("attention_forward", p));
    cpu::forward(p);
  } else {
    core::require_device_backend(p.device).forward(p, p.stream);
  }
}

void run_backward(const core::AttentionProblem& p) {
  if (p.device == Device::cpu) {
    // `algorithm` selects the forward loop order only; the backward pass has one algorithm (FA2 Alg. 2).
    core::record_path(cpu_path("attention_backward", p));
    cpu::backward(p);
  } else {
    core::require_device_backend(p.device).backward(p, p.stream);
  }
}

}  // namespace

const char* algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::tiled: return "tiled";
    case Algorithm::v1_order: return "v1";
    case Algorithm::naive: return "naive";
  }
  return "unknown";
}

void attention_forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                       const TensorView* lse, const AttentionOptions& options) {
  run_forward(core::make_forward_problem(q, k, v, out, lse, options));
}

void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                        const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, const AttentionOptions& options) {
  run_backward(core::make_backward_problem(q, k, v, out, lse, dout, dq, dk, dv, options));
}

void attention_varlen_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, int64_t max_seqlen_q,
                              int64_t max_seqlen_k, const TensorView& out, const TensorView* lse,
                              const AttentionOptions& options) {
  run_forward(core::make_varlen_forward_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out,
                                                lse, options));
}

void attention_varlen_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, int64_t max_seqlen_q,
                               int64_t max_seqlen_k, const TensorView& out, const TensorView& lse,
                               const TensorView& dout, const TensorView& dq, const TensorView& dk,
                               const TensorView& dv, const AttentionOptions& options) {
  run_backward(core::make_varlen_backward_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                  out, lse, dout, dq, dk, dv, options));
}

namespace cpu {

int thread_count(const core::AttentionProblem& p) {
#if defined(_OPENMP)
  return p.num_threads > 0 ? p.num_threads : omp_get_max_threads();
#else
  (void)p;
  return 1;
#endif
}

void forward(const core::AttentionProblem& p) {
  switch (p.algorithm) {
    case Algorithm::tiled: forward_tiled(p); return;
    case Algorithm::v1_order: forward_v1_order(p); return;
    case Algorithm::naive: forward_naive(p); return;
  }
  throw Error("algorithm", "tiled, v1_order or naive", std::to_string(static_cast<int>(p.algorithm)));
}

}  // namespace cpu
}  // namespace flashkv
