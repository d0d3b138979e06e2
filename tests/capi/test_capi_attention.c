/* C ABI attention tests, written in C11 against include/flashkv/flashkv.h only.
 * Values are checked against the float64 reference in ref_attention.h (explicit boolean mask) on fresh random inputs;
 * the seed is printed and FLASHKV_TEST_SEED overrides it. Every error path checks the status code and that
 * flashkv_last_error() names the argument. Ends with the line "N passed, M failed"; exit code 1 on any failure. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "capi_check.h"
#include "flashkv/flashkv.h"
#include "ref_attention.h"

/* ---- random numbers (splitmix64) ---------------------------------------------------------------------------- */
static uint64_t g_rng = 0;
static double uniform(void) { /* [-1, 1) */
  uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* ---- bfloat16 (round to nearest even) ------------------------------------------------------------------------ */
static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* ---- tensors ------------------------------------------------------------------------------------------------- */
static flashkv_tensor tensor_nd(void* data, int32_t dtype, int ndim, const int64_t* shape) {
  flashkv_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dtype;
  t.device = FLASHKV_DEVICE_CPU;
  t.ndim = ndim;
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    t.shape[d] = shape[d];
    t.strides[d] = stride;
    stride *= shape[d];
  }
  return t;
}
static flashkv_tensor tensor4(void* data, int32_t dtype, int64_t a, int64_t b, int64_t c, int64_t d) {
  const int64_t s[4] = {a, b, c, d};
  return tensor_nd(data, dtype, 4, s);
}
static flashkv_tensor tensor3(void* data, int32_t dtype, int64_t a, int64_t b, int64_t c) {
  const int64_t s[3] = {a, b, c};
  return tensor_nd(data, dtype, 3, s);
}
static flashkv_tensor tensor1(void* data, int32_t dtype, int64_t a) { return tensor_nd(data, dtype, 1, &a); }

/* n random floats in [-amp, amp) into f, and the same values as doubles into d. */
static void fill(float* f, double* d, size_t n, double amp) {
  for (size_t i = 0; i < n; ++i) {
    f[i] = (float)(amp * uniform());
    d[i] = (double)f[i];
  }
}

/* max |a - ref| / max(1, max |ref|) over n elements. */
static double rel_err_f(const float* a, const double* ref, size_t n) {
  double err = 0.0, mag = 1.0;
  for (size_t i = 0; i < n; ++i) {
    const double e = fabs((double)a[i] - ref[i]);
    if (!(e <= err)) err = e; /* NaN propagates as a failure */
    if (fabs(ref[i]) > mag) mag = fabs(ref[i]);
  }
  return err / mag;
}

/* lse: -inf must match exactly, finite values within tol (absolute, lse is a log). */
static int lse_ok(const float* a, const double* ref, size_t n, double tol) {
  for (size_t i = 0; i < n; ++i) {
    if (ref[i] == -INFINITY) {
      if (!(a[i] == -INFINITY)) return 0;
    } else if (!(fabs((double)a[i] - ref[i]) <= tol * (1.0 + fabs(ref[i])))) {
      return 0;
    }
  }
  return 1;
}

static int message_names(const char* arg) {
  const char* msg = flashkv_last_error();
  char pat[64];
  snprintf(pat, sizeof pat, "'%s", arg);
  const char* hit = strstr(msg, pat);
  while (hit) {
    const char next = hit[strlen(pat)];
    if (next == '\'' || next == '.' || next == '[') return 1;
    hit = strstr(hit + 1, pat);
  }
  return 0;
}

static flashkv_attention_options options_for(const ref_cfg* c, int algorithm) {
  flashkv_attention_options o;
  flashkv_status st = flashkv_attention_options_default(&o);
  CHECK(st == FLASHKV_OK, "options_default failed: %s", flashkv_last_error());
  o.has_softmax_scale = 1;
  o.softmax_scale = (float)c->scale;
  o.causal = c->causal;
  o.window_size_left = c->wl;
  o.window_size_right = c->wr;
  o.softcap = (float)c->softcap;
  o.algorithm = algorithm;
  return o;
}

static const char* algo_name(int a) { return a == FLASHKV_ALGO_TILED ? "tiled" : a == FLASHKV_ALGO_V1_ORDER ? "v1" : "naive"; }

