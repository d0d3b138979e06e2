// Tile update of the cache attention (decode_tile.hpp): scores of one K tile against the query rows of a task, online
// softmax (src/cpu/online_softmax.hpp), O += P·V — from packed codes through the fused kernels, or from a tile the
// codec decoded (generic path).
//
// Factored forms (the affine part of a format applied once per key, never per element):
//   K per token:  q·k̂_j = scale_j·(q·code_j) + min_j·Σq            (int8 / int4; fp8: scale_j·(q·fp8_j))
//   KIVI K:       q·k̂_j = (q ⊙ scale_u)·code_j + q·min_u           (per channel, once per group u of G tokens)
//   V per token:  Σ_j p_j·v̂_j = Σ_j (p_j·scale_j)·code_j + (Σ_j p_j·min_j)   per channel group of the format
// so the inner loops are "convert codes + FMA" for every format, as for bf16, but over 1/2–1/8 of the bytes.
#include "kvcache/attention/decode_tile.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu/online_softmax.hpp"
#include "cpu/tile_math.hpp"

namespace flashkv::kv {

namespace {

constexpr int64_t kTile = kDecodeTile;

/// o[0..len) += Σ_{j < cols} w[j] · v[j·ld + 0..len) (one output row over a slice of channels). Four keys per pass.
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

/// Sum of 16 lanes by halving.
FLASHKV_ALWAYS_INLINE float hsum16(float* a) {
  for (int l = 0; l < 8; ++l) a[l] += a[l + 8];
  for (int l = 0; l < 4; ++l) a[l] += a[l + 4];
  return (a[0] + a[2]) + (a[1] + a[3]);
}

/// Generic path: sc[h·kTile + j] = q_h · k_j for the g query rows qg [g][d] and decoded keys kb [cnt][d].
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

/// qe[h][c] = q[h][c]·cs[c], bias[h] = q_h·cz for the g rows (KIVI keys: the per-channel scale folded into q).
FLASHKV_ALWAYS_INLINE void fold_channel_scale(const float* qg, int64_t g, int64_t d, const float* cs, const float* cz,
                                              float* qe, float* bias) {
  for (int64_t hh = 0; hh < g; ++hh) {
    const float* qr = qg + hh * d;
    float* qo = qe + hh * d;
    float b = 0.0f;
#pragma omp simd reduction(+ : b)
    for (int64_t c = 0; c < d; ++c) {
      qo[c] = qr[c] * cs[c];
      b += qr[c] * cz[c];
    }
    bias[hh] = b;
  }
}

/// Scores of rows qi·g .. qi·g + g − 1 against keys [j0, j0 + cnt) (tile-relative) into sc[h·kTile + j − j0].
FLASHKV_ALWAYS_INLINE void tile_scores(const HalfTile& K, int64_t g, int64_t d, int64_t j0, int cnt, const float* qg,
                                       const float* qs, TileScratch& scr) {
  float* sc = scr.sc.data();
  if (K.packed) {
    if (K.scaling == KVScaling::channel_affine) {  // per group u of G tokens: q' = q ⊙ scale_u, bias q·min_u
      const int64_t G = K.kivi_g;
      for (int64_t a0 = j0; a0 < j0 + cnt;) {
        const int64_t slot = K.slot0 + a0, u = slot / G;
        const int64_t a1 = std::min<int64_t>(j0 + cnt, a0 + (u + 1) * G - slot);
        const uint8_t* mg = K.meta + u * K.kivi_meta_bytes;
        fp16_to_float_n(mg, static_cast<int>(d), scr.cs.data());
        fp16_to_float_n(mg + 2 * d, static_cast<int>(d), scr.cz.data());
        fold_channel_scale_n(qg, static_cast<int>(g), static_cast<int>(d), scr.cs.data(), scr.cz.data(), scr.qe.data(),
                             scr.bias.data());
        fused_scores(K.code, scr.qe.data(), static_cast<int>(g), static_cast<int>(d), K.codes + a0 * K.rb, K.rb,
                     static_cast<int>(a1 - a0), sc + (a0 - j0), static_cast<int>(kTile));
        for (int64_t hh = 0; hh < g; ++hh) {
          float* srow = sc + hh * kTile + (a0 - j0);
          const float b = scr.bias[static_cast<size_t>(hh)];
          for (int64_t j = 0; j < a1 - a0; ++j) srow[j] += b;
        }
        a0 = a1;
      }
      return;
    }
    if (K.scaling == KVScaling::token_affine && K.ng > 1) {  // several channel groups: dequantized in registers
      fused_scores(K.code, qg, static_cast<int>(g), static_cast<int>(d), K.codes + j0 * K.rb, K.rb, cnt, sc,
                   static_cast<int>(kTile), scr.ka.data() + j0 * K.ng, scr.kb.data() + j0 * K.ng, K.group);
      return;
    }
    fused_scores(K.code, qg, static_cast<int>(g), static_cast<int>(d), K.codes + j0 * K.rb, K.rb, cnt, sc,
                 static_cast<int>(kTile));
    if (K.scaling == KVScaling::head_static) {
      for (int64_t hh = 0; hh < g; ++hh) {
        float* srow = sc + hh * kTile;
        for (int j = 0; j < cnt; ++j) srow[j] *= K.mul;
      }
    } else if (K.scaling == KVScaling::token_f32) {  // fp8 per-token scale: no zero point
      const float* al = scr.ka.data() + j0;
      for (int64_t hh = 0; hh < g; ++hh) {
        float* srow = sc + hh * kTile;
        for (int j = 0; j < cnt; ++j) srow[j] *= al[j];
      }
    } else if (K.scaling == KVScaling::token_affine) {
      const float* al = scr.ka.data() + j0;
      const float* be = scr.kb.data() + j0;
      for (int64_t hh = 0; hh < g; ++hh) {
        float* srow = sc + hh * kTile;
        const float q_sum = qs[hh];
        for (int j = 0; j < cnt; ++j) srow[j] = al[j] * srow[j] + be[j] * q_sum;
      }
    }
    return;
  }
  const FactoredTile& T = *K.dec;
  if (!T.per_channel) {
    scores_rows(qg, g, d, T.raw + j0 * d, cnt, sc);
    if (T.group > 0) {  // per-token K factors (group == head_dim for keys)
      for (int64_t hh = 0; hh < g; ++hh) {
        float* srow = sc + hh * kTile;
        const float q_sum = qs[hh];
        for (int j = 0; j < cnt; ++j) srow[j] = T.alpha[j0 + j] * srow[j] + T.beta[j0 + j] * q_sum;
      }
    }
    return;
  }
  for (int64_t u0 = j0 / T.tokens * T.tokens; u0 < j0 + cnt; u0 += T.tokens) {  // KIVI keys (decoded codes)
    const int64_t a0 = std::max(u0, j0), a1 = std::min(u0 + T.tokens, j0 + cnt);
    fold_channel_scale(qg, g, d, T.cs + (u0 / T.tokens) * d, T.cz + (u0 / T.tokens) * d, scr.qe.data(),
                       scr.bias.data());
    const int64_t off = a0 - j0;
    scores_rows(scr.qe.data(), g, d, T.raw + a0 * d, static_cast<int>(a1 - a0), sc + off);
    for (int64_t hh = 0; hh < g; ++hh) {
      float* srow = sc + hh * kTile + off;
      for (int64_t j = 0; j < a1 - a0; ++j) srow[j] += scr.bias[static_cast<size_t>(hh)];
    }
  }
}

/// acc rows [g][d] += P·V̂ for p = sc rows, keys [j0, j0 + cnt) of the tile.
FLASHKV_ALWAYS_INLINE void tile_pv(const HalfTile& V, int64_t g, int64_t d, int64_t nt, int64_t j0, int cnt,
                                   float* acc, TileScratch& scr) {
  const float* sc = scr.sc.data();
  if (V.packed) {
    const uint8_t* codes = V.codes + j0 * V.rb;
    if (V.scaling == KVScaling::none) {
      fused_pv(V.code, sc, kTile, 1, static_cast<int>(d), static_cast<int>(g), static_cast<int>(d), codes, V.rb, cnt,
               acc);
      return;
    }
    const int64_t ng = V.scaling == KVScaling::token_affine ? V.ng : 1;
    const bool zero_point = V.scaling == KVScaling::token_affine;
    float* w = scr.w.data();
    pv_weights(sc, kTile, static_cast<int>(g), cnt, scr.va.data() + j0 * ng,
               zero_point ? scr.vb.data() + j0 * ng : nullptr, static_cast<int>(ng), w,
               zero_point ? scr.z.data() : nullptr);
    fused_pv(V.code, w, ng * kTile, ng, zero_point ? V.group : static_cast<int>(d), static_cast<int>(g),
             static_cast<int>(d), codes, V.rb, cnt, acc);
    if (zero_point) {
      const int64_t gs = d / ng;
      for (int64_t hh = 0; hh < g; ++hh) {
        for (int64_t gi = 0; gi < ng; ++gi) {
          float* a = acc + hh * d + gi * gs;
          const float z = scr.z[static_cast<size_t>(hh * ng + gi)];
          for (int64_t c = 0; c < gs; ++c) a[c] += z;
        }
      }
    }
    return;
  }
  const FactoredTile& T = *V.dec;
  const float* vb = T.raw + j0 * d;
  for (int64_t hh = 0; hh < g; ++hh) {
    const float* p = sc + hh * kTile;
    float* a = acc + hh * d;
    if (T.group == 0) {
      cpu::pv_row(p, cnt, vb, static_cast<int>(d), a);
      continue;
    }
    const int64_t gs = T.group, ngv = d / gs;
    for (int64_t gi = 0; gi < ngv; ++gi) {
      const float* al = T.alpha + gi * nt + j0;
      const float* be = T.beta + gi * nt + j0;
      float z = 0.0f;
#pragma omp simd reduction(+ : z)
      for (int j = 0; j < cnt; ++j) {
        scr.w[static_cast<size_t>(j)] = p[j] * al[j];
        z += p[j] * be[j];
      }
      float* ag = a + gi * gs;
      pv_slice(scr.w.data(), cnt, vb + gi * gs, d, gs, ag);
      for (int64_t c = 0; c < gs; ++c) ag[c] += z;
    }
  }
}

/// True when a score is NaN or +inf (either makes the row's softmax NaN: exp(s − max) = exp(inf − inf)).
FLASHKV_ALWAYS_INLINE bool has_nan_or_pos_inf(const float* s, int n) {
  int bad = 0;  // an integer OR: vectorizes
#pragma omp simd reduction(| : bad)
  for (int j = 0; j < n; ++j) bad |= s[j] < std::numeric_limits<float>::infinity() ? 0 : 1;
  return bad != 0;
}

/// The row's state becomes NaN (m, l and every accumulator channel) and stays NaN: out and lse are NaN
/// (include/flashkv/decode.hpp, NON-FINITE VALUES). Later tiles skip the row (p = 0, alpha = 1).
FLASHKV_ALWAYS_INLINE void poison_row(float& m, float& l, float* acc, int64_t d) {
  m = l = std::numeric_limits<float>::quiet_NaN();
  for (int64_t c = 0; c < d; ++c) acc[c] = std::numeric_limits<float>::quiet_NaN();
}

/// Per-token factors of a packed tile (nt tokens) into alpha / beta, token-major [nt][ng]. Inlined into the
/// per-ISA clones of tile_update so the loops vectorize.
FLASHKV_ALWAYS_INLINE void load_factors(const HalfTile& H, int64_t nt, float* alpha, float* beta) {
  if (!H.packed) return;
  if (H.scaling == KVScaling::head_static) {
    for (int64_t t = 0; t < nt; ++t) alpha[t] = H.mul;
  } else if (H.scaling == KVScaling::token_f32) {
    for (int64_t t = 0; t < nt; ++t) {
      float sc;
      std::memcpy(&sc, H.meta + 4 * t, 4);
      alpha[t] = sc * H.mul;
    }
  } else if (H.scaling == KVScaling::token_affine) {
    token_meta(H.meta, static_cast<int>(nt), H.ng, alpha, beta);  // token-major [t][group]
  }
}

}  // namespace

TileScratch::TileScratch(int64_t g, int64_t d)
    : sc(static_cast<size_t>(g * kTile)),
      w(static_cast<size_t>(g * (d / 16 + 1) * kTile)),
      z(static_cast<size_t>(g * (d / 16 + 1))),
      qe(static_cast<size_t>(g * d)),
      bias(static_cast<size_t>(g)),
      ka(static_cast<size_t>((d / 16 + 1) * kTile)),
      kb(ka.size()),
      va(static_cast<size_t>((d / 16 + 1) * kTile)),
      vb(va.size()),
      cs(static_cast<size_t>(d)),
      cz(static_cast<size_t>(d)) {}

FLASHKV_CPU_CLONES
void tile_update(const core::MaskRule& rule, int64_t qa, int64_t qb, int64_t g, int64_t d, int64_t t0, int64_t t1,
                 const float* qrow, const float* qsum, const HalfTile& K, const HalfTile& V, float softcap, float* acc,
                 float* mm, float* ll, TileScratch& scr) {
  const int64_t nt = t1 - t0;
  load_factors(K, nt, scr.ka.data(), scr.kb.data());
  load_factors(V, nt, scr.va.data(), scr.vb.data());
  for (int64_t qi = qa; qi < qb; ++qi) {
    const int64_t j0 = std::max(t0, rule.row_first(qi)), j1 = std::min(t1, rule.row_last(qi));
    if (j1 <= j0) continue;
    const int cnt = static_cast<int>(j1 - j0);
    const int64_t r0 = qi * g;
    tile_scores(K, g, d, j0 - t0, cnt, qrow + r0 * d, qsum + r0, scr);
    if (softcap > 0.0f) {
      for (int64_t hh = 0; hh < g; ++hh) {
        float* srow = scr.sc.data() + hh * kTile;
        for (int j = 0; j < cnt; ++j) srow[j] = softcap * std::tanh(srow[j] / softcap);
      }
    }
    if (K.packed) {  // fused tile: vectorized softmax step (AVX-512; it poisons rows with a NaN / +inf score itself)
      float* al = scr.bias.data();
      softmax_rows(scr.sc.data(), kTile, static_cast<int>(g), cnt, mm + r0, ll + r0, al);
      for (int64_t hh = 0; hh < g; ++hh) {
        if (al[hh] != 1.0f) {
          float* a = acc + (r0 + hh) * d;
          for (int64_t c = 0; c < d; ++c) a[c] *= al[hh];
        }
      }
      tile_pv(V, g, d, nt, j0 - t0, cnt, acc + r0 * d, scr);
      continue;
    }
    for (int64_t hh = 0; hh < g; ++hh) {
      const int64_t r = r0 + hh;
      float* srow = scr.sc.data() + hh * kTile;
      if (std::isnan(mm[r]) || has_nan_or_pos_inf(srow, cnt)) {  // poisoned (now or before): p = 0, NaN state
        if (!std::isnan(mm[r])) poison_row(mm[r], ll[r], acc + r * d, d);
        for (int j = 0; j < cnt; ++j) srow[j] = 0.0f;
        continue;
      }
      cpu::OnlineSoftmaxRow st{mm[r], ll[r]};
      const float alpha = cpu::online_softmax_scores_to_p(st, srow, cnt);
      if (alpha != 1.0f) {
        float* a = acc + r * d;
        for (int64_t c = 0; c < d; ++c) a[c] *= alpha;
      }
      mm[r] = st.m;
      ll[r] = st.l;
    }
    tile_pv(V, g, d, nt, j0 - t0, cnt, acc + r0 * d, scr);
  }
}

}  // namespace flashkv::kv
