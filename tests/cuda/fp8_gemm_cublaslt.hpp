// The device's own FP8 GEMM for the FP8 tests' naive baseline (fp8_test_util.hpp naive_fp8): e4m3 x e4m3 -> float32
// through cuBLASLt (CUDA_R_8F_E4M3 A/B, float32 C/D, compute 32F, "TN"), so that the baseline's scores and P V carry
// the tensor cores' FP8 accumulation (Hopper keeps ~13-14 mantissa bits in the MMA accumulator, DeepSeek-V3 §3.3.2)
// like the kernel's, not exact float32 sums. cuBLASLt is loaded at the first use (dlopen, as the CUDA engine loads
// cuBLAS, src/engine/cuda/gemm.cpp), not linked: the test binary keeps starting where the 540 MB libcublasLt.so.13 is
// not on the loader path (the device's scripts/gpu-build devlibs do not carry it) and only the FP8 checks need it.
#pragma once

#include <cstdint>
#include <string>

namespace flashkv::cudatest::fp8 {

class CublasLtFp8Gemm {
 public:
  /// Loads cuBLASLt 13: $FLASHKV_CUBLASLT, then libcublasLt.so.13 (LD_LIBRARY_PATH, loader cache), then next to
  /// $FLASHKV_CUBLAS (scripts/gpu-run's cuBLAS from the toolkit or torch's wheels), then /usr/local/cuda/lib64.
  /// Throws std::runtime_error naming every candidate tried when none loads.
  CublasLtFp8Gemm();
  ~CublasLtFp8Gemm();
  CublasLtFp8Gemm(const CublasLtFp8Gemm&) = delete;
  CublasLtFp8Gemm& operator=(const CublasLtFp8Gemm&) = delete;

  /// The Fp8Gemm contract (fp8_test_util.hpp): host codes a [m][k], b [n][k] (K-major) -> host float32
  /// d[j * m + i] = sum_l a[i][l] * b[j][l]; m, n, k multiples of 16 (std::invalid_argument otherwise). Computed on
  /// the current device with FAST_ACCUM on: the whole k stays in the tensor cores' accumulator, as in the kernel's
  /// (and FA3's) WGMMA chains; cuBLASLt's default instead promotes partial sums to CUDA-core float32 now and then,
  /// which is more accurate than the kernel's arithmetic. Throws std::runtime_error on a CUDA / cuBLASLt error.
  void operator()(const uint8_t* a, const uint8_t* b, int m, int n, int k, float* d);

  /// The library file taken.
  const std::string& library() const;

 private:
  void* handle_ = nullptr;  ///< cublasLtHandle_t
  void* dev_ = nullptr;     ///< device buffer: a, b, d, workspace
  size_t dev_bytes_ = 0;
};

}  // namespace flashkv::cudatest::fp8