/* ---- fixed-length forward + backward (float32) ----------------------------------------------------------------- */
static void run_fixed_case(const char* name, ref_cfg c, int with_backward, int pad_q) {
  const size_t nq = (size_t)c.b * c.sq * c.h * c.d, nk = (size_t)c.b * c.sk * c.hkv * c.d;
  const size_t nv = (size_t)c.b * c.sk * c.hkv * c.dv, no = (size_t)c.b * c.sq * c.h * c.dv;
  const size_t nl = (size_t)c.b * c.h * c.sq;
  float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nv * 4), *out = malloc(no * 4), *lse = malloc(nl * 4);
  double *qd = malloc(nq * 8), *kd = malloc(nk * 8), *vd = malloc(nv * 8), *outd = malloc(no * 8), *lsed = malloc(nl * 8);
  fill(q, qd, nq, 2.0);
  fill(k, kd, nk, 2.0);
  fill(v, vd, nv, 1.0);
  ref_forward(&c, qd, kd, vd, outd, lsed);

  /* Optionally pass q as a strided view: each head row padded to d + 5 elements (last dim still contiguous). */
  const int dp = c.d + 5;
  float* qpad = malloc((size_t)c.b * c.sq * c.h * dp * 4);
  flashkv_tensor tq = tensor4(q, FLASHKV_DTYPE_FLOAT32, c.b, c.sq, c.h, c.d);
  if (pad_q) {
    for (size_t r = 0; r < (size_t)c.b * c.sq * c.h; ++r) {
      memcpy(qpad + r * dp, q + r * c.d, (size_t)c.d * 4);
      for (int x = c.d; x < dp; ++x) qpad[r * dp + x] = NAN; /* never read */
    }
    tq.data = qpad;
    tq.strides[2] = dp;
    tq.strides[1] = (int64_t)c.h * dp;
    tq.strides[0] = (int64_t)c.sq * c.h * dp;
  }
  flashkv_tensor tk = tensor4(k, FLASHKV_DTYPE_FLOAT32, c.b, c.sk, c.hkv, c.d);
  flashkv_tensor tv = tensor4(v, FLASHKV_DTYPE_FLOAT32, c.b, c.sk, c.hkv, c.dv);
  flashkv_tensor to = tensor4(out, FLASHKV_DTYPE_FLOAT32, c.b, c.sq, c.h, c.dv);
  flashkv_tensor tl = tensor3(lse, FLASHKV_DTYPE_FLOAT32, c.b, c.h, c.sq);

  for (int a = FLASHKV_ALGO_TILED; a <= FLASHKV_ALGO_NAIVE; ++a) {
    flashkv_attention_options o = options_for(&c, a);
    for (size_t i = 0; i < no; ++i) out[i] = NAN;
    flashkv_status st = flashkv_attention_forward(&tq, &tk, &tv, &to, &tl, &o);
    CHECK(st == FLASHKV_OK, "%s/%s forward: status %d: %s", name, algo_name(a), (int)st, flashkv_last_error());
    const double e = rel_err_f(out, outd, no);
    CHECK(e <= 2e-5, "%s/%s forward: out rel err %.3g > 2e-5", name, algo_name(a), e);
    CHECK(lse_ok(lse, lsed, nl, 1e-5), "%s/%s forward: lse mismatch", name, algo_name(a));
    /* docs/c-abi.md "Which kernel ran": the call names its path */
    char want[64];
    snprintf(want, sizeof want, "attention_forward cpu %s float32", algo_name(a));
    CHECK(strncmp(flashkv_last_kernel_path(), want, strlen(want)) == 0, "%s/%s kernel path: '%s' (want '%s...')",
          name, algo_name(a), flashkv_last_kernel_path(), want);
  }
  /* lse is optional in forward. */
  {
    flashkv_attention_options o = options_for(&c, FLASHKV_ALGO_TILED);
    flashkv_status st = flashkv_attention_forward(&tq, &tk, &tv, &to, NULL, &o);
    CHECK(st == FLASHKV_OK && rel_err_f(out, outd, no) <= 2e-5, "%s forward without lse: %s", name, flashkv_last_error());
  }

  if (with_backward) {
    flashkv_attention_options o = options_for(&c, FLASHKV_ALGO_TILED);
    flashkv_status st = flashkv_attention_forward(&tq, &tk, &tv, &to, &tl, &o);
    float *dout = malloc(no * 4), *dq = malloc(nq * 4), *dk = malloc(nk * 4), *dv = malloc(nv * 4);
    double *doutd = malloc(no * 8), *dqd = malloc(nq * 8), *dkd = malloc(nk * 8), *dvd = malloc(nv * 8);
    fill(dout, doutd, no, 1.0);
    ref_backward(&c, qd, kd, vd, doutd, dqd, dkd, dvd);
    flashkv_tensor tdo = tensor4(dout, FLASHKV_DTYPE_FLOAT32, c.b, c.sq, c.h, c.dv);
    flashkv_tensor tdq = tensor4(dq, FLASHKV_DTYPE_FLOAT32, c.b, c.sq, c.h, c.d);
    flashkv_tensor tdk = tensor4(dk, FLASHKV_DTYPE_FLOAT32, c.b, c.sk, c.hkv, c.d);
    flashkv_tensor tdv = tensor4(dv, FLASHKV_DTYPE_FLOAT32, c.b, c.sk, c.hkv, c.dv);
    st = flashkv_attention_backward(&tq, &tk, &tv, &to, &tl, &tdo, &tdq, &tdk, &tdv, &o);
    CHECK(st == FLASHKV_OK, "%s backward: status %d: %s", name, (int)st, flashkv_last_error());
    const double eq = rel_err_f(dq, dqd, nq), ek = rel_err_f(dk, dkd, nk), ev = rel_err_f(dv, dvd, nv);
    CHECK(eq <= 1e-4 && ek <= 1e-4 && ev <= 1e-4, "%s backward: rel err dq %.3g dk %.3g dv %.3g > 1e-4", name, eq, ek,
          ev);
    free(dout), free(dq), free(dk), free(dv), free(doutd), free(dqd), free(dkd), free(dvd);
  }
  free(q), free(k), free(v), free(out), free(lse), free(qd), free(kd), free(vd), free(outd), free(lsed), free(qpad);
}

