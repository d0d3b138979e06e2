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

}  // namespace

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
