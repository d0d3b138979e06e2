// cuBLAS matrix products of the CUDA engine: bf16 operands, float32 accumulation and output (cublasGemmEx,
// CUBLAS_COMPUTE_32F), in the row-major convention of the CPU engine (weights [out_features, in_features]). cuBLAS 13
// is loaded at run time (gemm.cpp).
#pragma once

#include <cublas_v2.h>

#include <cstdint>

namespace flashkv::engine_cuda {

/// Owns a cuBLAS handle bound to the engine's stream, with its own workspace (kWorkspaceBytes of device memory set by
/// cublasSetWorkspace), so that its products can be captured into CUDA graphs (no allocation inside a capture) and
/// every product of the engine uses the same workspace, captured or not — hence the same cuBLAS kernels.
class Blas {
 public:
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;  ///< cuBLAS's recommendation for Hopper
  /// Throws UnsupportedError naming what was tried when cuBLAS cannot be loaded; CapacityError when the workspace
  /// cannot be allocated.
  explicit Blas(cudaStream_t stream);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  /// y[t, out] = x[t, in] · w[out, in]ᵀ + beta · y[t, out]: x, w bf16 (row-major, contiguous), y float32; beta 0
  /// (overwrite) or 1 (accumulate: the residual add fused into the product). Throws Error(internal) on a cuBLAS error.
  void matmul(const uint16_t* x, int t, int in, const uint16_t* w, int out, float* y, float beta) const;

 private:
  cublasHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
};

}  // namespace flashkv::engine_cuda