/* ---- bfloat16 forward: plumbing of a 16-bit dtype through the ABI ---------------------------------------------- */
static void run_bf16_case(void) {
  ref_cfg c = {1, 29, 41, 2, 1, 64, 64, 1, -1, -1, 0.0, 0.125};
  const size_t nq = (size_t)c.sq * c.h * c.d, nk = (size_t)c.sk * c.d, no = (size_t)c.sq * c.h * c.dv;
  uint16_t *q = malloc(nq * 2), *k = malloc(nk * 2), *v = malloc(nk * 2), *out = malloc(no * 2);
  double *qd = malloc(nq * 8), *kd = malloc(nk * 8), *vd = malloc(nk * 8), *outd = malloc(no * 8);
  for (size_t i = 0; i < nq; ++i) qd[i] = from_bf16(q[i] = to_bf16((float)(2.0 * uniform())));
  for (size_t i = 0; i < nk; ++i) kd[i] = from_bf16(k[i] = to_bf16((float)(2.0 * uniform())));
  for (size_t i = 0; i < nk; ++i) vd[i] = from_bf16(v[i] = to_bf16((float)uniform()));
  ref_forward(&c, qd, kd, vd, outd, NULL);
  flashkv_tensor tq = tensor4(q, FLASHKV_DTYPE_BFLOAT16, 1, c.sq, c.h, c.d);
  flashkv_tensor tk = tensor4(k, FLASHKV_DTYPE_BFLOAT16, 1, c.sk, c.hkv, c.d);
  flashkv_tensor tv = tensor4(v, FLASHKV_DTYPE_BFLOAT16, 1, c.sk, c.hkv, c.dv);
  flashkv_tensor to = tensor4(out, FLASHKV_DTYPE_BFLOAT16, 1, c.sq, c.h, c.dv);
  flashkv_attention_options o = options_for(&c, FLASHKV_ALGO_TILED);
  flashkv_status st = flashkv_attention_forward(&tq, &tk, &tv, &to, NULL, &o);
  CHECK(st == FLASHKV_OK, "bf16 forward: status %d: %s", (int)st, flashkv_last_error());
  /* Inputs are exact bf16 values, accumulation is float32 and the output is rounded once to bf16: the error is
   * bounded by one bf16 rounding (2^-8 relative) plus float32 noise. */
  double err = 0.0;
  for (size_t i = 0; i < no; ++i) {
    const double e = fabs((double)from_bf16(out[i]) - outd[i]) / (fabs(outd[i]) + 1e-3);
    if (!(e <= err)) err = e;
  }
  CHECK(err <= 1.0 / 128.0, "bf16 forward: rel err %.3g > 2^-7", err);
  free(q), free(k), free(v), free(out), free(qd), free(kd), free(vd), free(outd);
}

