// cuBLAS matrix products of the CUDA engine: bf16 operands, float32 accumulation and output (cublasGemmEx,
// CUBLAS_COMPUTE_32F), in the row-major convention of the CPU engine (weights [out_features, in_features]). cuBLAS 13
// is loaded at run time (gemm.cpp).
#pragma once

#include <cublas_v2.h>

#include <cstdint>

namespace flashkv::engine_cuda {

/// Owns a cuBLAS handle bound to the legacy default stream (every engine kernel and the KV cache run there).
class Blas {
 public:
  /// Throws UnsupportedError naming what was tried when cuBLAS cannot be loaded.
  Blas();
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  /// y[t, out] = x[t, in] · w[out, in]ᵀ + beta · y[t, out]: x, w bf16 (row-major, contiguous), y float32; beta 0
  /// (overwrite) or 1 (accumulate: the residual add fused into the product). Throws Error(internal) on a cuBLAS error.
  void matmul(const uint16_t* x, int t, int in, const uint16_t* w, int out, float* y, float beta) const;

 private:
  cublasHandle_t handle_ = nullptr;
};

}  // namespace flashkv::engine_cuda
