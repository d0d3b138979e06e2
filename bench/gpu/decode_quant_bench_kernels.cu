// Kernels of decode_quant_bench.cpp (random bf16 fill, HBM read anchor).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>

namespace {
__global__ void fill_bf16(uint16_t* x, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t z = (static_cast<uint64_t>(i) + seed) * 0x9E3779B97F4A7C15ull;  // splitmix64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    const float f = (u - 0.5f) * 3.4f;                                    // ~ unit variance
    uint32_t b;
    memcpy(&b, &f, 4);
    x[i] = static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
  }
}

__global__ void read_kernel(const int4* x, int64_t n, int* sink) {
  int acc = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int4 v = x[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678) *sink = acc;  // keeps the loads
}

}  // namespace

void bench_fill_bf16(uint16_t* x, int64_t n, uint64_t seed) { fill_bf16<<<1024, 256>>>(x, n, seed); }
void bench_read(const void* x, int64_t bytes, int* sink, int blocks) {
  read_kernel<<<blocks, 512>>>(static_cast<const int4*>(x), bytes / 16, sink);
}