/* ---- varlen: three sequences, one with seqlen_q = 0 and one with seqlen_k = 0 ----------------------------------- */
static void run_varlen_case(void) {
  const int nseq = 3, h = 4, hkv = 2, d = 16;
  const int32_t cuq[4] = {0, 13, 13, 20}, cuk[4] = {0, 17, 26, 26};
  const int64_t tq_n = cuq[nseq], tk_n = cuk[nseq];
  const size_t nq = (size_t)tq_n * h * d, nk = (size_t)tk_n * hkv * d, nl = (size_t)h * tq_n;
  float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *out = malloc(nq * 4), *lse = malloc(nl * 4);
  float *dout = malloc(nq * 4), *dq = malloc(nq * 4), *dk = malloc(nk * 4), *dv = malloc(nk * 4);
  double *qd = malloc(nq * 8), *kd = malloc(nk * 8), *vd = malloc(nk * 8), *doutd = malloc(nq * 8);
  double *outd = malloc(nq * 8), *lsed = malloc(nl * 8), *dqd = malloc(nq * 8), *dkd = malloc(nk * 8),
         *dvd = malloc(nk * 8);
  fill(q, qd, nq, 2.0);
  fill(k, kd, nk, 2.0);
  fill(v, vd, nk, 1.0);
  fill(dout, doutd, nq, 1.0);
  double* row_lse = malloc(sizeof(double) * (size_t)h * (tq_n + 1));
  for (size_t i = 0; i < nk; ++i) dkd[i] = dvd[i] = 0.0;
  for (int s = 0; s < nseq; ++s) { /* reference: each sequence as its own batch of 1, causal */
    ref_cfg c = {1, cuq[s + 1] - cuq[s], cuk[s + 1] - cuk[s], h, hkv, d, d, 1, -1, -1, 0.0, 0.25};
    const size_t qo = (size_t)cuq[s] * h * d, ko = (size_t)cuk[s] * hkv * d;
    ref_forward(&c, qd + qo, kd + ko, vd + ko, outd + qo, row_lse);
    for (int hi = 0; hi < h; ++hi)
      for (int i = 0; i < c.sq; ++i) lsed[(size_t)hi * tq_n + cuq[s] + i] = row_lse[(size_t)hi * c.sq + i];
    ref_backward(&c, qd + qo, kd + ko, vd + ko, doutd + qo, dqd + qo, dkd + ko, dvd + ko);
  }
  ref_cfg c0 = {1, 1, 1, h, hkv, d, d, 1, -1, -1, 0.0, 0.25};
  flashkv_attention_options o = options_for(&c0, FLASHKV_ALGO_TILED);
  flashkv_tensor tq = tensor3(q, FLASHKV_DTYPE_FLOAT32, tq_n, h, d), tk = tensor3(k, FLASHKV_DTYPE_FLOAT32, tk_n, hkv, d);
  flashkv_tensor tv = tensor3(v, FLASHKV_DTYPE_FLOAT32, tk_n, hkv, d), to = tensor3(out, FLASHKV_DTYPE_FLOAT32, tq_n, h, d);
  flashkv_tensor tl = tensor_nd(lse, FLASHKV_DTYPE_FLOAT32, 2, (const int64_t[]){h, tq_n});
  flashkv_tensor tcq = tensor1((void*)cuq, FLASHKV_DTYPE_INT32, nseq + 1), tck = tensor1((void*)cuk, FLASHKV_DTYPE_INT32, nseq + 1);
  flashkv_status st = flashkv_attention_varlen_forward(&tq, &tk, &tv, &tcq, &tck, 13, 17, &to, &tl, &o);
  CHECK(st == FLASHKV_OK, "varlen forward: status %d: %s", (int)st, flashkv_last_error());
  CHECK(rel_err_f(out, outd, nq) <= 2e-5, "varlen forward: out rel err %.3g", rel_err_f(out, outd, nq));
  CHECK(lse_ok(lse, lsed, nl, 1e-5), "varlen forward: lse mismatch");
  /* the third sequence has seqlen_k = 0: out exactly 0, lse -inf */
  int zeros = 1;
  for (size_t i = (size_t)cuq[2] * h * d; i < nq; ++i) zeros &= out[i] == 0.0f;
  CHECK(zeros, "varlen forward: a sequence with seqlen_k = 0 must give out = 0 exactly");

  flashkv_tensor tdo = tensor3(dout, FLASHKV_DTYPE_FLOAT32, tq_n, h, d), tdq = tensor3(dq, FLASHKV_DTYPE_FLOAT32, tq_n, h, d);
  flashkv_tensor tdk = tensor3(dk, FLASHKV_DTYPE_FLOAT32, tk_n, hkv, d), tdv = tensor3(dv, FLASHKV_DTYPE_FLOAT32, tk_n, hkv, d);
  st = flashkv_attention_varlen_backward(&tq, &tk, &tv, &tcq, &tck, 13, 17, &to, &tl, &tdo, &tdq, &tdk, &tdv, &o);
  CHECK(st == FLASHKV_OK, "varlen backward: status %d: %s", (int)st, flashkv_last_error());
  const double eq = rel_err_f(dq, dqd, nq), ek = rel_err_f(dk, dkd, nk), ev = rel_err_f(dv, dvd, nk);
  CHECK(eq <= 1e-4 && ek <= 1e-4 && ev <= 1e-4, "varlen backward: rel err dq %.3g dk %.3g dv %.3g", eq, ek, ev);

  /* error: non-monotone cu_seqlens_q */
  const int32_t bad_cu[4] = {0, 13, 9, 20};
  flashkv_tensor tbad = tensor1((void*)bad_cu, FLASHKV_DTYPE_INT32, 4);
  st = flashkv_attention_varlen_forward(&tq, &tk, &tv, &tbad, &tck, 13, 17, &to, &tl, &o);
  CHECK(st == FLASHKV_ERROR_INVALID_ARGUMENT && message_names("cu_seqlens_q"), "non-monotone cu_seqlens_q: %d %s",
        (int)st, flashkv_last_error());
  /* error: cu_seqlens_k of the wrong dtype */
  const float cu_float[4] = {0, 17, 26, 26};
  flashkv_tensor tcf = tensor1((void*)cu_float, FLASHKV_DTYPE_FLOAT32, 4);
  st = flashkv_attention_varlen_forward(&tq, &tk, &tv, &tcq, &tcf, 13, 17, &to, &tl, &o);
  CHECK(st == FLASHKV_ERROR_TYPE && message_names("cu_seqlens_k"), "float cu_seqlens_k: %d %s", (int)st,
        flashkv_last_error());
  st = flashkv_attention_varlen_forward(&tq, &tk, &tv, NULL, &tck, 13, 17, &to, &tl, &o);
  CHECK(st == FLASHKV_ERROR_INVALID_ARGUMENT && message_names("cu_seqlens_q"), "NULL cu_seqlens_q: %d %s", (int)st,
        flashkv_last_error());
  /* error: max_seqlen_q smaller than a sequence */
  st = flashkv_attention_varlen_forward(&tq, &tk, &tv, &tcq, &tck, 5, 17, &to, &tl, &o);
  CHECK(st == FLASHKV_ERROR_INVALID_ARGUMENT && message_names("max_seqlen_q"), "max_seqlen_q too small: %d %s",
        (int)st, flashkv_last_error());

  free(q), free(k), free(v), free(out), free(lse), free(dout), free(dq), free(dk), free(dv), free(qd), free(kd);
  free(vd), free(doutd), free(outd), free(lsed), free(dqd), free(dkd), free(dvd), free(row_lse);
}

