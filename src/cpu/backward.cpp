// FA2 backward on the CPU (FlashAttention-2, Dao 2023, §3.1.2 / Alg. 2), by recomputation from lse:
//   D_i  = rowsum(dO_i ∘ O_i)                                   (pass 0; float32 [num_heads, total_q])
//   T    = softcap(Q·Kᵀ·scale), masked −inf   (the forward's scores, src/cpu/score_tile.hpp)
//   P    = exp(T − lse)                        (exactly 0 for masked entries and rows with lse = −inf)
//   dV   = Pᵀ·dO,  dP = dO·Vᵀ,  dT = P∘(dP − D)
//   dU   = dT ∘ (1 − (T/softcap)²)             (d tanh; dU = dT without softcap)
//   dQ   = dU·K·scale,  dK = dUᵀ·Q·scale
// Determinism without atomics: two passes, each writing disjoint rows in a fixed order (the split used by the Triton
// fused-attention tutorial and FA3's deterministic mode in spirit):
//   pass 1, parallel over (batch, kv head, K/V block j): dK_j, dV_j accumulate over every query head of the GQA group
//           and every Q block that can see block j (in a fixed order);
//   pass 2, parallel over (batch, head, Q block i): dQ_i accumulates over the K/V blocks i can see.
// S/P/dP are recomputed in both passes (7 tile products instead of 5): the price of needing no dQ reduction buffer,
// no atomics and bit-identical results for any thread count. Accumulation is float32; outputs are rounded once.
// Non-finite inputs (include/flashkv/attention.hpp): masked entries of P and dU are selects to 0, and tiles that the
// mask splits take a guarded product (masked pairs skipped, not 0·x) when the other operand holds a NaN/inf — the
// full tiles, where every row sees every key, propagate through the plain products.
#include <algorithm>
#include <vector>

#include "core/mask.hpp"
#include "cpu/attention_cpu.hpp"
#include "cpu/head_loop.hpp"
#include "cpu/score_tile.hpp"
#include "cpu/tile_io.hpp"
#include "cpu/tile_math.hpp"

