// PagedKVCache::attention — attention of query tokens against the packed cache, computed tile by tile.
//
// Work decomposition (flash-decoding; Dao, Haziza, Massa, Sizov, "Flash-Decoding for long-context inference", 2023):
// one task per (sequence, kv-head, split of the visible key range). A task holds the g = num_heads / num_heads_kv
// query heads × n_q query tokens that share the kv-head (GQA packing), walks its key range in tiles (a page of the
// quantized stream, or a run of sink / residual slots), decodes each K and V tile once into a small float buffer in
// the codec's factored form (KVCodec::decode_factored: raw codes plus per-token scale / min, or KIVI's per-channel
// scale / min, applied once per key on the score or on p instead of once per element) and updates an online softmax
// (running max m, sum l, unnormalized accumulator; FlashAttention,
// Dao et al. 2022, Alg. 1). Splits are merged with their log-sum-exp: M = max m_s, L = Σ l_s·e^{m_s−M},
// out = Σ acc_s·e^{m_s−M} / L, lse = M + log L. The whole cache is never dequantized at once.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include <omp.h>

#include "core/float16.hpp"
#include "core/mask.hpp"
#include "core/validate.hpp"
#include "cpu/online_softmax.hpp"
#include "cpu/tile_math.hpp"
#include "kvcache/cache_impl.hpp"