/* ---- error paths (fixed length) ----------------------------------------------------------------------------- */
#define EXPECT_ERROR(call, status, arg)                                                                        \
  do {                                                                                                         \
    flashkv_status st_ = (call);                                                                               \
    CHECK(st_ == (status) && message_names(arg), "%s: expected status %d naming '%s', got %d: \"%s\"", #call, \
          (int)(status), arg, (int)st_, flashkv_last_error());                                                 \
  } while (0)

static void run_error_cases(void) {
  enum { B = 1, S = 8, H = 2, D = 16 };
  static float q[B * S * H * D], k[B * S * H * D], v[B * S * H * D], out[B * S * H * D], lse[B * H * S];
  static float dq[B * S * H * D], dk[B * S * H * D], dv[B * S * H * D], dout[B * S * H * D];
  static uint16_t k16[B * S * H * D];
  for (int i = 0; i < B * S * H * D; ++i) q[i] = k[i] = v[i] = dout[i] = (float)uniform();
  const flashkv_tensor tq = tensor4(q, FLASHKV_DTYPE_FLOAT32, B, S, H, D), tk = tensor4(k, FLASHKV_DTYPE_FLOAT32, B, S, H, D);
  const flashkv_tensor tv = tensor4(v, FLASHKV_DTYPE_FLOAT32, B, S, H, D), to = tensor4(out, FLASHKV_DTYPE_FLOAT32, B, S, H, D);
  const flashkv_tensor tl = tensor3(lse, FLASHKV_DTYPE_FLOAT32, B, H, S), tdo = tensor4(dout, FLASHKV_DTYPE_FLOAT32, B, S, H, D);
  const flashkv_tensor tdq = tensor4(dq, FLASHKV_DTYPE_FLOAT32, B, S, H, D), tdk = tensor4(dk, FLASHKV_DTYPE_FLOAT32, B, S, H, D);
  const flashkv_tensor tdv = tensor4(dv, FLASHKV_DTYPE_FLOAT32, B, S, H, D);
  flashkv_attention_options o;
  CHECK(flashkv_attention_options_default(&o) == FLASHKV_OK, "options_default");
  CHECK(o.struct_size == sizeof o && o.has_softmax_scale == 0 && o.causal == 0 && o.window_size_left == -1 &&
            o.window_size_right == -1 && o.softcap == 0.0f && o.algorithm == FLASHKV_ALGO_TILED,
        "options_default values");
  CHECK(flashkv_attention_forward(&tq, &tk, &tv, &to, &tl, &o) == FLASHKV_OK, "baseline call must succeed: %s",
        flashkv_last_error());
  CHECK(flashkv_attention_forward(&tq, &tk, &tv, &to, &tl, NULL) == FLASHKV_OK, "NULL options = defaults: %s",
        flashkv_last_error());
  CHECK(flashkv_last_error()[0] == '\0', "last_error is cleared by a successful call");

  EXPECT_ERROR(flashkv_attention_options_default(NULL), FLASHKV_ERROR_INVALID_ARGUMENT, "opts");
  /* NULL tensors */
  EXPECT_ERROR(flashkv_attention_forward(NULL, &tk, &tv, &to, &tl, &o), FLASHKV_ERROR_INVALID_ARGUMENT, "q");
  EXPECT_ERROR(flashkv_attention_forward(&tq, NULL, &tv, &to, &tl, &o), FLASHKV_ERROR_INVALID_ARGUMENT, "k");
  EXPECT_ERROR(flashkv_attention_forward(&tq, &tk, NULL, &to, &tl, &o), FLASHKV_ERROR_INVALID_ARGUMENT, "v");
  EXPECT_ERROR(flashkv_attention_forward(&tq, &tk, &tv, NULL, &tl, &o), FLASHKV_ERROR_INVALID_ARGUMENT, "out");
  EXPECT_ERROR(flashkv_attention_backward(&tq, &tk, &tv, &to, NULL, &tdo, &tdq, &tdk, &tdv, &o),
               FLASHKV_ERROR_INVALID_ARGUMENT, "lse");
  EXPECT_ERROR(flashkv_attention_backward(&tq, &tk, &tv, &to, &tl, NULL, &tdq, &tdk, &tdv, &o),
               FLASHKV_ERROR_INVALID_ARGUMENT, "dout");
  EXPECT_ERROR(flashkv_attention_backward(&tq, &tk, &tv, &to, &tl, &tdo, NULL, &tdk, &tdv, &o),
               FLASHKV_ERROR_INVALID_ARGUMENT, "dq");
  EXPECT_ERROR(flashkv_attention_backward(&tq, &tk, &tv, &to, &tl, &tdo, &tdq, &tdk, NULL, &o),
               FLASHKV_ERROR_INVALID_ARGUMENT, "dv");
  /* NULL data pointer */
  flashkv_tensor t = tq;
  t.data = NULL;
  EXPECT_ERROR(flashkv_attention_forward(&t, &tk, &tv, &to, &tl, &o), FLASHKV_ERROR_INVALID_ARGUMENT, "q");
  /* bad dtype code, bad device code, bad ndim */
  t = tq;
  t.dtype = 42;
  EXPECT_ERROR(flashkv_attention_forward(&t, &tk, &tv, &to, &tl, &o), FLASHKV_ERROR_TYPE, "q.dtype");
  t = tv;
  t.device = 7;
  EXPECT_ERROR(flashkv_attention_forward(&tq, &tk, &t, &to, &tl, &o), FLASHKV_ERROR_TYPE, "v.device");
  t = tk;
  t.ndim = FLASHKV_MAX_DIMS + 1;
  EXPECT_ERROR(flashkv_attention_forward(&tq, &t, &tv, &to, &tl, &o), FLASHKV_ERROR_INVALID_ARGUMENT, "k.ndim");
  t = tq;
  t.ndim = 3; /* rank 3 is the varlen layout, not the fixed-length one */
  EXPECT_ERROR(flashkv_attention_forward(&t, &tk, &tv, &to, &tl, &o), FLASHKV_ERROR_INVALID_ARGUMENT, "q");
  /* dtype mismatch: k float16 while q is float32 */
  t = tensor4(k16, FLASHKV_DTYPE_FLOAT16, B, S, H, D);
  EXPECT_ERROR(flashkv_attention_forward(&tq, &t, &tv, &to, &tl, &o), FLASHKV_ERROR_TYPE, "k");
  /* float64 is not an attention dtype */
  t = tq;
  t.dtype = FLASHKV_DTYPE_FLOAT64;
  EXPECT_ERROR(flashkv_attention_forward(&t, &tk, &tv, &to, &tl, &o), FLASHKV_ERROR_TYPE, "q");
  /* shape mismatches */
  t = tensor4(k, FLASHKV_DTYPE_FLOAT32, B, S, H, D / 2);
  EXPECT_ERROR(flashkv_attention_forward(&tq, &t, &tv, &to, &tl, &o), FLASHKV_ERROR_INVALID_ARGUMENT, "k");
  t = tensor4(out, FLASHKV_DTYPE_FLOAT32, B, S - 1, H, D);
  EXPECT_ERROR(flashkv_attention_forward(&tq, &tk, &tv, &t, &tl, &o), FLASHKV_ERROR_INVALID_ARGUMENT, "out");
  t = tensor3(lse, FLASHKV_DTYPE_FLOAT32, B, H, S - 1);
  EXPECT_ERROR(flashkv_attention_forward(&tq, &tk, &tv, &to, &t, &o), FLASHKV_ERROR_INVALID_ARGUMENT, "lse");
  t = tensor4(v, FLASHKV_DTYPE_FLOAT32, B, S - 1, H, D);
  EXPECT_ERROR(flashkv_attention_forward(&tq, &tk, &t, &to, &tl, &o), FLASHKV_ERROR_INVALID_ARGUMENT, "v");
  t = tensor4(dk, FLASHKV_DTYPE_FLOAT32, B, S, H, D + 1);
  EXPECT_ERROR(flashkv_attention_backward(&tq, &tk, &tv, &to, &tl, &tdo, &tdq, &t, &tdv, &o),
               FLASHKV_ERROR_INVALID_ARGUMENT, "dk");
  /* num_heads not a multiple of num_heads_kv: q has 2 heads, k/v 3 (same buffer, smaller seqlen) */
  flashkv_tensor k3 = tensor4(k, FLASHKV_DTYPE_FLOAT32, B, 2, 3, D), v3 = tensor4(v, FLASHKV_DTYPE_FLOAT32, B, 2, 3, D);
  flashkv_status st = flashkv_attention_forward(&tq, &k3, &v3, &to, &tl, &o);
  CHECK(st == FLASHKV_ERROR_INVALID_ARGUMENT && (message_names("k") || message_names("num_heads_kv")),
        "num_heads %% num_heads_kv != 0: %d %s", (int)st, flashkv_last_error());
  /* last dim not contiguous */
  t = tq;
  t.strides[3] = 2;
  EXPECT_ERROR(flashkv_attention_forward(&t, &tk, &tv, &to, &tl, &o), FLASHKV_ERROR_INVALID_ARGUMENT, "q");
  /* head_dim > 256 */
  static float big[300];
  t = tensor4(big, FLASHKV_DTYPE_FLOAT32, 1, 1, 1, 300);
  flashkv_tensor tlb = tensor3(lse, FLASHKV_DTYPE_FLOAT32, 1, 1, 1);
  EXPECT_ERROR(flashkv_attention_forward(&t, &t, &t, &t, &tlb, &o), FLASHKV_ERROR_INVALID_ARGUMENT, "q");
  /* options */
  flashkv_attention_options bad = o;
  bad.struct_size = 2;
  EXPECT_ERROR(flashkv_attention_forward(&tq, &tk, &tv, &to, &tl, &bad), FLASHKV_ERROR_INVALID_ARGUMENT,
               "opts.struct_size");
  bad = o;
  bad.struct_size = (uint32_t)sizeof(o) + 64;
  EXPECT_ERROR(flashkv_attention_forward(&tq, &tk, &tv, &to, &tl, &bad), FLASHKV_ERROR_INVALID_ARGUMENT,
               "opts.struct_size");
  bad = o;
  bad.algorithm = 9;
  EXPECT_ERROR(flashkv_attention_forward(&tq, &tk, &tv, &to, &tl, &bad), FLASHKV_ERROR_INVALID_ARGUMENT,
               "opts.algorithm");
  bad = o;
  bad.num_threads = -3;
  EXPECT_ERROR(flashkv_attention_forward(&tq, &tk, &tv, &to, &tl, &bad), FLASHKV_ERROR_INVALID_ARGUMENT,
               "opts.num_threads");
  bad = o;
  bad.window_size_left = -2;
  EXPECT_ERROR(flashkv_attention_forward(&tq, &tk, &tv, &to, &tl, &bad), FLASHKV_ERROR_INVALID_ARGUMENT,
               "window_size_left");
  bad = o;
  bad.softcap = -1.0f;
  EXPECT_ERROR(flashkv_attention_forward(&tq, &tk, &tv, &to, &tl, &bad), FLASHKV_ERROR_INVALID_ARGUMENT, "softcap");
  bad = o;
  bad.has_softmax_scale = 1;
  bad.softmax_scale = NAN;
  EXPECT_ERROR(flashkv_attention_forward(&tq, &tk, &tv, &to, &tl, &bad), FLASHKV_ERROR_INVALID_ARGUMENT,
               "softmax_scale");
  /* A struct from an older caller that ends right after `causal` is accepted; later fields take defaults. */
  bad = o;
  bad.struct_size = (uint32_t)(offsetof(flashkv_attention_options, causal) + sizeof(int32_t));
  bad.algorithm = 99; /* beyond struct_size: must not be read */
  CHECK(flashkv_attention_forward(&tq, &tk, &tv, &to, &tl, &bad) == FLASHKV_OK, "short options struct: %s",
        flashkv_last_error());
}

