// fp8 tiles of the fused decode kernels with vcvtph2psx (AVX512-FP16: one uop per 16 values, vcvtph2ps takes two), on
// CPUs that have it (run-time check; Sapphire Rapids and later). The kernels are decode_avx512_kernels.hpp compiled a
// second time for this target; decode_avx512.cpp's fused_scores / fused_pv call in here for KVCode::e4m3 / e5m2.
#include <algorithm>
#include <cstdlib>
#include <utility>

#include "kvcache/attention/decode_fused.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>

namespace flashkv::kv {

bool fp16_convert_supported() {
  static const bool ok =
      __builtin_cpu_supports("avx512fp16") && std::getenv("FLASHKV_NO_AVX512FP16") == nullptr;
  return ok;
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512fp16,f16c,fma")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace {
#define FKV_CVTPH(h) _mm512_cvtxph_ps(_mm256_castsi256_ph(h))
#include "kvcache/attention/decode_avx512_kernels.hpp"
}  // namespace

void fused_scores_fp16cvt(KVCode code, const float* q, int rows, int d, const uint8_t* codes, int64_t rb, int n,
                          float* S, int lds, const float* alpha, const float* beta, int group) {
  scores_any(code, q, rows, d, codes, rb, n, S, lds, alpha, beta, group);
}

void fused_pv_fp16cvt(KVCode code, const float* w, int64_t ldw, int64_t ng, int group, int rows, int d,
                      const uint8_t* codes, int64_t rb, int n, float* O) {
  pv_any(code, w, ldw, ng, group, rows, d, codes, rb, n, O);
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

}  // namespace flashkv::kv

#else

namespace flashkv::kv {
bool fp16_convert_supported() { return false; }
void fused_scores_fp16cvt(KVCode, const float*, int, int, const uint8_t*, int64_t, int, float*, int, const float*,
                          const float*, int) {}
void fused_pv_fp16cvt(KVCode, const float*, int64_t, int64_t, int, int, int, const uint8_t*, int64_t, int, float*) {}
}  // namespace flashkv::kv

#endif
