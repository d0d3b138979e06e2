/* ref_attention.h — float64 reference attention for the C ABI tests, written from the definitions in
 * include/flashkv/attention.hpp with an explicit boolean visibility mask (independent of the library's masking code).
 * Layout: all arrays contiguous bshd: q [b][sq][h][d], k [b][sk][hkv][d], v [b][sk][hkv][dv], out/dout [b][sq][h][dv],
 * lse [b][h][sq] (natural log; -INFINITY for a row with no visible key). */
#ifndef FLASHKV_TESTS_REF_ATTENTION_H_
#define FLASHKV_TESTS_REF_ATTENTION_H_

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int b, sq, sk, h, hkv, d, dv;
  int causal, wl, wr; /* window sizes in tokens, -1 = unbounded */
  double softcap;     /* 0 = off */
  double scale;
} ref_cfg;

/* visible(i, j) with shift = sk - sq: bottom-right aligned; causal == window_size_right 0. */
static int ref_visible(const ref_cfg* c, int i, int j) {
  const int shift = c->sk - c->sq;
  const int wr = c->causal ? 0 : c->wr;
  const int left_ok = c->wl < 0 || j >= i + shift - c->wl;
  const int right_ok = wr < 0 || j <= i + shift + wr;
  return left_ok && right_ok;
}

/* raw = q·k · scale; returns the (optionally softcapped) score and d(score)/d(raw) in *dscore. */
static double ref_score(const ref_cfg* c, const double* qi, const double* kj, double* dscore) {
  double raw = 0.0;
  for (int x = 0; x < c->d; ++x) raw += qi[x] * kj[x];
  raw *= c->scale;
  if (c->softcap > 0.0) {
    const double t = tanh(raw / c->softcap);
    if (dscore) *dscore = 1.0 - t * t;
    return c->softcap * t;
  }
  if (dscore) *dscore = 1.0;
  return raw;
}

#define REF_Q(c, q, bi, i, hi) ((q) + ((((size_t)(bi) * (c)->sq + (i)) * (c)->h + (hi)) * (c)->d))
#define REF_K(c, k, bi, j, hk) ((k) + ((((size_t)(bi) * (c)->sk + (j)) * (c)->hkv + (hk)) * (c)->d))
#define REF_V(c, v, bi, j, hk) ((v) + ((((size_t)(bi) * (c)->sk + (j)) * (c)->hkv + (hk)) * (c)->dv))
#define REF_O(c, o, bi, i, hi) ((o) + ((((size_t)(bi) * (c)->sq + (i)) * (c)->h + (hi)) * (c)->dv))

/* Probabilities P[j] of row (bi, hi, i) into p (length sk; 0 where masked); returns lse (or -INFINITY). */
static double ref_row_probs(const ref_cfg* c, const double* q, const double* k, int bi, int hi, int i, double* p) {
  const int hk = hi / (c->h / c->hkv);
  double m = -INFINITY;
  for (int j = 0; j < c->sk; ++j) {
    if (ref_visible(c, i, j)) {
      p[j] = ref_score(c, REF_Q(c, q, bi, i, hi), REF_K(c, k, bi, j, hk), NULL);
      if (p[j] > m) m = p[j];
    }
  }
  if (m == -INFINITY) {
    for (int j = 0; j < c->sk; ++j) p[j] = 0.0;
    return -INFINITY;
  }
  double l = 0.0;
  for (int j = 0; j < c->sk; ++j) {
    p[j] = ref_visible(c, i, j) ? exp(p[j] - m) : 0.0;
    l += p[j];
  }
  for (int j = 0; j < c->sk; ++j) p[j] /= l;
  return m + log(l);
}

static void ref_forward(const ref_cfg* c, const double* q, const double* k, const double* v, double* out,
                        double* lse) {
  double* p = (double*)malloc(sizeof(double) * (size_t)(c->sk + 1));
  for (int bi = 0; bi < c->b; ++bi)
    for (int hi = 0; hi < c->h; ++hi)
      for (int i = 0; i < c->sq; ++i) {
        const int hk = hi / (c->h / c->hkv);
        const double l = ref_row_probs(c, q, k, bi, hi, i, p);
        if (lse) lse[((size_t)bi * c->h + hi) * c->sq + i] = l;
        double* o = REF_O(c, out, bi, i, hi);
        for (int x = 0; x < c->dv; ++x) o[x] = 0.0;
        for (int j = 0; j < c->sk; ++j)
          for (int x = 0; x < c->dv; ++x) o[x] += p[j] * REF_V(c, v, bi, j, hk)[x];
      }
  free(p);
}

/* Gradients of sum(out ∘ dout) (dq, dk, dv contiguous like q, k, v; zeroed here). */
static void ref_backward(const ref_cfg* c, const double* q, const double* k, const double* v, const double* dout,
                         double* dq, double* dk, double* dv) {
  memset(dq, 0, sizeof(double) * (size_t)c->b * c->sq * c->h * c->d);
  memset(dk, 0, sizeof(double) * (size_t)c->b * c->sk * c->hkv * c->d);
  memset(dv, 0, sizeof(double) * (size_t)c->b * c->sk * c->hkv * c->dv);
  double* p = (double*)malloc(sizeof(double) * (size_t)(c->sk + 1));
  double* dp = (double*)malloc(sizeof(double) * (size_t)(c->sk + 1));
  for (int bi = 0; bi < c->b; ++bi)
    for (int hi = 0; hi < c->h; ++hi)
      for (int i = 0; i < c->sq; ++i) {
        const int hk = hi / (c->h / c->hkv);
        if (ref_row_probs(c, q, k, bi, hi, i, p) == -INFINITY) continue;
        const double* doi = REF_O(c, dout, bi, i, hi);
        double dsum = 0.0; /* D = sum_j P_j dP_j = dout · out */
        for (int j = 0; j < c->sk; ++j) {
          dp[j] = 0.0;
          for (int x = 0; x < c->dv; ++x) dp[j] += doi[x] * REF_V(c, v, bi, j, hk)[x];
          dsum += p[j] * dp[j];
        }
        for (int j = 0; j < c->sk; ++j) {
          if (p[j] == 0.0) continue;
          double dscore = 1.0;
          (void)ref_score(c, REF_Q(c, q, bi, i, hi), REF_K(c, k, bi, j, hk), &dscore);
          const double draw = p[j] * (dp[j] - dsum) * dscore * c->scale;
          for (int x = 0; x < c->d; ++x) {
            REF_Q(c, dq, bi, i, hi)[x] += draw * REF_K(c, k, bi, j, hk)[x];
            REF_K(c, dk, bi, j, hk)[x] += draw * REF_Q(c, q, bi, i, hi)[x];
          }
          for (int x = 0; x < c->dv; ++x) REF_V(c, dv, bi, j, hk)[x] += p[j] * doi[x];
        }
      }
  free(p);
  free(dp);
}

#endif /* FLASHKV_TESTS_REF_ATTENTION_H_ */
