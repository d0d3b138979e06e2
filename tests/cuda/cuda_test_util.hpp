// Helpers shared by the CUDA backend tests: device buffers and seeded random 16-bit tensors. The seed, the float64
// references and the error measures are those of every other layer's tests (tests/common/reference.hpp).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "common/reference.hpp"
#include "core/float16.hpp"
#include "flashkv/types.hpp"

namespace flashkv::cudatest {

// Shared test support (tests/common/reference.hpp): the process seed (FLASHKV_TEST_SEED or fresh, printed once), the
// float64 reference with its low-precision "naive" twin, and the error measures.
using flashkv::testing::max_abs_diff;
using flashkv::testing::no_rounding;
using flashkv::testing::reference_backward_varlen;
using flashkv::testing::reference_forward_varlen;
using flashkv::testing::RefOptions;
using flashkv::testing::RefVarlenShape;
using flashkv::testing::rounding_to;
using flashkv::testing::test_seed;

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    ADD_FAILURE() << what << ": " << cudaGetErrorString(e);
    std::abort();
  }
}

/// Device memory of `bytes` bytes, freed on destruction.
struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DevBuf(size_t n) : bytes(n) {
    if (n) cuda_ok(cudaMalloc(&p, n), "cudaMalloc");
  }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <class U>
  void upload(const std::vector<U>& h) {
    cuda_ok(cudaMemcpy(p, h.data(), h.size() * sizeof(U), cudaMemcpyHostToDevice), "upload");
    cuda_ok(cudaStreamSynchronize(nullptr), "upload");  // from pageable memory cudaMemcpy may return before the DMA
  }
  template <class U>
  std::vector<U> download(size_t count) const {
    std::vector<U> h(count);
    cuda_ok(cudaDeviceSynchronize(), "kernel");
    cuda_ok(cudaMemcpy(h.data(), p, count * sizeof(U), cudaMemcpyDeviceToHost), "download");
    return h;
  }
  /// Fills with a byte pattern (poison) so that unwritten outputs are detected.
  void poison() { cuda_ok(cudaMemset(p, 0x7f, bytes), "poison"); }
};

inline uint16_t to_bits(float f, DType t) { return t == DType::bfloat16 ? float_to_bf16(f) : float_to_fp16(f); }
inline float from_bits(uint16_t b, DType t) { return t == DType::bfloat16 ? bf16_to_float(b) : fp16_to_float(b); }

/// n random N(0, scale^2) values rounded to dtype: bits for the device, the exact rounded values for the reference.
struct HostTensor {
  std::vector<uint16_t> bits;
  std::vector<double> val;
};
inline HostTensor random_tensor(size_t n, DType t, std::mt19937_64& rng, double scale = 1.0) {
  std::normal_distribution<double> dist(0.0, scale);
  HostTensor h;
  h.bits.resize(n);
  h.val.resize(n);
  for (size_t i = 0; i < n; ++i) {
    h.bits[i] = to_bits(static_cast<float>(dist(rng)), t);
    h.val[i] = from_bits(h.bits[i], t);
  }
  return h;
}
inline std::vector<double> decode(const std::vector<uint16_t>& bits, DType t) {
  std::vector<double> v(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) v[i] = from_bits(bits[i], t);
  return v;
}

/// View of a [rows..., heads, d] tensor with head pitch `pitch` (fixed: [B, S, H, d]; varlen: [total, H, d]).
inline TensorView view(void* data, DType t, bool varlen, int64_t b, int64_t s, int64_t h, int64_t d, int64_t pitch) {
  TensorView v;
  v.data = data;
  v.dtype = t;
  v.device = Device::cuda;
  if (varlen) {
    v.ndim = 3;
    v.shape[0] = s, v.shape[1] = h, v.shape[2] = d;
    v.strides[0] = h * pitch, v.strides[1] = pitch, v.strides[2] = 1;
  } else {
    v.ndim = 4;
    v.shape[0] = b, v.shape[1] = s, v.shape[2] = h, v.shape[3] = d;
    v.strides[0] = s * h * pitch, v.strides[1] = h * pitch, v.strides[2] = pitch, v.strides[3] = 1;
  }
  return v;
}

inline TensorView dev_view(const DevBuf& b, DType t, std::initializer_list<int64_t> shape) {
  return TensorView::contiguous(b.p, t, shape, Device::cuda, 0);
}

}  // namespace flashkv::cudatest
