// FA2-order tiled forward on the CPU. FlashAttention-2 (Dao 2023) §3.1 Alg. 1 + §3.2 (parallelism over the sequence):
//   for each (batch, head, query block i)            <- OpenMP work item, one per dynamic-schedule chunk
//     load Q_i (Br × d) into fast memory, m = −inf, l = 0, O = 0
//     for each K/V block j in the visible key range of block i (fully masked blocks are never visited)
//       S = Q_i·K_jᵀ; scale, softcap; mask element-wise only if the tile is not fully visible
//       online-softmax update (src/cpu/online_softmax.hpp): rescale O by exp(m_old − m_new), O += P·V_j
//     out_i = O / l (one division), lse_i = m + log l
// Non-finite inputs (include/flashkv/attention.hpp): NaN/inf flow through l and O (src/cpu/online_softmax.hpp); a split
// tile whose V holds a NaN/inf takes a guarded P·V in which masked keys are skipped, not multiplied by p = 0.
// fp16/bf16 tiles are converted to float32 on load; the output row is rounded to the input dtype once.
#include <algorithm>
#include <vector>

#include "cpu/attention_cpu.hpp"
#include "cpu/head_loop.hpp"
#include "cpu/online_softmax.hpp"
#include "cpu/score_tile.hpp"
#include "cpu/tile_io.hpp"
#include "cpu/tile_math.hpp"

namespace flashkv::cpu {
namespace {

/// Per-thread scratch: Q (Br×d), Kᵀ (d×Bc), V (Bc×dv), S/P (Br×Bc), O (Br×dv), one output row (dv), a zero row (dv).
int64_t scratch_floats(int64_t d, int64_t dv) {
  return kBlockM * d + d * kBlockN + kBlockN * dv + kBlockM * kBlockN + kBlockM * dv + 2 * dv;
}

FLASHKV_CPU_CLONES
void forward_item(const core::AttentionProblem& p, int64_t b, int64_t h, int64_t q0, float* ws) {
  const auto [len_q, len_k, d, dv, hk, row0_q, row0_k, mask] = head_geometry(p, b, h);
  const int rows = static_cast<int>(std::min<int64_t>(kBlockM, len_q - q0));

  float* qf = ws;
  float* kt = qf + kBlockM * d;
  float* vf = kt + d * kBlockN;
  float* s = vf + kBlockN * dv;
  float* o = s + kBlockM * kBlockN;
  float* out_row = o + kBlockM * dv;
  float* zeros = out_row + dv;
  std::fill(o, o + static_cast<int64_t>(rows) * dv, 0.0f);
  std::fill(zeros, zeros + dv, 0.0f);
  OnlineSoftmaxRow st[kBlockM];

  int64_t kf = 0, kl = 0;
  mask.block_key_range(q0, q0 + rows, &kf, &kl);
  if (kf < kl) {
    load_rows(elem_ptr(p.q, offset_of(p.q_strides, b, row0_q, q0, h), p.dtype), p.dtype, p.q_strides.row, rows, d,
              qf);
  }
  for (int64_t k0 = kf; k0 < kl; k0 += kBlockN) {
    const int kc = static_cast<int>(std::min<int64_t>(kBlockN, kl - k0));
    load_rows_transposed(elem_ptr(p.k, offset_of(p.k_strides, b, row0_k, k0, hk), p.dtype), p.dtype,
                         p.k_strides.row, kc, d, kt);
    load_rows(elem_ptr(p.v, offset_of(p.v_strides, b, row0_k, k0, hk), p.dtype), p.dtype, p.v_strides.row, kc, dv,
              vf);
    qk_tile(qf, rows, d, kt, s);
    const bool full = mask.tile_fully_visible(q0, q0 + rows, k0, k0 + kc);
    finish_scores(s, rows, kc, q0, k0, mask, full, p.softmax_scale, p.softcap);
    // online_softmax_update (src/cpu/online_softmax.hpp) split in its two halves so that P·V runs as one tile
    // product: per row, m/l update, P = exp(S − m_new) and O *= exp(m_old − m_new); then O += P·V for the tile.
    for (int i = 0; i < rows; ++i) {
      const float alpha = online_softmax_scores_to_p(st[i], s + static_cast<int64_t>(i) * kBlockN, kc);
      if (alpha != 1.0f) {
        float* orow = o + static_cast<int64_t>(i) * dv;
        for (int c = 0; c < dv; ++c) orow[c] *= alpha;
      }
    }
    if (full || all_finite(vf, static_cast<int64_t>(kc) * dv)) {
      pv_tile(s, rows, kc, vf, dv, o);
    } else {  // a split tile with a NaN/inf in V: each row reads only the V rows of its own keys (masked = absent)
      for (int i = 0; i < rows; ++i) {
        pv_row_visible(s + static_cast<int64_t>(i) * kBlockN, kc, vf, dv, o + static_cast<int64_t>(i) * dv,
                       mask.row_first(q0 + i) - k0, mask.row_last(q0 + i) - k0, zeros);
      }
    }
  }
  for (int i = 0; i < rows; ++i) {
    const bool has_keys = mask.row_first(q0 + i) < mask.row_last(q0 + i);
    const float lse = online_softmax_finalize(st[i], o + static_cast<int64_t>(i) * dv, dv, out_row, has_keys);
    store_row(out_row, dv, elem_ptr(p.out, offset_of(p.out_strides, b, row0_q, q0 + i, h), p.dtype), p.dtype);
    if (p.lse != nullptr) p.lse[lse_offset(p.lse_strides, b, row0_q, q0 + i, h)] = lse;
  }
}

}  // namespace

void forward_tiled(const core::AttentionProblem& p) {
  const int64_t num_qb = (p.max_seqlen_q + kBlockM - 1) / kBlockM;
  const int64_t items = p.batch * p.num_heads * num_qb;
  if (items == 0) return;
  const int threads = thread_count(p);
  const int64_t per_thread = scratch_floats(p.head_dim, p.head_dim_v);
  std::vector<float> scratch(static_cast<std::size_t>(per_thread) * threads);
#pragma omp parallel num_threads(threads)
  {
    float* ws = scratch.data() + per_thread * thread_id();
    // Largest query blocks first (causal: the last block sees the most keys) for better dynamic load balance.
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t qb = num_qb - 1 - it % num_qb;
      const int64_t bh = it / num_qb;
      const int64_t b = bh / p.num_heads;
      const int64_t h = bh % p.num_heads;
      if (qb * kBlockM < p.seqlen_q_of(b)) forward_item(p, b, h, qb * kBlockM, ws);
    }
  }
}

}  // namespace flashkv::cpu