namespace flashkv::cpu {
namespace {

/// Query rows per tile in the backward pass (64: the dQ tile reuses the dK tile and at_x transposes with stride Bc).
constexpr int kBwdBlockM = 64;

struct Tiles {  // per-thread scratch (float32)
  float *qf, *dof, *kt, *vt, *kf, *s, *ds, *dk, *dv, *col, *tmp, *lse, *dd, *zeros;
};

int64_t scratch_floats(int64_t d, int64_t dv) {
  return kBwdBlockM * d + kBwdBlockM * dv + d * kBlockN + dv * kBlockN + kBlockN * d + 2 * kBwdBlockM * kBlockN +
         kBlockN * d + kBlockN * dv + kBlockN * kBwdBlockM + 2 * std::max(d, dv) + 2 * kBwdBlockM;
}

Tiles carve(float* ws, int64_t d, int64_t dv) {
  Tiles t;
  t.qf = ws;
  t.dof = t.qf + kBwdBlockM * d;
  t.kt = t.dof + kBwdBlockM * dv;
  t.vt = t.kt + d * kBlockN;
  t.kf = t.vt + dv * kBlockN;
  t.s = t.kf + kBlockN * d;
  t.ds = t.s + kBwdBlockM * kBlockN;
  t.dk = t.ds + kBwdBlockM * kBlockN;
  t.dv = t.dk + kBlockN * d;
  t.col = t.dv + kBlockN * dv;
  t.tmp = t.col + kBlockN * kBwdBlockM;  // col: a transposed [kBlockN][kBwdBlockM] tile
  t.lse = t.tmp + std::max(d, dv);
  t.dd = t.lse + kBwdBlockM;
  t.zeros = t.dd + kBwdBlockM;  // [max(d, dv)] zeros: the operand row of masked pairs in the guarded products
  std::fill(t.zeros, t.zeros + std::max(d, dv), 0.0f);
  return t;
}

/// Global row of query i of sequence b in the [num_heads, total_q] D buffer.
int64_t d_row(const core::AttentionProblem& p, int64_t b, int64_t i) {
  return (p.is_varlen ? p.q_begin(b) : b * p.seqlen_q) + i;
}

/// Recomputes P (into t.s) and dU (into t.ds) for Q block [q0, q0 + rows) × K/V block [k0, k0 + kc); returns
/// whether the tile is fully visible. Masked entries of P and dU are a select to exactly 0 — never exp(−inf − lse)
/// (NaN when lse is NaN) nor 0·(dP − D) (NaN when dP or D is) — so that only visible pairs carry NaN/inf
/// (include/flashkv/attention.hpp "NON-FINITE INPUTS"). Needs t.qf, t.dof, t.lse, t.dd (query side) and t.kt, t.vt
/// (key side) loaded.
FLASHKV_ALWAYS_INLINE bool p_and_ds(const core::AttentionProblem& p, const core::MaskRule& mask, const Tiles& t,
                                    int rows, int kc, int64_t q0, int64_t k0) {
  const int d = static_cast<int>(p.head_dim);
  const int dv = static_cast<int>(p.head_dim_v);
  const bool full = mask.tile_fully_visible(q0, q0 + rows, k0, k0 + kc);
  qk_tile(t.qf, rows, d, t.kt, t.s);
  finish_scores(t.s, rows, kc, q0, k0, mask, full, p.softmax_scale, p.softcap);
  qk_tile(t.dof, rows, dv, t.vt, t.ds);  // dP = dO·Vᵀ
  const float cap = p.softcap;
  const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
  for (int i = 0; i < rows; ++i) {
    float* srow = t.s + static_cast<int64_t>(i) * kBlockN;
    float* drow = t.ds + static_cast<int64_t>(i) * kBlockN;
    const float lse = t.lse[i];
    const float di = t.dd[i];
    if (lse == kNegInf) {  // row with no visible key: P = 0, zero gradients
      for (int j = 0; j < kc; ++j) srow[j] = drow[j] = 0.0f;
      continue;
    }
    const int64_t first = full ? 0 : mask.row_first(q0 + i) - k0;  // the row's keys in this tile: [first, last)
    const int64_t last = full ? kc : mask.row_last(q0 + i) - k0;
    for (int j = 0; j < kc; ++j) {
      const float score = srow[j];
      const float pj = exp_flush(score - lse);
      float g = pj * (drow[j] - di);
      if (cap > 0.0f) {
        const float th = score * inv_cap;
        g = g * (1.0f - th * th);
      }
      const bool visible = j >= first && j < last;
      srow[j] = visible ? pj : 0.0f;
      drow[j] = visible ? g : 0.0f;
    }
  }
  return full;
}

/// out[j][0..dx) += Σ_i a[i][j]·x[i][0..dx) for j < cols, i < rows (a is [rows][kBlockN], x is [rows][dx]):
/// transposes the tile into `at` ([cols][kBlockN]) and runs the same register-blocked product as the forward.
/// `guarded` (a split tile whose x holds a NaN/inf): key j sums only the query rows that see it (masked = absent,
/// not 0·x); rows [q0, q0 + rows), keys [k0, k0 + cols) of `mask`.
FLASHKV_ALWAYS_INLINE void at_x(const float* __restrict a, int rows, int cols, const float* __restrict x, int dx,
                                float* __restrict out, float* __restrict at, bool guarded, const core::MaskRule& mask,
                                int64_t q0, int64_t k0, const float* __restrict zeros) {
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) at[static_cast<int64_t>(j) * kBlockN + i] = a[static_cast<int64_t>(i) * kBlockN + j];
  }
  if (!guarded) {
    pv_tile(at, cols, rows, x, dx, out);
    return;
  }
  for (int j = 0; j < cols; ++j) {
    int64_t first = 0, last = 0;  // the query rows that see key k0 + j
    mask.block_query_range(k0 + j, k0 + j + 1, &first, &last);
    pv_row_visible(at + static_cast<int64_t>(j) * kBlockN, rows, x, dx, out + static_cast<int64_t>(j) * dx,
                   first - q0, last - q0, zeros);
  }
}

/// Loads the query-side tiles of (b, h, rows [q0, q0 + rows)): Q, dO, lse, D.
FLASHKV_ALWAYS_INLINE void load_query_side(const core::AttentionProblem& p, const std::vector<float>& dbuf, int64_t b,
                                           int64_t h, int64_t q0, int rows, const Tiles& t) {
  const int64_t row0_q = p.q_begin(b);
  load_rows(elem_ptr(p.q, offset_of(p.q_strides, b, row0_q, q0, h), p.dtype), p.dtype, p.q_strides.row, rows,
            static_cast<int>(p.head_dim), t.qf);
  load_rows(elem_ptr(p.dout, offset_of(p.dout_strides, b, row0_q, q0, h), p.dtype), p.dtype, p.dout_strides.row,
            rows, static_cast<int>(p.head_dim_v), t.dof);
  const float* dh = dbuf.data() + h * p.total_q;
  for (int i = 0; i < rows; ++i) {
    t.lse[i] = p.lse[lse_offset(p.lse_strides, b, row0_q, q0 + i, h)];
    t.dd[i] = dh[d_row(p, b, q0 + i)];
  }
}

