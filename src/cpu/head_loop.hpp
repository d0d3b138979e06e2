// What the CPU kernels share about one (batch, head): its geometry (sequence lengths, head sizes, KV head, first
// rows, mask rule) and the OpenMP loop over (batch, head) work items with a per-thread index (internal).
#pragma once

#include <cstdint>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "core/mask.hpp"
#include "core/problem.hpp"
#include "cpu/tile_math.hpp"

namespace flashkv::cpu {

/// Geometry of (batch b, query head h) of a validated problem.
struct HeadGeometry {
  int64_t len_q;        ///< query rows of sequence b (seqlen_q, or its varlen length)
  int64_t len_k;        ///< key rows of sequence b
  int d;                ///< head_dim
  int dv;               ///< head_dim_v
  int64_t hk;           ///< KV head that query head h reads (GQA: h / group_size)
  int64_t row0_q;       ///< first query row of sequence b (0 unless varlen)
  int64_t row0_k;       ///< first key row of sequence b (0 unless varlen)
  core::MaskRule mask;  ///< window_size_left/right over (len_q, len_k)
};

FLASHKV_ALWAYS_INLINE HeadGeometry head_geometry(const core::AttentionProblem& p, int64_t b, int64_t h) {
  const int64_t len_q = p.seqlen_q_of(b);
  const int64_t len_k = p.seqlen_k_of(b);
  return HeadGeometry{len_q,
                      len_k,
                      static_cast<int>(p.head_dim),
                      static_cast<int>(p.head_dim_v),
                      h / p.group_size(),
                      p.q_begin(b),
                      p.k_begin(b),
                      core::MaskRule{len_q, len_k, p.window_size_left, p.window_size_right}};
}

/// Index of the calling thread inside an OpenMP parallel region (0 without OpenMP).
inline int thread_id() {
#if defined(_OPENMP)
  return omp_get_thread_num();
#else
  return 0;
#endif
}

/// Calls fn(b, h, t) for every (batch b, head h) of p on `threads` OpenMP threads, one (b, h) per dynamic-schedule
/// chunk; t in [0, threads) is the calling thread's index (for its scratch). Buffers must be allocated before the
/// call: an exception must not escape the parallel region.
template <class Fn>
void parallel_over_heads(const core::AttentionProblem& p, int threads, Fn&& fn) {
  const int64_t items = p.batch * p.num_heads;
#pragma omp parallel num_threads(threads)
  {
    const int t = thread_id();
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) fn(it / p.num_heads, it % p.num_heads, t);
  }
}

}  // namespace flashkv::cpu
