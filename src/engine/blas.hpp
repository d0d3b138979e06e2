// Internal: the BLAS the engine's matrix products run on — OpenBLAS, loaded at first use (dlopen) so that two things
// can be decided before OpenBLAS initializes itself:
//   * its kernel family: OpenBLAS 0.3.21 (Debian 12) does not recognize some current CPUs (e.g. virtualized Sapphire
//     Rapids report "Intel Xeon Processor") and falls back to its generic "Prescott" SSE3 kernels, 3-4x slower. When
//     OPENBLAS_CORETYPE is unset and the CPU has AVX-512 (F, BW, DQ, VL), the engine sets it to SkylakeX (the AVX-512
//     sgemm/sgemv kernels) before loading; an explicit OPENBLAS_CORETYPE is respected.
//   * which build: Debian's pthread build, whose threads spin with sched_yield. Measured on the shared 2-core machine
//     (load average ~12): the OpenMP build was 20x slower on the tiny model, and splitting the products over
//     flashkv's OpenMP threads 10-40x slower, because idle OpenMP workers spin without yielding; the engine
//     therefore keeps OpenMP out of the per-token path (engine.cpp: attention below 4 MFLOP runs on one thread).
// Search order: $FLASHKV_BLAS (a path), Debian's pthread build, then "libopenblas.so.0".
#pragma once

#include <cblas.h>

#include <string>

namespace flashkv::engine_detail {

struct Blas {
  void (*sgemm)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, blasint, blasint, blasint, float, const float*, blasint,
                const float*, blasint, float, float*, blasint) = nullptr;
  void (*sgemv)(CBLAS_ORDER, CBLAS_TRANSPOSE, blasint, blasint, float, const float*, blasint, const float*, blasint,
                float, float*, blasint) = nullptr;
  std::string library;  // the file loaded
  std::string info;     // "OpenBLAS 0.3.21 ... | core SkylakeX | openmp" (openblas_get_config / corename / parallel)
};

/// Loads OpenBLAS once (thread-safe) and returns its entry points. Throws IoError naming what was tried when no
/// OpenBLAS can be loaded (scripts/setup installs it).
const Blas& blas();

}  // namespace flashkv::engine_detail