namespace flashkv {

namespace {

constexpr int64_t kTile = 64;  // max tokens per decoded tile

float load_q(const TensorView& t, int64_t i, int64_t h, int64_t c) {
  const int64_t off = i * t.strides[0] + h * t.strides[1] + c * t.strides[2];
  switch (t.dtype) {
    case DType::float32: return static_cast<const float*>(t.data)[off];
    case DType::float16: return fp16_to_float(static_cast<const uint16_t*>(t.data)[off]);
    default: return bf16_to_float(static_cast<const uint16_t*>(t.data)[off]);
  }
}

void store_out(const TensorView& t, int64_t i, int64_t h, int64_t c, float x) {
  const int64_t off = i * t.strides[0] + h * t.strides[1] + c * t.strides[2];
  switch (t.dtype) {
    case DType::float32: static_cast<float*>(t.data)[off] = x; break;
    case DType::float16: static_cast<uint16_t*>(t.data)[off] = float_to_fp16(x); break;
    default: static_cast<uint16_t*>(t.data)[off] = float_to_bf16(x); break;
  }
}

struct Task {
  int32_t b;         // index into seq_ids
  int32_t hk;        // kv head
  int64_t k0, k1;    // key positions
  int64_t part;      // offset (in rows) of this task's partial results
};

/// o[0..len) += Σ_{j < cols} w[j] · v[j·ld + 0..len) (one output row over a slice of channels; cpu::pv_row with a
/// leading dimension). Four keys per pass.
FLASHKV_ALWAYS_INLINE void pv_slice(const float* __restrict w, int cols, const float* __restrict v, int64_t ld,
                                    int64_t len, float* __restrict o) {
  int j = 0;
  for (; j + 4 <= cols; j += 4) {
    const float w0 = w[j], w1 = w[j + 1], w2 = w[j + 2], w3 = w[j + 3];
    const float* v0 = v + j * ld;
    const float* v1 = v0 + ld;
    const float* v2 = v1 + ld;
    const float* v3 = v2 + ld;
    for (int64_t c = 0; c < len; ++c) o[c] += w0 * v0[c] + w1 * v1[c] + w2 * v2[c] + w3 * v3[c];
  }
  for (; j < cols; ++j) {
    const float wj = w[j];
    const float* vj = v + j * ld;
    for (int64_t c = 0; c < len; ++c) o[c] += wj * vj[c];
  }
}

/// Scratch of one worker: scores [g][kTile], V weights [kTile], per-channel-scaled queries [g][d] and biases [g].
struct Scratch {
  float* sc;
  float* w;
  float* qe;
  float* bias;
};

/// One decoded K/V tile [t0, t1) in factored form (kv::FactoredTile) against the query rows of one task (GQA group ×
/// query tokens). Rows are r = qi·g + hh; row qi sees the keys [row_first(qi), row_last(qi)) of `rule`.
///   scores: s = alpha_j · (q ⊙ cs)·raw_j + beta_j · Σq + q·cz — the affine part of K applied once per key (or, for
///           KIVI keys, folded into q once per tile) instead of once per element; four rows share each raw K row.
///   O += P·V̂ (online softmax, src/cpu/online_softmax.hpp) as Σ_j (p_j·alpha_jg)·raw_j + (Σ_j p_j·beta_jg) per channel
///           group g of V.
/// The same float32 math as on the dequantized tile up to float32 rounding. Compiled for AVX-512 / AVX2 / baseline.
/// Sum of 16 lanes by halving (vector shuffles + adds; an `omp simd` reduction of four accumulators is lowered by GCC
/// to 16 dependent scalar adds each).
FLASHKV_ALWAYS_INLINE float hsum16(float* a) {
  for (int l = 0; l < 8; ++l) a[l] += a[l + 8];
  for (int l = 0; l < 4; ++l) a[l] += a[l + 4];
  return (a[0] + a[2]) + (a[1] + a[3]);
}

/// sc[h·kTile + j] = q_h · k_j for the g query rows qg [g][d] and keys kb [cnt][d].
FLASHKV_ALWAYS_INLINE void scores_rows(const float* qg, int64_t g, int64_t d, const float* kb, int cnt, float* sc) {
  int64_t h0 = 0;
  if (d % 16 == 0) {
    for (; h0 + 4 <= g; h0 += 4) {  // four query rows share every K row load, 16 lanes per row
      const float* q0 = qg + h0 * d;
      const float* q1 = q0 + d;
      const float* q2 = q1 + d;
      const float* q3 = q2 + d;
      float* s0 = sc + h0 * kTile;
      for (int j = 0; j < cnt; ++j) {
        const float* kr = kb + j * d;
        float a0[16] = {}, a1[16] = {}, a2[16] = {}, a3[16] = {};
        for (int64_t c = 0; c < d; c += 16) {
          for (int l = 0; l < 16; ++l) {
            const float k = kr[c + l];
            a0[l] += q0[c + l] * k;
            a1[l] += q1[c + l] * k;
            a2[l] += q2[c + l] * k;
            a3[l] += q3[c + l] * k;
          }
        }
        s0[j] = hsum16(a0);
        s0[kTile + j] = hsum16(a1);
        s0[2 * kTile + j] = hsum16(a2);
        s0[3 * kTile + j] = hsum16(a3);
      }
    }
  }
  for (; h0 + 4 <= g; h0 += 4) {  // four query rows share every K row load (decode: g = 4 rows per kv-head)
    const float* q0 = qg + h0 * d;
    const float* q1 = q0 + d;
    const float* q2 = q1 + d;
    const float* q3 = q2 + d;
    float* s0 = sc + h0 * kTile;
    for (int j = 0; j < cnt; ++j) {
      const float* kr = kb + j * d;
      float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
#pragma omp simd reduction(+ : d0, d1, d2, d3)
      for (int64_t c = 0; c < d; ++c) {
        const float k = kr[c];
        d0 += q0[c] * k;
        d1 += q1[c] * k;
        d2 += q2[c] * k;
        d3 += q3[c] * k;
      }
      s0[j] = d0;
      s0[kTile + j] = d1;
      s0[2 * kTile + j] = d2;
      s0[3 * kTile + j] = d3;
    }
  }
  for (; h0 < g; ++h0) {
    const float* qr = qg + h0 * d;
    float* s0 = sc + h0 * kTile;
    for (int j = 0; j < cnt; ++j) {
      const float* kr = kb + j * d;
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < d; ++c) dot += qr[c] * kr[c];
      s0[j] = dot;
    }
  }
}

FLASHKV_CPU_CLONES
void tile_update(const core::MaskRule& rule, int64_t qa, int64_t qb, int64_t g, int64_t d, int64_t t0, int64_t t1,
                 const float* qrow, const float* qsum, const kv::FactoredTile& K, const kv::FactoredTile& V,
                 float softcap, float* acc, float* mm, float* ll, const Scratch& scr) {
  float* sc = scr.sc;
  const int64_t nt = t1 - t0;
  for (int64_t qi = qa; qi < qb; ++qi) {
    const int64_t j0 = std::max(t0, rule.row_first(qi)), j1 = std::min(t1, rule.row_last(qi));
    if (j1 <= j0) continue;
    const int cnt = static_cast<int>(j1 - j0);
    const float* qg = qrow + qi * g * d;
    if (!K.per_channel) {
      scores_rows(qg, g, d, K.raw + (j0 - t0) * d, cnt, sc);
    } else {  // KIVI keys, per token group u: q' = q ⊙ scale_u, score = q'·codes + q·min_u
      for (int64_t u0 = (j0 - t0) / K.tokens * K.tokens; u0 < j1 - t0; u0 += K.tokens) {
        const int64_t a0 = std::max(u0, j0 - t0), a1 = std::min(u0 + K.tokens, j1 - t0);
        const float* cs = K.cs + (u0 / K.tokens) * d;
        const float* cz = K.cz + (u0 / K.tokens) * d;
        for (int64_t hh = 0; hh < g; ++hh) {
          const float* qr = qg + hh * d;
          float* qe = scr.qe + hh * d;
          float b = 0.0f;
#pragma omp simd reduction(+ : b)
          for (int64_t c = 0; c < d; ++c) {
            qe[c] = qr[c] * cs[c];
            b += qr[c] * cz[c];
          }
          scr.bias[hh] = b;
        }
        const int64_t off = a0 - (j0 - t0);
        scores_rows(scr.qe, g, d, K.raw + a0 * d, static_cast<int>(a1 - a0), sc + off);
        for (int64_t hh = 0; hh < g; ++hh) {
          float* srow = sc + hh * kTile + off;
          const float b = scr.bias[hh];
          for (int64_t j = 0; j < a1 - a0; ++j) srow[j] += b;
        }
      }
    }
    for (int64_t hh = 0; hh < g; ++hh) {
      const int64_t r = qi * g + hh;
      float* srow = sc + hh * kTile;
      if (K.group > 0) {  // per-token K factors (group == head_dim for keys)
        const float* al = K.alpha + (j0 - t0);
        const float* be = K.beta + (j0 - t0);
        const float qs = qsum[r];
        for (int j = 0; j < cnt; ++j) srow[j] = al[j] * srow[j] + be[j] * qs;
      }
      if (softcap > 0.0f) {
        for (int j = 0; j < cnt; ++j) srow[j] = softcap * std::tanh(srow[j] / softcap);
      }
      cpu::OnlineSoftmaxRow st{mm[r], ll[r]};
      float* a = acc + r * d;
      const float alpha = cpu::online_softmax_scores_to_p(st, srow, cnt);
      if (alpha != 1.0f) {
        for (int64_t c = 0; c < d; ++c) a[c] *= alpha;
      }
      const float* vb = V.raw + (j0 - t0) * d;
      if (V.group == 0) {
        cpu::pv_row(srow, cnt, vb, static_cast<int>(d), a);
      } else {
        const int64_t gs = V.group, ngv = d / gs;
        for (int64_t gi = 0; gi < ngv; ++gi) {
          const float* al = V.alpha + gi * nt + (j0 - t0);
          const float* be = V.beta + gi * nt + (j0 - t0);
          float z = 0.0f;
#pragma omp simd reduction(+ : z)
          for (int j = 0; j < cnt; ++j) {
            scr.w[j] = srow[j] * al[j];
            z += srow[j] * be[j];
          }
          float* ag = a + gi * gs;
          pv_slice(scr.w, cnt, vb + gi * gs, d, gs, ag);
          for (int64_t c = 0; c < gs; ++c) ag[c] += z;
        }
      }
      mm[r] = st.m;
      ll[r] = st.l;
    }
  }
}

}  // namespace

