// Synthetic K/V staging on the device (synthetic_fill.hpp).
#include "engine/cuda/synthetic_fill.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/check.hpp"
#include "engine/synthetic_kv.hpp"

namespace flashkv::engine_cuda {
namespace {

__global__ void synthetic_kv_kernel(uint64_t seed, int layer, int num_layers, int64_t pos0, int64_t total,
                                    int num_heads_kv, int head_dim, bool fp16, uint16_t* __restrict__ k,
                                    uint16_t* __restrict__ v) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(i % head_dim);
    const int h = static_cast<int>((i / head_dim) % num_heads_kv);
    const int64_t t = i / (static_cast<int64_t>(head_dim) * num_heads_kv);
    const float xk = engine_detail::synthetic_kv_value(seed, 0, layer, pos0 + t, h, c, num_layers, num_heads_kv, head_dim);
    const float xv = engine_detail::synthetic_kv_value(seed, 1, layer, pos0 + t, h, c, num_layers, num_heads_kv, head_dim);
    k[i] = fp16 ? __half_as_ushort(__float2half_rn(xk)) : __bfloat16_as_ushort(__float2bfloat16_rn(xk));
    v[i] = fp16 ? __half_as_ushort(__float2half_rn(xv)) : __bfloat16_as_ushort(__float2bfloat16_rn(xv));
  }
}

}  // namespace

void synthetic_kv(uint64_t seed, int layer, int num_layers, int64_t pos0, int n, int num_heads_kv, int head_dim,
                  bool fp16, uint16_t* k, uint16_t* v, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(n) * num_heads_kv * head_dim;
  if (total <= 0) return;
  const int threads = 256;
  const int64_t blocks = (total + threads - 1) / threads;
  synthetic_kv_kernel<<<static_cast<unsigned>(blocks < 16384 ? blocks : 16384), threads, 0, stream>>>(
      seed, layer, num_layers, pos0, total, num_heads_kv, head_dim, fp16, k, v);
  cuda::check_cuda(cudaGetLastError(), "engine: synthetic K/V");
}

}  // namespace flashkv::engine_cuda
