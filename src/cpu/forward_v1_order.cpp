// FA1-order tiled forward (FlashAttention, Dao et al. 2022, §3.1 Alg. 1), kept for the v1 → v2 comparison:
//   for each (batch, head)                                <- OpenMP work item
//     O = 0, m = −inf, l = 0 in a per-(batch, head) buffer  ("slow memory", O(seqlen_q·d))
//     for each K/V block j  (outer)                       K_j, V_j loaded once
//       for each Q block i that can see block j  (inner)
//         read Q_i, O_i, m_i, l_i from slow memory
//         S = Q_i·K_jᵀ, scores, mask; m_new, P, l_new (online softmax, src/cpu/online_softmax.hpp)
//         O_i = (l_i·exp(m_i − m_new)·O_i + P·V_j) / l_new          (Alg. 1 line 12: normalized every step)
//         write O_i, m_i, l_i back to slow memory
//     out = O, lse = m + log l
// Results equal the FA2-order kernel up to float32 rounding; the difference is the memory traffic (O, m, l move
// between slow and fast memory once per (i, j) pair; see include/flashkv/traffic.hpp) and the per-step division.
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/attention_cpu.hpp"
#include "cpu/head_loop.hpp"
#include "cpu/online_softmax.hpp"
#include "cpu/score_tile.hpp"
#include "cpu/tile_io.hpp"
#include "cpu/tile_math.hpp"