void PagedKVCache::attention(std::span<const int64_t> seq_ids, std::span<const int32_t> cu_seqlens_q, int32_t layer,
                             const TensorView& q, const TensorView& out, const TensorView* lse,
                             const KVAttentionOptions& options) const {
  const Impl& m = *impl_;
  const int64_t H = m.cfg.num_heads_kv, d = m.cfg.head_dim;
  m.check_layer(layer);
  const int64_t batch = static_cast<int64_t>(seq_ids.size());
  if (static_cast<int64_t>(cu_seqlens_q.size()) != batch + 1) {
    throw Error("cu_seqlens_q", "batch + 1 = " + std::to_string(batch + 1) + " entries",
                std::to_string(cu_seqlens_q.size()));
  }
  core::check_rank_and_layout(q, "q", 3, "[total_q, num_heads, head_dim]");
  if (q.dtype != DType::float32 && q.dtype != DType::float16 && q.dtype != DType::bfloat16) {
    throw TypeError("q.dtype", "float32, float16 or bfloat16", dtype_name(q.dtype));
  }
  if (q.device != Device::cpu) throw TypeError("q.device", "cpu", device_name(q.device));
  const int64_t total_q = q.shape[0], num_heads = q.shape[1];
  core::check_dim(q, "q", 2, d, "head_dim");
  if (num_heads < 1 || num_heads % H != 0) {
    throw Error("q", "num_heads (shape[1]) a positive multiple of num_heads_kv " + std::to_string(H),
                std::to_string(num_heads));
  }
  if (cu_seqlens_q[0] != 0) throw Error("cu_seqlens_q", "cu_seqlens_q[0] == 0", std::to_string(cu_seqlens_q[0]));
  for (int64_t b = 0; b < batch; ++b) {
    if (cu_seqlens_q[b + 1] < cu_seqlens_q[b]) {
      throw Error("cu_seqlens_q", "non-decreasing values", "cu_seqlens_q[" + std::to_string(b + 1) + "] = " +
                  std::to_string(cu_seqlens_q[b + 1]) + " < " + std::to_string(cu_seqlens_q[b]));
    }
    (void)m.seq(seq_ids[b], "seq_ids");
  }
  if (cu_seqlens_q[batch] != total_q) {
    throw Error("cu_seqlens_q", "last entry == q.shape[0] = " + std::to_string(total_q),
                std::to_string(cu_seqlens_q[batch]));
  }
  core::check_rank_and_layout(out, "out", 3, "[total_q, num_heads, head_dim]");
  core::check_dtype(out, "out", q.dtype);
  if (out.device != Device::cpu) throw TypeError("out.device", "cpu", device_name(out.device));
  core::check_dim(out, "out", 0, total_q, "total_q");
  core::check_dim(out, "out", 1, num_heads, "num_heads");
  core::check_dim(out, "out", 2, d, "head_dim");
  if (lse != nullptr) {
    if (lse->ndim != 2) throw Error("lse", "2 dimensions [num_heads, total_q]", lse->describe());
    core::check_dtype(*lse, "lse", DType::float32);
    if (lse->device != Device::cpu) throw TypeError("lse.device", "cpu", device_name(lse->device));
    core::check_dim(*lse, "lse", 0, num_heads, "num_heads");
    core::check_dim(*lse, "lse", 1, total_q, "total_q");
    core::check_data(*lse, "lse");
  }
  core::check_data(q, "q");
  core::check_data(out, "out");
  const float scale = options.softmax_scale.value_or(1.0f / std::sqrt(static_cast<float>(d)));
  if (!std::isfinite(scale) || scale <= 0.0f) {
    throw Error("options.softmax_scale", "finite and > 0", std::to_string(scale));
  }
  if (options.window_size_left < -1) {
    throw Error("options.window_size_left", ">= -1", std::to_string(options.window_size_left));
  }
  if (!std::isfinite(options.softcap) || options.softcap < 0.0f) {
    throw Error("options.softcap", "finite and >= 0", std::to_string(options.softcap));
  }
  if (options.num_splits < 0 || options.num_splits > 1024) {
    throw Error("options.num_splits", "0..1024", std::to_string(options.num_splits));
  }
  if (options.num_threads < 0) throw Error("options.num_threads", ">= 0", std::to_string(options.num_threads));
  if (total_q == 0) return;

  const int64_t g = num_heads / H;
  const int threads = options.num_threads > 0 ? options.num_threads : omp_get_max_threads();

  // ---- tasks --------------------------------------------------------------------------------------------------------
  std::vector<const Impl::Seq*> seqp(static_cast<size_t>(batch));
  std::vector<core::MaskRule> rules(static_cast<size_t>(batch));
  std::vector<Task> tasks;
  std::vector<int64_t> task_begin(static_cast<size_t>(batch * H + 1), 0);  // tasks of (b, hk)
  int64_t part_rows = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const Impl::Seq& s = m.seq(seq_ids[b]);
    seqp[static_cast<size_t>(b)] = &s;
    const int64_t n = s.n[static_cast<size_t>(layer)], nqb = cu_seqlens_q[b + 1] - cu_seqlens_q[b];
    core::MaskRule rule{nqb, n, options.window_size_left, options.causal ? 0 : -1};
    rules[static_cast<size_t>(b)] = rule;
    int64_t lo = 0, hi = 0;
    rule.block_key_range(0, nqb, &lo, &hi);
    const int64_t len = std::max<int64_t>(hi - lo, 0);
    int64_t ns = options.num_splits;
    if (ns == 0) {
      const int64_t want = (2 * threads + batch * H - 1) / (batch * H);
      ns = std::min<int64_t>(want, len / 512);
    }
    ns = std::max<int64_t>(1, std::min<int64_t>(ns, (len + 15) / 16));
    const int64_t chunk = ((len + ns - 1) / ns + 15) / 16 * 16;
    for (int64_t hk = 0; hk < H; ++hk) {
      task_begin[static_cast<size_t>(b * H + hk)] = static_cast<int64_t>(tasks.size());
      if (nqb == 0) continue;
      int64_t k0 = lo;
      do {
        const int64_t k1 = std::min(hi, k0 + chunk);
        tasks.push_back(Task{static_cast<int32_t>(b), static_cast<int32_t>(hk), k0, std::max(k0, k1), part_rows});
        part_rows += g * nqb;
        k0 = k1;
      } while (k0 < hi);
    }
  }
  task_begin[static_cast<size_t>(batch * H)] = static_cast<int64_t>(tasks.size());
  std::vector<float> part_acc(static_cast<size_t>(part_rows * d));
  std::vector<float> part_m(static_cast<size_t>(part_rows)), part_l(static_cast<size_t>(part_rows));

  // ---- per-task online softmax over tiles ---------------------------------------------------------------------------
  const float softcap = options.softcap;
  const int64_t ntasks = static_cast<int64_t>(tasks.size());
