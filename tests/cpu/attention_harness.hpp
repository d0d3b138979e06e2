// Test harness for the CPU attention kernels: builds random inputs for a case (fixed-length or varlen), runs the
// kernel through the public API, and compares against the float64 reference (tests/common/reference.hpp) with the
// project's tolerance rule:
//   float32:           max|x − ref| ≤ 1e-5 · max(1, max|ref|)   (forward and backward)
//   float16/bfloat16:  max|x − ref| ≤ 2× (forward) / 3× (backward) · max|naive_lowp − ref| + floor,
// where naive_lowp is the naive computation with every intermediate rounded to the dtype. lse is checked too.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "flashkv/attention.hpp"
#include "flashkv/types.hpp"

namespace flashkv::testing {

struct AttnCase {
  DType dtype = DType::float32;
  int64_t batch = 1;
  int64_t seqlen_q = 1;
  int64_t seqlen_k = 1;
  int64_t num_heads = 1;
  int64_t num_heads_kv = 1;
  int64_t head_dim = 16;
  int64_t head_dim_v = 0;  ///< 0 = head_dim
  bool causal = false;
  int32_t window_size_left = -1;
  int32_t window_size_right = -1;
  float softcap = 0.0f;
  Algorithm algorithm = Algorithm::tiled;
  int64_t pad = 0;           ///< extra elements per row: non-contiguous strides when > 0
  double input_std = 1.0;    ///< stddev of q and k (large values -> large logits)
  /// float32 only: judge with the low-precision rule (2×/3× the error of a naive float32 computation) instead of
  /// 1e-5 relative — for ill-conditioned inputs (logits ~1e4, where rounding the score itself costs ~1e-4).
  bool baseline_rule_for_fp32 = false;
  /// Varlen when non-empty: per-sequence lengths (batch = size); seqlen_q/k are then ignored.
  std::vector<int32_t> varlen_q, varlen_k;

  int64_t dv() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  bool is_varlen() const { return !varlen_q.empty(); }
  std::string name() const;
};

struct CheckResult {
  bool ok = true;
  std::string report;  ///< human-readable summary of every measured error and its bound
};

/// Forward: out and lse against the reference (tolerance rule above).
CheckResult check_forward(const AttnCase& c, uint64_t salt);

/// Backward: dq, dk, dv (after a forward by the same kernel) against the reference gradients.
CheckResult check_backward(const AttnCase& c, uint64_t salt);

/// Relative bound used for float32 backward (gradients sum many more terms than the forward).
inline constexpr double kFp32BackwardRtol = 1e-5;

}  // namespace flashkv::testing

namespace flashkv::testing {
/// gtest printer: failures show the case, not a byte dump.
inline void PrintTo(const AttnCase& c, std::ostream* os) { *os << c.name(); }
}  // namespace flashkv::testing
