// Argument validation for the attention entry points: every check listed under ERRORS in flashkv/attention.hpp,
// producing a device-agnostic AttentionProblem (src/core/problem.hpp). Every failure is a flashkv::Error naming the
// argument with expected vs actual ("flashkv: argument 'k': expected head_dim 64 (= q.shape[3]), got 32");
// dtype/device mismatches are flashkv::TypeError. The values inside cu_seqlens are checked only when the tensors live
// on the CPU (device == cpu); device backends must treat them as trusted (documented precondition).
//
// The small tensor checks are exported too so that other layers (KV cache, engine) report errors the same way.
#pragma once

#include <cstdint>
#include <string>

#include <vector>

#include "core/decode_problem.hpp"
#include "core/problem.hpp"
#include "flashkv/attention.hpp"
#include "flashkv/decode.hpp"
#include "flashkv/types.hpp"

namespace flashkv::core {

/// Largest head_dim / head_dim_v the attention kernels accept.
inline constexpr int64_t kMaxHeadDim = 256;

// ---- reusable tensor checks (throw flashkv::Error / TypeError naming `name`) ----------------------------------------
/// t.ndim == ndim; shapes >= 0; strides >= 0; last dim contiguous (stride 1 when its size > 1).
void check_rank_and_layout(const TensorView& t, const char* name, int ndim, const char* layout);
/// t.shape[dim] == expected ("expected <what> <expected> <source>, got <actual>"), e.g.
/// "expected head_dim 64 (= q.shape[3]), got 32".
void check_dim(const TensorView& t, const char* name, int dim, int64_t expected, const std::string& what,
               const std::string& source = "");
/// t.dtype == dtype (TypeError).
void check_dtype(const TensorView& t, const char* name, DType dtype);
/// Same device and device index as `ref` (TypeError).
void check_same_device(const TensorView& t, const char* name, const TensorView& ref, const char* ref_name);
/// data != nullptr unless the tensor is empty.
void check_data(const TensorView& t, const char* name);

// ---- attention problems ------------------------------------------------------------------------------------------
/// Validates a fixed-length forward call (see attention_forward). lse may be nullptr.
AttentionProblem make_forward_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& out, const TensorView* lse, const AttentionOptions& options);

/// Validates a fixed-length backward call (see attention_backward).
AttentionProblem make_backward_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                                       const TensorView& out, const TensorView& lse, const TensorView& dout,
                                       const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                       const AttentionOptions& options);

/// Validates a varlen forward call (see attention_varlen_forward). lse may be nullptr.
AttentionProblem make_varlen_forward_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                                             const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                                             int64_t max_seqlen_q, int64_t max_seqlen_k, const TensorView& out,
                                             const TensorView* lse, const AttentionOptions& options);

/// Validates a varlen backward call (see attention_varlen_backward).
AttentionProblem make_varlen_backward_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                                              const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                                              int64_t max_seqlen_q, int64_t max_seqlen_k, const TensorView& out,
                                              const TensorView& lse, const TensorView& dout, const TensorView& dq,
                                              const TensorView& dk, const TensorView& dv,
                                              const AttentionOptions& options);

// ---- decode over a paged KV cache (flashkv/decode.hpp) -----------------------------------------------------------
/// Validates a paged_decode call (16-bit cache tensors; every check listed there) into a DecodeProblem. For CPU
/// tensors the cache_seqlens are read here: each >= 0 and cache_seqlens[b] + seqlen_new <= capacity (CapacityError
/// naming b, the lengths and the capacity) and the page ids they need in [0, num_pages); `host_seqlens_k` receives
/// the key counts (problem.kv.host_seqlens_k points into it). CUDA lengths are checked by the device plan before
/// anything is written or launched; options.max_seqlen_k + seqlen_new <= capacity is checked here for any device.
DecodeProblem make_decode_problem(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                                  const TensorView* page_table, const TensorView& cache_seqlens,
                                  const TensorView* k_new, const TensorView* v_new, const TensorView& out,
                                  const TensorView* lse, const DecodeOptions& options,
                                  std::vector<int64_t>& host_seqlens_k);

/// The option checks shared by both decode entry points (Error naming 'options.<field>'); fills the problem's
/// semantics / execution fields (softmax scale resolved for problem.head_dim).
void apply_decode_options(const DecodeOptions& options, DecodeProblem& problem);

/// Binds q [total_q, num_heads, head_dim], out like q and lse [num_heads, total_q] (optional) of a PagedKVCache decode
/// to a planned problem (sizes from the plan; Error / TypeError naming q / out / lse).
void bind_decode_io(DecodeProblem& problem, const TensorView& q, const TensorView& out, const TensorView* lse);

}  // namespace flashkv::core
