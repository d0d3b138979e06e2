// Peak FMA measurement: see util_peak_flops.hpp. Compiled for the ISA picked at run time via GCC target attributes, so the
// binary stays portable (same approach as the kernels' target_clones).
#include "cli/util_peak_flops.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace flashkv::cli {
namespace {

constexpr int kAcc = 12;  // independent accumulator chains

template <int Lanes>
struct VecT {
  typedef float type __attribute__((vector_size(Lanes * 4)));
};

// Each call does iters * kAcc vector FMAs of Lanes floats. `sink` defeats dead-code elimination.
#define FLASHKV_FMA_LOOP(LANES)                                                \
  using V = VecT<LANES>::type;                                                 \
  V acc[kAcc];                                                                 \
  for (int i = 0; i < kAcc; ++i) acc[i] = V{} + (1.0f + 0.001f * static_cast<float>(i)); \
  const V a = V{} + 0.999999f, b = V{} + 1e-7f;                                \
  for (int64_t it = 0; it < iters; ++it) {                                     \
    _Pragma("GCC unroll 12") for (int i = 0; i < kAcc; ++i) acc[i] = acc[i] * a + b; \
  }                                                                            \
  float s = 0.0f;                                                              \
  for (int i = 0; i < kAcc; ++i)                                               \
    for (int l = 0; l < LANES; ++l) s += acc[i][l];                            \
  return s;

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f,fma"), noinline)) float fma_loop_avx512(int64_t iters) { FLASHKV_FMA_LOOP(16) }
__attribute__((target("avx2,fma"), noinline)) float fma_loop_avx2(int64_t iters) { FLASHKV_FMA_LOOP(8) }
#endif
__attribute__((noinline)) float fma_loop_scalar(int64_t iters) { FLASHKV_FMA_LOOP(1) }

#undef FLASHKV_FMA_LOOP

double cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

}  // namespace

PeakFlops measure_peak_flops(double seconds) {
  PeakFlops r;
  float (*loop)(int64_t) = &fma_loop_scalar;
  r.isa = "scalar";
  r.lanes = 1;
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) {
    loop = &fma_loop_avx512, r.isa = "avx512f", r.lanes = 16;
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    loop = &fma_loop_avx2, r.isa = "avx2+fma", r.lanes = 8;
  }
#endif
  // Calibrate the iteration count on one thread (also warms up the vector units' clock).
  int64_t iters = 1 << 16;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    volatile float sink = loop(iters);
    (void)sink;
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (dt > seconds / 4 || iters > (int64_t{1} << 40)) {
      iters = static_cast<int64_t>(static_cast<double>(iters) * seconds / dt);
      break;
    }
    iters *= 4;
  }
  int threads = 1;
  double best = 0.0;
  double best_share = 0.0;
  for (int rep = 0; rep < 2; ++rep) {
    const double cpu0 = cpu_ms();
    const auto t0 = std::chrono::steady_clock::now();
    float total = 0.0f;
#pragma omp parallel reduction(+ : total)
    {
#if defined(_OPENMP)
#pragma omp single
      threads = omp_get_num_threads();
#endif
      total += loop(iters);
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    volatile float sink = total;
    (void)sink;
    const double flops = 2.0 * r.lanes * kAcc * static_cast<double>(iters) * threads;
    if (flops / dt * 1e-9 > best) {
      best = flops / dt * 1e-9;
      best_share = (cpu_ms() - cpu0) / (dt * 1e3 * threads);
    }
  }
  r.gflops = best;
  r.cpu_share = best_share;
  r.threads = threads;
  return r;
}

}  // namespace flashkv::cli