namespace flashkv::cpu {
namespace {

struct SlowMemory {  // one (batch, head)'s O, m, l — re-read and re-written for every (K/V block, Q block)
  std::vector<float> o, m, l;
};

FLASHKV_CPU_CLONES
void v1_head(const core::AttentionProblem& p, int64_t b, int64_t h, SlowMemory& slow, float* ws) {
  const auto [len_q, len_k, d, dv, hk, row0_q, row0_k, mask] = head_geometry(p, b, h);
  slow.o.assign(static_cast<std::size_t>(len_q * dv), 0.0f);
  slow.m.assign(static_cast<std::size_t>(len_q), kNegInf);
  slow.l.assign(static_cast<std::size_t>(len_q), 0.0f);

  float* qf = ws;
  float* kt = qf + kBlockM * d;
  float* vf = kt + d * kBlockN;
  float* s = vf + kBlockN * dv;
  float* o = s + kBlockM * kBlockN;  // fast-memory copy of O_i
  float* zeros = o + kBlockM * dv;
  std::fill(zeros, zeros + dv, 0.0f);
  OnlineSoftmaxRow st[kBlockM];

  for (int64_t k0 = 0; k0 < len_k; k0 += kBlockN) {
    const int kc = static_cast<int>(std::min<int64_t>(kBlockN, len_k - k0));
    int64_t qfirst = 0, qlast = 0;
    mask.block_query_range(k0, k0 + kc, &qfirst, &qlast);
    if (qfirst >= qlast) continue;
    load_rows_transposed(elem_ptr(p.k, offset_of(p.k_strides, b, row0_k, k0, hk), p.dtype), p.dtype,
                         p.k_strides.row, kc, d, kt);
    load_rows(elem_ptr(p.v, offset_of(p.v_strides, b, row0_k, k0, hk), p.dtype), p.dtype, p.v_strides.row, kc, dv,
              vf);
    int v_finite = -1;  // all_finite(V_j), computed the first time a split tile needs it
    for (int64_t q0 = qfirst; q0 < qlast; q0 += kBlockM) {
      const int rows = static_cast<int>(std::min<int64_t>(kBlockM, qlast - q0));
      load_rows(elem_ptr(p.q, offset_of(p.q_strides, b, row0_q, q0, h), p.dtype), p.dtype, p.q_strides.row, rows, d,
                qf);
      // read O_i, m_i, l_i from slow memory
      std::memcpy(o, slow.o.data() + q0 * dv, sizeof(float) * rows * dv);
      for (int i = 0; i < rows; ++i) st[i] = OnlineSoftmaxRow{slow.m[q0 + i], slow.l[q0 + i]};
      qk_tile(qf, rows, d, kt, s);
      const bool full = mask.tile_fully_visible(q0, q0 + rows, k0, k0 + kc);
      finish_scores(s, rows, kc, q0, k0, mask, full, p.softmax_scale, p.softcap);
      for (int i = 0; i < rows; ++i) {  // O_i·l_i·exp(m_i − m_new) (un-normalize the stored O)
        float* orow = o + static_cast<int64_t>(i) * dv;
        const float l_old = st[i].l;
        const float alpha = online_softmax_scores_to_p(st[i], s + static_cast<int64_t>(i) * kBlockN, kc);
        const float keep = alpha * l_old;
        for (int c = 0; c < dv; ++c) orow[c] *= keep;
      }
      if (!full && v_finite < 0) v_finite = all_finite(vf, static_cast<int64_t>(kc) * dv) ? 1 : 0;
      if (full || v_finite == 1) {
        pv_tile(s, rows, kc, vf, dv, o);  // + P·V_j
      } else {  // split tile, non-finite V: masked keys are skipped, not multiplied by p = 0 (see forward_tiled.cpp)
        for (int i = 0; i < rows; ++i) {
          pv_row_visible(s + static_cast<int64_t>(i) * kBlockN, kc, vf, dv, o + static_cast<int64_t>(i) * dv,
                         mask.row_first(q0 + i) - k0, mask.row_last(q0 + i) - k0, zeros);
        }
      }
      for (int i = 0; i < rows; ++i) {  // / l_new (normalized again, as FA1 stores it)
        if (st[i].l > 0.0f) {
          float* orow = o + static_cast<int64_t>(i) * dv;
          const float inv = 1.0f / st[i].l;
          for (int c = 0; c < dv; ++c) orow[c] *= inv;
        }
      }
      // write O_i, m_i, l_i back to slow memory
      std::memcpy(slow.o.data() + q0 * dv, o, sizeof(float) * rows * dv);
      for (int i = 0; i < rows; ++i) {
        slow.m[q0 + i] = st[i].m;
        slow.l[q0 + i] = st[i].l;
      }
    }
  }
  for (int64_t i = 0; i < len_q; ++i) {
    // Rows without keys (from the mask) get 0 / −inf; rows with keys whose l is NaN or 0 (a NaN or +inf score, or
    // only −inf scores: src/cpu/online_softmax.hpp) get NaN, as the definition gives.
    const bool has_keys = mask.row_first(i) < mask.row_last(i);
    void* dst = elem_ptr(p.out, offset_of(p.out_strides, b, row0_q, i, h), p.dtype);
    float lse = kNegInf;
    if (!has_keys) {
      store_zero_row(dv, dst, p.dtype);
    } else if (slow.l[i] > 0.0f) {
      store_row(slow.o.data() + i * dv, dv, dst, p.dtype);
      lse = slow.m[i] + std::log(slow.l[i]);
    } else {
      lse = std::numeric_limits<float>::quiet_NaN();
      std::fill(zeros, zeros + dv, lse);  // the zero row is not needed any more
      store_row(zeros, dv, dst, p.dtype);
      std::fill(zeros, zeros + dv, 0.0f);
    }
    if (p.lse != nullptr) p.lse[lse_offset(p.lse_strides, b, row0_q, i, h)] = lse;
  }
}

}  // namespace

void forward_v1_order(const core::AttentionProblem& p) {
  const int64_t items = p.batch * p.num_heads;
  if (items == 0) return;
  const int threads = thread_count(p);
  const int64_t per_thread = kBlockM * p.head_dim + p.head_dim * kBlockN + kBlockN * p.head_dim_v +
                             kBlockM * kBlockN + kBlockM * p.head_dim_v + p.head_dim_v;
  std::vector<float> scratch(static_cast<std::size_t>(per_thread) * threads);
  std::vector<SlowMemory> slow(static_cast<std::size_t>(threads));
  for (auto& sm : slow) {  // allocate before the parallel region (bad_alloc must not escape OpenMP)
    sm.o.reserve(static_cast<std::size_t>(p.max_seqlen_q * p.head_dim_v));
    sm.m.reserve(static_cast<std::size_t>(p.max_seqlen_q));
    sm.l.reserve(static_cast<std::size_t>(p.max_seqlen_q));
  }
  parallel_over_heads(p, threads, [&](int64_t b, int64_t h, int t) {
    v1_head(p, b, h, slow[t], scratch.data() + per_thread * t);
  });
}

}  // namespace flashkv::cpu