FLASHKV_CPU_CLONES
void dkdv_item(const core::AttentionProblem& p, const std::vector<float>& dbuf, int64_t b, int64_t hk, int64_t k0,
               float* ws) {
  const int d = static_cast<int>(p.head_dim);
  const int dv = static_cast<int>(p.head_dim_v);
  const int64_t len_q = p.seqlen_q_of(b);
  const int64_t len_k = p.seqlen_k_of(b);
  const int kc = static_cast<int>(std::min<int64_t>(kBlockN, len_k - k0));
  const int64_t row0_k = p.k_begin(b);
  const core::MaskRule mask{len_q, len_k, p.window_size_left, p.window_size_right};
  const Tiles t = carve(ws, d, dv);
  std::fill(t.dk, t.dk + static_cast<int64_t>(kc) * d, 0.0f);
  std::fill(t.dv, t.dv + static_cast<int64_t>(kc) * dv, 0.0f);
  int64_t qfirst = 0, qlast = 0;
  mask.block_query_range(k0, k0 + kc, &qfirst, &qlast);
  if (qfirst < qlast) {
    load_rows_transposed(elem_ptr(p.k, offset_of(p.k_strides, b, row0_k, k0, hk), p.dtype), p.dtype,
                         p.k_strides.row, kc, d, t.kt);
    load_rows_transposed(elem_ptr(p.v, offset_of(p.v_strides, b, row0_k, k0, hk), p.dtype), p.dtype,
                         p.v_strides.row, kc, dv, t.vt);
  }
  const int64_t g = p.group_size();
  for (int64_t h = hk * g; h < (hk + 1) * g && qfirst < qlast; ++h) {
    for (int64_t q0 = qfirst; q0 < qlast; q0 += kBwdBlockM) {
      const int rows = static_cast<int>(std::min<int64_t>(kBwdBlockM, qlast - q0));
      load_query_side(p, dbuf, b, h, q0, rows, t);
      const bool full = p_and_ds(p, mask, t, rows, kc, q0, k0);
      // split tile: masked pairs must not multiply a NaN/inf row of dO or Q (checked only there)
      const bool guard_do = !full && !all_finite(t.dof, static_cast<int64_t>(rows) * dv);
      const bool guard_q = !full && !all_finite(t.qf, static_cast<int64_t>(rows) * d);
      at_x(t.s, rows, kc, t.dof, dv, t.dv, t.col, guard_do, mask, q0, k0, t.zeros);  // dV += Pᵀ·dO
      at_x(t.ds, rows, kc, t.qf, d, t.dk, t.col, guard_q, mask, q0, k0, t.zeros);    // dK += dUᵀ·Q (scale at store)
    }
  }
  for (int j = 0; j < kc; ++j) {
    const float* src = t.dk + static_cast<int64_t>(j) * d;
    for (int c = 0; c < d; ++c) t.tmp[c] = src[c] * p.softmax_scale;
    store_row(t.tmp, d, elem_ptr(p.dk, offset_of(p.dk_strides, b, row0_k, k0 + j, hk), p.dtype), p.dtype);
    store_row(t.dv + static_cast<int64_t>(j) * dv, dv,
              elem_ptr(p.dv, offset_of(p.dv_strides, b, row0_k, k0 + j, hk), p.dtype), p.dtype);
  }
}

