// cuBLAS products of the CUDA engine (gemm.hpp).
#include "engine/cuda/gemm.hpp"

#include <string>

#include "flashkv/error.hpp"

namespace flashkv::engine_cuda {
namespace {
void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("flashkv: cuBLAS error in ") + what + ": " + cublasGetStatusName(s) + " (" +
                    cublasGetStatusString(s) + ")",
                Status::internal);
}
}  // namespace

Blas::Blas() { check_blas(cublasCreate(&handle_), "cublasCreate"); }
Blas::~Blas() {
  if (handle_ != nullptr) cublasDestroy(handle_);
}

void Blas::matmul(const uint16_t* x, int t, int in, const uint16_t* w, int out, float* y, float beta) const {
  if (t == 0) return;
  const float alpha = 1.0f;
  // Column-major view: yᵀ [out, t] = (w viewed as [in, out])ᵀ · xᵀ [in, t].
  check_blas(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, out, t, in, &alpha, w, CUDA_R_16BF, in, x, CUDA_R_16BF,
                          in, &beta, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "cublasGemmEx (bf16 x bf16 -> float32)");
}

}  // namespace flashkv::engine_cuda