int main(void) {
  const char* env = getenv("FLASHKV_TEST_SEED");
  g_seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
  g_rng = g_seed;
  printf("test_capi_attention: flashkv %s (ABI %d), seed %" PRIu64 " (set FLASHKV_TEST_SEED to reproduce)\n",
         flashkv_version(), (int)flashkv_abi_version(), g_seed);
  CHECK(flashkv_abi_version() == FLASHKV_ABI_VERSION, "ABI version of the library %d != header %d",
        (int)flashkv_abi_version(), FLASHKV_ABI_VERSION);
  CHECK(strlen(flashkv_version()) >= 5, "version string \"%s\"", flashkv_version());

  /*          b  sq  sk  h hkv  d  dv causal wl  wr softcap scale */
  ref_cfg mha = {2, 37, 53, 4, 4, 32, 32, 0, -1, -1, 0.0, 0.17};
  ref_cfg gqa_causal = {1, 53, 37, 4, 2, 64, 64, 1, -1, -1, 0.0, 0.125}; /* sq > sk: first rows see no key */
  ref_cfg mqa_window = {2, 45, 45, 3, 1, 16, 16, 0, 7, 0, 0.0, 0.25};
  ref_cfg softcap = {1, 19, 70, 2, 1, 59, 59, 0, -1, 3, 2.5, 1.5};      /* logits up to ~100 capped to 2.5 */
  run_fixed_case("mha", mha, 1, 0);
  run_fixed_case("gqa_causal", gqa_causal, 1, 0);
  run_fixed_case("mqa_window", mqa_window, 1, 1);
  run_fixed_case("softcap", softcap, 1, 0);
  run_bf16_case();
  run_varlen_case();
  run_error_cases();

  return capi_check_summary();
}