FLASHKV_CPU_CLONES
void dq_item(const core::AttentionProblem& p, const std::vector<float>& dbuf, int64_t b, int64_t h, int64_t q0,
             float* ws) {
  const auto [len_q, len_k, d, dv, hk, row0_q, row0_k, mask] = head_geometry(p, b, h);
  const int rows = static_cast<int>(std::min<int64_t>(kBwdBlockM, len_q - q0));
  const Tiles t = carve(ws, d, dv);
  float* dq = t.dk;  // reuse: [rows][d] fits in the dK tile (kBwdBlockM == kBlockN)
  static_assert(kBwdBlockM == kBlockN, "dQ reuses the dK tile; at_x transposes with stride kBlockN");
  std::fill(dq, dq + static_cast<int64_t>(rows) * d, 0.0f);
  int64_t kf = 0, kl = 0;
  mask.block_key_range(q0, q0 + rows, &kf, &kl);
  if (kf < kl) load_query_side(p, dbuf, b, h, q0, rows, t);
  for (int64_t k0 = kf; k0 < kl; k0 += kBlockN) {
    const int kc = static_cast<int>(std::min<int64_t>(kBlockN, kl - k0));
    const void* kptr = elem_ptr(p.k, offset_of(p.k_strides, b, row0_k, k0, hk), p.dtype);
    load_rows_transposed(kptr, p.dtype, p.k_strides.row, kc, d, t.kt);
    load_rows(kptr, p.dtype, p.k_strides.row, kc, d, t.kf);
    load_rows_transposed(elem_ptr(p.v, offset_of(p.v_strides, b, row0_k, k0, hk), p.dtype), p.dtype,
                         p.v_strides.row, kc, dv, t.vt);
    const bool full = p_and_ds(p, mask, t, rows, kc, q0, k0);
    if (full || all_finite(t.kf, static_cast<int64_t>(kc) * d)) {
      pv_tile(t.ds, rows, kc, t.kf, d, dq);  // dQ += dU·K
    } else {  // split tile with a NaN/inf in K: each row sums only its own keys (masked = absent, not 0·k)
      for (int i = 0; i < rows; ++i) {
        pv_row_visible(t.ds + static_cast<int64_t>(i) * kBlockN, kc, t.kf, d, dq + static_cast<int64_t>(i) * d,
                       mask.row_first(q0 + i) - k0, mask.row_last(q0 + i) - k0, t.zeros);
      }
    }
  }
  for (int i = 0; i < rows; ++i) {
    const float* src = dq + static_cast<int64_t>(i) * d;
    for (int c = 0; c < d; ++c) t.tmp[c] = src[c] * p.softmax_scale;
    store_row(t.tmp, d, elem_ptr(p.dq, offset_of(p.dq_strides, b, row0_q, q0 + i, h), p.dtype), p.dtype);
  }
}

FLASHKV_CPU_CLONES
void rowsum_item(const core::AttentionProblem& p, std::vector<float>& dbuf, int64_t b, int64_t h, float* ws) {
  const int dv = static_cast<int>(p.head_dim_v);
  const int64_t row0_q = p.q_begin(b);
  float* o = ws;
  float* g = ws + dv;
  float* dh = dbuf.data() + h * p.total_q;
  for (int64_t i = 0; i < p.seqlen_q_of(b); ++i) {
    load_rows(elem_ptr(p.out, offset_of(p.out_strides, b, row0_q, i, h), p.dtype), p.dtype, 0, 1, dv, o);
    load_rows(elem_ptr(p.dout, offset_of(p.dout_strides, b, row0_q, i, h), p.dtype), p.dtype, 0, 1, dv, g);
    float acc = 0.0f;
    for (int c = 0; c < dv; ++c) acc += o[c] * g[c];
    dh[d_row(p, b, i)] = acc;
  }
}

}  // namespace

void backward(const core::AttentionProblem& p) {
  const int threads = thread_count(p);
  const int64_t per_thread = scratch_floats(p.head_dim, p.head_dim_v);
  std::vector<float> scratch(static_cast<std::size_t>(per_thread) * threads);
  std::vector<float> dbuf(static_cast<std::size_t>(p.num_heads * p.total_q));
  const int64_t num_qb = (p.max_seqlen_q + kBwdBlockM - 1) / kBwdBlockM;
  const int64_t num_kb = (p.max_seqlen_k + kBlockN - 1) / kBlockN;
  const int64_t bh = p.batch * p.num_heads;
  const int64_t kv_items = p.batch * p.num_heads_kv * num_kb;
  const int64_t q_items = bh * num_qb;
#pragma omp parallel num_threads(threads)
  {
    float* ws = scratch.data() + per_thread * thread_id();
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < bh; ++it) rowsum_item(p, dbuf, it / p.num_heads, it % p.num_heads, ws);
    // (implicit barrier: D complete before the passes that read it)
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t it = 0; it < kv_items; ++it) {
      const int64_t kb = it % num_kb;
      const int64_t b = it / num_kb / p.num_heads_kv;
      const int64_t hk = it / num_kb % p.num_heads_kv;
      if (kb * kBlockN < p.seqlen_k_of(b)) dkdv_item(p, dbuf, b, hk, kb * kBlockN, ws);
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < q_items; ++it) {
      const int64_t qb = num_qb - 1 - it % num_qb;
      const int64_t b = it / num_qb / p.num_heads;
      const int64_t h = it / num_qb % p.num_heads;
      if (qb * kBwdBlockM < p.seqlen_q_of(b)) dq_item(p, dbuf, b, h, qb * kBwdBlockM, ws);
    }
  }
}

}  // namespace flashkv::cpu
