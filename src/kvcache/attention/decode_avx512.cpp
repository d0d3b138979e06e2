// AVX-512 implementation of the fused decode tile kernels (decode_fused.hpp). Compiled for AVX-512 with a target
// pragma and entered only after a run-time CPU check, so the library still runs on CPUs without AVX-512.
//
// Per 16 channels of one key the conversion costs (uops): bf16 2 (zero-extend, shift), u8 2 (zero-extend, cvt),
// u4 2–3 / u2 2–3 (zero-extend, shift for the upper planes, 16-entry float LUT through vpermps, which also masks the
// code bits), fp8 4–5 (through vcvtph2ps). Each converted vector feeds one FMA per query row of the GQA group.
#include "kvcache/attention/decode_fused.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/float16.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FLASHKV_FUSED_AVX512 1
#include <immintrin.h>
#endif

namespace flashkv::kv {

#ifdef FLASHKV_FUSED_AVX512

bool fused_supported(int32_t d) {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                         __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma") &&
                         std::getenv("FLASHKV_NO_FUSED_DECODE") == nullptr;
  return ok && (d == 64 || d == 128 || d == 256);
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")
// GCC's AVX-512 headers trip -Wmaybe-uninitialized (_mm512_undefined_* inside the cast / extract intrinsics).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace {

#define FKV_CVTPH(h) _mm512_cvtph_ps(h)
#include "kvcache/attention/decode_avx512_kernels.hpp"

}  // namespace

void fused_scores(KVCode code, const float* q, int rows, int d, const uint8_t* codes, int64_t rb, int n, float* S,
                  int lds, const float* alpha, const float* beta, int group) {
  if (n <= 0 || rows <= 0) return;
  if (is_fp8_code(code) && fp16_convert_supported()) {
    fused_scores_fp16cvt(code, q, rows, d, codes, rb, n, S, lds, alpha, beta, group);
    return;
  }
  scores_any(code, q, rows, d, codes, rb, n, S, lds, alpha, beta, group);
}

void fused_pv(KVCode code, const float* w, int64_t ldw, int64_t ng, int group, int rows, int d,
              const uint8_t* codes, int64_t rb, int n, float* O) {
  if (n <= 0 || rows <= 0) return;
  if (is_fp8_code(code) && fp16_convert_supported()) {
    fused_pv_fp16cvt(code, w, ldw, ng, group, rows, d, codes, rb, n, O);
    return;
  }
  pv_any(code, w, ldw, ng, group, rows, d, codes, rb, n, O);
}

namespace {
/// exp_flush (src/cpu/tile_math.hpp) on 16 lanes: Cephes expf, exactly 0 below −87.33 (and for −inf).
FKV_AI __m512 exp16(__m512 x) {
  const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33f), _CMP_LT_OQ);
  __m512 xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.33f)), _mm512_set1_ps(88.0f));
  const __m512 t = _mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_sub_ps(_mm512_add_ps(t, _mm512_set1_ps(12582912.0f)), _mm512_set1_ps(12582912.0f));
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(static_cast<__mmask16>(~under), p, _mm512_castsi512_ps(e));
}
FKV_AI __mmask16 tail_mask(int m) { return m >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << m) - 1u); }
}  // namespace

void softmax_rows(float* sc, int64_t ld, int rows, int n, float* m, float* l, float* alpha) {
  const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
  for (int r = 0; r < rows; ++r) {
    float* s = sc + r * ld;
    if (m[r] != m[r]) {  // poisoned row (NaN state, decode_tile.cpp): p = 0, state unchanged
      for (int j = 0; j < n; ++j) s[j] = 0.0f;
      alpha[r] = 1.0f;
      continue;
    }
    __m512 mx = ninf;
    __mmask16 bad = 0;  // NaN or +inf: the row becomes NaN (decode_tile.cpp, the non-finite contract)
    for (int j = 0; j < n; j += 16) {
      const __m512 x = _mm512_mask_loadu_ps(ninf, tail_mask(n - j), s + j);
      bad |= _mm512_cmp_ps_mask(x, _mm512_set1_ps(__builtin_inff()), _CMP_NLT_UQ);
      mx = _mm512_max_ps(mx, x);
    }
    if (bad != 0) {  // poison: m, l NaN, p = 0; alpha NaN makes the caller's accumulator row NaN
      for (int j = 0; j < n; ++j) s[j] = 0.0f;
      m[r] = l[r] = alpha[r] = __builtin_nanf("");
      continue;
    }
    const float tmax = _mm512_reduce_max_ps(mx);
    const float m_new = tmax > m[r] ? tmax : m[r];
    if (m_new == -__builtin_inff()) {  // nothing visible so far: p = 0, state unchanged
      for (int j = 0; j < n; ++j) s[j] = 0.0f;
      alpha[r] = 1.0f;
      continue;
    }
    const float a = m[r] == -__builtin_inff() ? 0.0f : std::exp(m[r] - m_new);
    const __m512 vm = _mm512_set1_ps(m_new);
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) {
      const __mmask16 km = tail_mask(n - j);
      const __m512 p = _mm512_maskz_mov_ps(km, exp16(_mm512_sub_ps(_mm512_mask_loadu_ps(ninf, km, s + j), vm)));
      _mm512_mask_storeu_ps(s + j, km, p);
      sum = _mm512_add_ps(sum, p);
    }
    m[r] = m_new;
    l[r] = a * l[r] + _mm512_reduce_add_ps(sum);
    alpha[r] = a;
  }
}

