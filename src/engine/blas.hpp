// Internal: the BLAS the engine's matrix products run on — OpenBLAS, loaded at first use (dlopen) so that two things
// can be decided before OpenBLAS initializes itself:
//   * its kernel family: OpenBLAS 0.3.21 (Debian 12) does not recognize some current CPUs (e.g. virtualized Sapphire
//     Rapids report "Intel Xeon Processor") and falls back to its generic "Prescott" SSE3 kernels, 3-4x slower. When
//     OPENBLAS_CORETYPE is unset and the CPU has AVX-512 (F, BW, DQ, VL), the engine sets it to SkylakeX (the AVX-512
//     sgemm/sgemv kernels) before loading; an explicit OPENBLAS_CORETYPE is respected.
//   * its threading: OpenBLAS runs single-threaded (openblas_set_num_threads(1)); the engine splits each large matrix
//     product over its OpenMP threads by output rows (engine.cpp), so BLAS and the engine's other OpenMP regions
//     (attention, dequantization) share one thread pool instead of two pools fighting for the cores (measured: the
//     two pools spin against each other and decode ran 5-40x slower on 2 cores). Each output element is computed by
//     one thread over the whole inner dimension, so results do not depend on the thread count.
// Search order: $FLASHKV_BLAS (a path), Debian's pthread build, then "libopenblas.so.0" (the OpenMP build of OpenBLAS
// 0.3.21 was measured 20x slower on the tiny model here and is not preferred).
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
