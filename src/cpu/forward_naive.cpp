// Standard ("naive") attention, kept as the baseline FlashAttention replaces (FlashAttention §2.2, Alg. 0):
//   S = Q·Kᵀ·scale   written in full, [seqlen_q × seqlen_k] float32 per (batch, head)   ("slow memory")
//   P = softmax(S)   row max, exp, row sum, normalize — read S, write P in place
//   O = P·V          read P in full (tiled: V tiles re-read once per Q block)
// Extra memory is O(seqlen_q·seqlen_k) per thread; parallel over (batch, head). Scores use the same score transform
// and mask as the tiled kernels (src/cpu/score_tile.hpp) so the variants agree to float32 rounding.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/attention_cpu.hpp"
#include "cpu/head_loop.hpp"
#include "cpu/score_tile.hpp"
#include "cpu/tile_io.hpp"
#include "cpu/tile_math.hpp"

namespace flashkv::cpu {
namespace {

FLASHKV_CPU_CLONES
void naive_head(const core::AttentionProblem& p, int64_t b, int64_t h, std::vector<float>& big, float* ws) {
  const auto [len_q, len_k, d, dv, hk, row0_q, row0_k, mask] = head_geometry(p, b, h);
  big.resize(static_cast<std::size_t>(len_q * len_k));  // S, then P in place: [len_q][len_k] ("slow memory")
  float* sp = big.data();
  float* qf = ws;
  float* kt = qf + kBlockM * d;
  float* st = kt + d * kBlockN;
  float* vf = st + kBlockM * kBlockN;
  float* o = vf + kBlockN * dv;
  float* zeros = o + kBlockM * dv;
  std::fill(zeros, zeros + dv, 0.0f);

  // 1) S = Q·Kᵀ·scale (+ softcap, mask), tile by tile, written in full.
  for (int64_t q0 = 0; q0 < len_q; q0 += kBlockM) {
    const int rows = static_cast<int>(std::min<int64_t>(kBlockM, len_q - q0));
    load_rows(elem_ptr(p.q, offset_of(p.q_strides, b, row0_q, q0, h), p.dtype), p.dtype, p.q_strides.row, rows, d,
              qf);
    for (int64_t k0 = 0; k0 < len_k; k0 += kBlockN) {
      const int kc = static_cast<int>(std::min<int64_t>(kBlockN, len_k - k0));
      load_rows_transposed(elem_ptr(p.k, offset_of(p.k_strides, b, row0_k, k0, hk), p.dtype), p.dtype,
                           p.k_strides.row, kc, d, kt);
      qk_tile(qf, rows, d, kt, st);
      finish_scores(st, rows, kc, q0, k0, mask, false, p.softmax_scale, p.softcap);
      for (int i = 0; i < rows; ++i) {
        std::copy(st + static_cast<int64_t>(i) * kBlockN, st + static_cast<int64_t>(i) * kBlockN + kc,
                  sp + (q0 + i) * len_k + k0);
      }
    }
  }
  // 2) P = softmax(S), row by row: read S, write P (in place); lse = m + log l. Non-finite scores: the max ignores
  //    NaN, but exp(NaN − m) = NaN makes l, P and lse NaN (a +inf score: exp(inf − inf)); a row with keys whose
  //    scores are all −inf or NaN (m = −inf) is NaN; only a row without keys (from the mask) gets P = 0, lse = −inf.
  for (int64_t i = 0; i < len_q; ++i) {
    float* row = sp + i * len_k;
    float m = kNegInf;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < len_k; ++j) m = row[j] > m ? row[j] : m;
    float lse = kNegInf;
    if (m == kNegInf && mask.row_first(i) < mask.row_last(i)) {
      lse = std::numeric_limits<float>::quiet_NaN();
      std::fill(row, row + len_k, lse);
    } else if (m != kNegInf) {
      float l = 0.0f;
#pragma omp simd reduction(+ : l)
      for (int64_t j = 0; j < len_k; ++j) {
        row[j] = exp_flush(row[j] - m);
        l += row[j];
      }
      const float inv = 1.0f / l;
      for (int64_t j = 0; j < len_k; ++j) row[j] *= inv;
      lse = m + std::log(l);
    } else {
      std::fill(row, row + len_k, 0.0f);  // no visible key: P = 0, out = 0
    }
    if (p.lse != nullptr) p.lse[lse_offset(p.lse_strides, b, row0_q, i, h)] = lse;
  }
  // 3) O = P·V, tile by tile: read P in full, V once per Q block. Masked entries of P are 0; where a tile that the
  //    mask splits (or hides) holds a NaN/inf in V, each row reads only its own keys' V rows (masked = absent).
  for (int64_t q0 = 0; q0 < len_q; q0 += kBlockM) {
    const int rows = static_cast<int>(std::min<int64_t>(kBlockM, len_q - q0));
    std::fill(o, o + static_cast<int64_t>(rows) * dv, 0.0f);
    for (int64_t k0 = 0; k0 < len_k; k0 += kBlockN) {
      const int kc = static_cast<int>(std::min<int64_t>(kBlockN, len_k - k0));
      load_rows(elem_ptr(p.v, offset_of(p.v_strides, b, row0_k, k0, hk), p.dtype), p.dtype, p.v_strides.row, kc,
                dv, vf);
      for (int i = 0; i < rows; ++i) {  // read the P tile from the materialized matrix
        std::copy(sp + (q0 + i) * len_k + k0, sp + (q0 + i) * len_k + k0 + kc, st + static_cast<int64_t>(i) * kBlockN);
      }
      if (mask.tile_fully_visible(q0, q0 + rows, k0, k0 + kc) || all_finite(vf, static_cast<int64_t>(kc) * dv)) {
        pv_tile(st, rows, kc, vf, dv, o);
      } else {
        for (int i = 0; i < rows; ++i) {
          pv_row_visible(st + static_cast<int64_t>(i) * kBlockN, kc, vf, dv, o + static_cast<int64_t>(i) * dv,
                         mask.row_first(q0 + i) - k0, mask.row_last(q0 + i) - k0, zeros);
        }
      }
    }
    for (int i = 0; i < rows; ++i) {
      store_row(o + static_cast<int64_t>(i) * dv, dv,
                elem_ptr(p.out, offset_of(p.out_strides, b, row0_q, q0 + i, h), p.dtype), p.dtype);
    }
  }
}

}  // namespace

void forward_naive(const core::AttentionProblem& p) {
  const int64_t items = p.batch * p.num_heads;
  if (items == 0) return;
  const int threads = thread_count(p);
  const int64_t per_thread = kBlockM * p.head_dim + p.head_dim * kBlockN + kBlockM * kBlockN +
                             kBlockN * p.head_dim_v + kBlockM * p.head_dim_v + p.head_dim_v;
  std::vector<float> scratch(static_cast<std::size_t>(per_thread) * threads);
  std::vector<std::vector<float>> big(static_cast<std::size_t>(threads));
  // Reserve the O(N²) buffers up front so an allocation failure surfaces as std::bad_alloc here, not inside OpenMP.
  const std::size_t need = static_cast<std::size_t>(p.max_seqlen_q * p.max_seqlen_k);
  for (auto& v : big) v.reserve(need);
  parallel_over_heads(p, threads, [&](int64_t b, int64_t h, int t) {
    naive_head(p, b, h, big[t], scratch.data() + per_thread * t);
  });
}

}  // namespace flashkv::cpu