void pv_weights(const float* p, int64_t ldp, int rows, int n, const float* alpha, const float* beta, int ng, float* w,
                float* z) {
  int shift = 0;
  while ((1 << shift) < ng) ++shift;
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i idx = _mm512_srl_epi32(lane, _mm_cvtsi32_si128(shift));  // entry lane -> token lane
  const int total = n * ng;
  for (int r = 0; r < rows; ++r) {
    const float* pr = p + r * ldp;
    float* wr = w + static_cast<int64_t>(r) * ng * ldp;
    __m512 zs = _mm512_setzero_ps();
    for (int e = 0; e < total; e += 16) {
      const __mmask16 km = tail_mask(total - e);
      const int t = e >> shift;
      __m512 pv = _mm512_maskz_loadu_ps(tail_mask(n - t), pr + t);
      if (ng > 1) pv = _mm512_permutexvar_ps(idx, pv);
      _mm512_mask_storeu_ps(wr + e, km, _mm512_mul_ps(pv, _mm512_maskz_loadu_ps(km, alpha + e)));
      if (beta != nullptr) zs = _mm512_fmadd_ps(pv, _mm512_maskz_loadu_ps(km, beta + e), zs);
    }
    if (z == nullptr) continue;
    // lanes with the same entry mod ng belong to one channel group
    if (ng == 1) {
      z[r] = _mm512_reduce_add_ps(zs);
      continue;
    }
    if (ng <= 8) zs = _mm512_add_ps(zs, _mm512_shuffle_f32x4(zs, zs, 0x4E));
    if (ng <= 4) zs = _mm512_add_ps(zs, _mm512_shuffle_f32x4(zs, zs, 0xB1));
    if (ng <= 2) zs = _mm512_add_ps(zs, _mm512_permute_ps(zs, 0x4E));
    _mm512_mask_storeu_ps(z + static_cast<int64_t>(r) * ng, tail_mask(ng), zs);
  }
}

void fold_channel_scale_n(const float* q, int rows, int d, const float* cs, const float* cz, float* qe, float* bias) {
  for (int r = 0; r < rows; ++r) {
    const float* qr = q + static_cast<int64_t>(r) * d;
    float* qo = qe + static_cast<int64_t>(r) * d;
    __m512 b = _mm512_setzero_ps();
    for (int c = 0; c < d; c += 16) {  // d % 16 == 0 (fused_supported)
      const __m512 qv = _mm512_loadu_ps(qr + c);
      _mm512_storeu_ps(qo + c, _mm512_mul_ps(qv, _mm512_loadu_ps(cs + c)));
      b = _mm512_fmadd_ps(qv, _mm512_loadu_ps(cz + c), b);
    }
    bias[r] = _mm512_reduce_add_ps(b);
  }
}

void fp16_to_float_n(const uint8_t* src, int n, float* dst) {
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * i))));
  }
  if (i < n) {
    const __mmask16 km = static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m256i h = _mm256_maskz_loadu_epi16(km, src + 2 * i);
    _mm512_mask_storeu_ps(dst + i, km, _mm512_cvtph_ps(h));
  }
}

void token_meta(const uint8_t* meta, int n, int ng, float* alpha, float* beta) {
  const int total = n * ng;  // token-major: entry t·ng + g
  for (int e = 0; e < total; e += 16) {
    const __mmask16 km = tail_mask(total - e);
    const __m512i x = _mm512_maskz_loadu_epi32(km, meta + 4 * static_cast<int64_t>(e));  // scale | min << 16
    _mm512_mask_storeu_ps(alpha + e, km, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(x)));
    _mm512_mask_storeu_ps(beta + e, km, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(x, 16))));
  }
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

#else  // no AVX-512 build: the generic tile path runs

bool fused_supported(int32_t) { return false; }
void fused_scores(KVCode, const float*, int, int, const uint8_t*, int64_t, int, float*, int, const float*, const float*,
                  int) {}
void fused_pv(KVCode, const float*, int64_t, int64_t, int, int, int, const uint8_t*, int64_t, int, float*) {}
void fp16_to_float_n(const uint8_t* src, int n, float* dst) {
  for (int i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = fp16_to_float(h);
  }
}
void token_meta(const uint8_t*, int, int, float*, float*) {}
void softmax_rows(float*, int64_t, int, int, float*, float*, float*) {}
void pv_weights(const float*, int64_t, int, int, const float*, const float*, int, float*, float*) {}
void fold_channel_scale_n(const float*, int, int, const float*, const float*, float*, float*) {}

#endif

}  // namespace flashkv::kv
