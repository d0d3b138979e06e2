// Kernels of kv_traits_kernels.hpp.
#include <cuda_runtime_api.h>

#include "kv_traits_kernels.hpp"

namespace flashkv::cudatest {
namespace {

using kv::KVHalfFormat;

/// One thread per unit: encodes x rows [unit · tokens_per_unit, ...) of one page-head.
__global__ void encode_units(KVHalfFormat f, const float* x, int units, uint8_t* codes, uint8_t* meta, float scale,
                             uint8_t* scratch) {
  const int u = blockIdx.x * blockDim.x + threadIdx.x;
  if (u >= units) return;
  const int slot = u * f.tokens_per_unit;
  f.encode_unit(x + static_cast<int64_t>(slot) * f.head_dim, codes, meta, slot, scale,
                scratch + static_cast<int64_t>(u) * f.head_dim * f.tokens_per_unit);
}

/// One thread per element: x̂ of (slot, c).
__global__ void dequant_all(KVHalfFormat f, const uint8_t* codes, const uint8_t* meta, int slots, float scale,
                            float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= slots * f.head_dim) return;
  out[i] = f.dequant(codes, meta, i / f.head_dim, i % f.head_dim, scale);
}

__global__ void conversions_kernel(unsigned long long* mismatches, uint32_t* first, int* hardware) {
#if __CUDA_ARCH__ >= 890
  if (blockIdx.x == 0 && threadIdx.x == 0) *hardware = 1;
#endif
  const uint64_t n = uint64_t{1} << 32, stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t u = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; u < n; u += stride) {
    const uint32_t bits = static_cast<uint32_t>(u);
    const float x = kv::u32_as_float(bits);
    if (x != x) continue;  // NaN: a NaN code either way
    const bool bad[4] = {kv::float_to_fp8_bits(x, true) != kv::float_to_fp8_bits_sw(x, true),
                         kv::float_to_fp8_bits(x, false) != kv::float_to_fp8_bits_sw(x, false),
                         kv::fp16_bits_round_down(x) != kv::fp16_bits_round_down_sw(x),
                         kv::fp16_bits_round_up(x) != kv::fp16_bits_round_up_sw(x)};
    for (int i = 0; i < 4; ++i) {
      if (bad[i]) {
        atomicAdd(&mismatches[i], 1ull);
        atomicMin(&first[i], bits);
      }
    }
  }
}

}  // namespace

void conversions_vs_portable(unsigned long long (&mismatches)[4], uint32_t (&first)[4], bool& hardware) {
  unsigned long long* dm = nullptr;
  uint32_t* df = nullptr;
  int* dh = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&dm), sizeof(mismatches));
  cudaMalloc(reinterpret_cast<void**>(&df), sizeof(first));
  cudaMalloc(reinterpret_cast<void**>(&dh), sizeof(int));
  cudaMemset(dm, 0, sizeof(mismatches));
  cudaMemset(df, 0xFF, sizeof(first));
  cudaMemset(dh, 0, sizeof(int));
  conversions_kernel<<<4096, 256>>>(dm, df, dh);
  int h = 0;
  cudaMemcpy(mismatches, dm, sizeof(mismatches), cudaMemcpyDeviceToHost);
  cudaMemcpy(first, df, sizeof(first), cudaMemcpyDeviceToHost);
  cudaMemcpy(&h, dh, sizeof(int), cudaMemcpyDeviceToHost);
  hardware = h != 0;
  cudaFree(dm), cudaFree(df), cudaFree(dh);
}

void trait_encode_on_device(const kv::KVHalfFormat& f, const float* x, int P, uint8_t* codes, uint8_t* meta,
                            float head_scale, uint8_t* scratch) {
  const int units = P / f.tokens_per_unit;
  encode_units<<<(units + 63) / 64, 64>>>(f, x, units, codes, meta, head_scale, scratch);
}

void trait_dequant_on_device(const kv::KVHalfFormat& f, const uint8_t* codes, const uint8_t* meta, int P,
                             float head_scale, float* out) {
  const int n = P * f.head_dim;
  dequant_all<<<(n + 255) / 256, 256>>>(f, codes, meta, P, head_scale, out);
}

}  // namespace flashkv::cudatest