#pragma omp parallel num_threads(threads)
  {
    // K and V tiles in factored form: raw [kTile][d], alpha / beta [groups][n], cs / cz [kTile / 16][d]
    std::vector<float> kbuf(static_cast<size_t>(kTile * d * 3 + 2 * (kTile / 16) * d)), vbuf(kbuf.size());
    auto tile_of = [&](std::vector<float>& b) {
      kv::FactoredTile t;
      t.raw = b.data();
      t.alpha = t.raw + kTile * d;
      t.beta = t.alpha + kTile * d;
      t.cs = t.beta + kTile * d;
      t.cz = t.cs + (kTile / 16) * d;
      return t;
    };
    kv::FactoredTile kft = tile_of(kbuf), vft = tile_of(vbuf);
    std::vector<float> scratch(static_cast<size_t>(kTile * g + kTile + g * d + g));
    const Scratch scr{scratch.data(), scratch.data() + kTile * g, scratch.data() + kTile * g + kTile,
                      scratch.data() + kTile * g + kTile + g * d};
    std::vector<float> qrow, qsum;
#pragma omp for schedule(dynamic, 1)
    for (int64_t ti = 0; ti < ntasks; ++ti) {
      const Task& T = tasks[static_cast<size_t>(ti)];
      const Impl::Seq& s = *seqp[static_cast<size_t>(T.b)];
      const core::MaskRule& rule = rules[static_cast<size_t>(T.b)];
      const int64_t nqb = rule.seqlen_q, q_off = cu_seqlens_q[T.b];
      const int64_t rows = g * nqb;
      qrow.resize(static_cast<size_t>(rows * d));
      for (int64_t qi = 0; qi < nqb; ++qi) {
        for (int64_t hh = 0; hh < g; ++hh) {
          float* qr = qrow.data() + (qi * g + hh) * d;
          for (int64_t c = 0; c < d; ++c) qr[c] = load_q(q, q_off + qi, T.hk * g + hh, c);
          if (m.rot_k) hadamard_rotate(qr, static_cast<int32_t>(d), m.rot_signs.data(), false);
          for (int64_t c = 0; c < d; ++c) qr[c] *= scale;
        }
      }
      qsum.resize(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) {
        float sum = 0.0f;
        for (int64_t c = 0; c < d; ++c) sum += qrow[static_cast<size_t>(r * d + c)];
        qsum[static_cast<size_t>(r)] = sum;
      }
      float* acc = part_acc.data() + T.part * d;
      float* mm = part_m.data() + T.part;
      float* ll = part_l.data() + T.part;
      std::fill(acc, acc + rows * d, 0.0f);
      std::fill(mm, mm + rows, -std::numeric_limits<float>::infinity());
      std::fill(ll, ll + rows, 0.0f);
      m.for_each_tile(s, layer, T.k0, T.k1, kTile, [&](int64_t t0, int64_t t1) {
        // rows of this tile's visible band
        int64_t qa = 0, qb = 0;
        rule.block_query_range(t0, t1, &qa, &qb);
        if (qb <= qa) return;
        m.decode_range_factored(s, layer, 0, T.hk, t0, t1, kft);
        m.decode_range_factored(s, layer, 1, T.hk, t0, t1, vft);
        tile_update(rule, qa, qb, g, d, t0, t1, qrow.data(), qsum.data(), kft, vft, softcap, acc, mm, ll, scr);
      });
    }
  }

  // ---- merge splits, normalize, rotate back, store -----------------------------------------------------------------
  const int64_t nbh = batch * H;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t bh = 0; bh < nbh; ++bh) {
    const int64_t b = bh / H, hk = bh % H;
    const int64_t t_begin = task_begin[static_cast<size_t>(bh)], t_end = task_begin[static_cast<size_t>(bh + 1)];
    const int64_t nqb = cu_seqlens_q[b + 1] - cu_seqlens_q[b];
    std::vector<float> o(static_cast<size_t>(d));
    for (int64_t r = 0; r < g * nqb; ++r) {
      float M = -std::numeric_limits<float>::infinity();
      for (int64_t t = t_begin; t < t_end; ++t) M = std::max(M, part_m[static_cast<size_t>(tasks[t].part + r)]);
      float L = 0.0f;
      std::fill(o.begin(), o.end(), 0.0f);
      if (M != -std::numeric_limits<float>::infinity()) {
        for (int64_t t = t_begin; t < t_end; ++t) {
          const int64_t pr = tasks[static_cast<size_t>(t)].part + r;
          if (part_m[static_cast<size_t>(pr)] == -std::numeric_limits<float>::infinity()) continue;
          const float w = std::exp(part_m[static_cast<size_t>(pr)] - M);
          L += part_l[static_cast<size_t>(pr)] * w;
          const float* a = part_acc.data() + pr * d;
          for (int64_t c = 0; c < d; ++c) o[static_cast<size_t>(c)] += w * a[c];
        }
      }
      const int64_t qi = r / g, hq = hk * g + r % g;
      if (L > 0.0f) {
        const float inv = 1.0f / L;
        for (int64_t c = 0; c < d; ++c) o[static_cast<size_t>(c)] *= inv;
        if (m.rot_v) hadamard_rotate(o.data(), static_cast<int32_t>(d), m.rot_signs.data(), true);
      }
      const int64_t tq = cu_seqlens_q[b] + qi;
      for (int64_t c = 0; c < d; ++c) store_out(out, tq, hq, c, o[static_cast<size_t>(c)]);
      if (lse != nullptr) {
        const float lv = L > 0.0f ? M + std::log(L) : -std::numeric_limits<float>::infinity();
        static_cast<float*>(lse->data)[hq * lse->strides[0] + tq * lse->strides[1]] = lv;
      }
    }
  }
}

}  // namespace flashkv
