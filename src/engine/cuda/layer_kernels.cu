// The CUDA engine's per-layer kernels (layer_kernels.hpp). Multiplications use __fmul_rn / __fadd_rn where the CPU
// engine rounds each product (no FMA contraction), so that the float32 values before the 16-bit rounding match the CPU
// engine's to the last bit wherever the inputs do.
#include "engine/cuda/layer_kernels.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/check.hpp"

namespace flashkv::engine_cuda {
namespace {

__device__ __forceinline__ uint16_t to_bf16(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }
__device__ __forceinline__ uint16_t to_fp16(float x) { return __half_as_ushort(__float2half_rn(x)); }

int grid_for(int64_t total, int threads = 256) {
  const int64_t blocks = (total + threads - 1) / threads;
  return static_cast<int>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

__global__ void embed_kernel(const float* __restrict__ table, const int32_t* __restrict__ tokens, int rows, int dim,
                             float* __restrict__ x) {
  const int64_t total = static_cast<int64_t>(rows) * dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / dim, c = i % dim;
    x[i] = table[static_cast<int64_t>(tokens[r]) * dim + c];
  }
}

constexpr int kNormThreads = 256;

__global__ void rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w, int dim, float eps,
                               uint16_t* __restrict__ out) {
  const float* row = x + static_cast<int64_t>(blockIdx.x) * dim;
  double ss = 0.0;
  for (int i = threadIdx.x; i < dim; i += kNormThreads) ss += static_cast<double>(row[i]) * row[i];
  __shared__ double part[kNormThreads / 32];
  for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  __syncthreads();
  __shared__ float inv_s;
  if (threadIdx.x == 0) {
    double t = 0.0;
    for (int i = 0; i < kNormThreads / 32; ++i) t += part[i];
    inv_s = static_cast<float>(1.0 / sqrt(t / dim + static_cast<double>(eps)));
  }
  __syncthreads();
  const float inv = inv_s;
  uint16_t* o = out + static_cast<int64_t>(blockIdx.x) * dim;
  for (int i = threadIdx.x; i < dim; i += kNormThreads) o[i] = to_bf16(__fmul_rn(w[i], __fmul_rn(inv, row[i])));
}

__global__ void rope_split_kernel(const float* __restrict__ qkv, const int32_t* __restrict__ pos,
                                  const float* __restrict__ cs, const float* __restrict__ sn, int rows, int hq, int hk,
                                  int hd, bool fp16, uint16_t* __restrict__ q, uint16_t* __restrict__ k,
                                  uint16_t* __restrict__ v) {
  const int half = hd / 2, heads = hq + 2 * hk;
  const int64_t total = static_cast<int64_t>(rows) * heads * half;  // one thread per pair
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(t % half);
    const int h = static_cast<int>((t / half) % heads);
    const int64_t r = t / (static_cast<int64_t>(half) * heads);
    const float* src = qkv + (r * heads + h) * hd + 2 * i;
    float x0 = src[0], x1 = src[1];
    uint16_t* dst;
    if (h < hq + hk) {
      const int64_t p = pos[r];
      const float c = cs[p * half + i], s = sn[p * half + i];
      const float y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
      const float y1 = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
      x0 = y0, x1 = y1;
      dst = h < hq ? q + (r * hq + h) * hd : k + (r * hk + (h - hq)) * hd;
    } else {
      dst = v + (r * hk + (h - hq - hk)) * hd;
    }
    dst[2 * i] = fp16 ? to_fp16(x0) : to_bf16(x0);
    dst[2 * i + 1] = fp16 ? to_fp16(x1) : to_bf16(x1);
  }
}

__global__ void swiglu_kernel(const float* __restrict__ gu, int rows, int hidden, uint16_t* __restrict__ h) {
  const int64_t total = static_cast<int64_t>(rows) * hidden;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = t / hidden, i = t % hidden;
    const float g = gu[r * 2 * hidden + i], u = gu[r * 2 * hidden + hidden + i];
    const float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g)));
    h[t] = to_bf16(__fmul_rn(__fmul_rn(g, sig), u));
  }
}

__global__ void fp16_to_bf16_kernel(const uint16_t* __restrict__ src, int64_t n, uint16_t* __restrict__ dst) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = to_bf16(__half2float(__ushort_as_half(src[i])));
}

__global__ void f32_to_bf16_kernel(const float* __restrict__ src, int64_t n, uint16_t* __restrict__ dst) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = to_bf16(src[i]);
}

}  // namespace

void embed_rows(const float* table, const int32_t* tokens, int rows, int dim, float* x, cudaStream_t stream) {
  embed_kernel<<<grid_for(static_cast<int64_t>(rows) * dim), 256, 0, stream>>>(table, tokens, rows, dim, x);
  cuda::check_cuda(cudaGetLastError(), "engine: embedding kernel");
}

void rmsnorm_bf16(const float* x, const float* weight, int rows, int dim, float eps, uint16_t* out,
                  cudaStream_t stream) {
  if (rows == 0) return;
  rmsnorm_kernel<<<rows, kNormThreads, 0, stream>>>(x, weight, dim, eps, out);
  cuda::check_cuda(cudaGetLastError(), "engine: rmsnorm kernel");
}

void rope_split(const float* qkv, const int32_t* pos, const float* rope_cos, const float* rope_sin, int rows, int hq,
                int hk, int hd, bool fp16, uint16_t* q, uint16_t* k, uint16_t* v, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(rows) * (hq + 2 * hk) * (hd / 2);
  rope_split_kernel<<<grid_for(total), 256, 0, stream>>>(qkv, pos, rope_cos, rope_sin, rows, hq, hk, hd, fp16, q, k, v);
  cuda::check_cuda(cudaGetLastError(), "engine: rope kernel");
}

void swiglu_bf16(const float* gu, int rows, int hidden, uint16_t* h, cudaStream_t stream) {
  swiglu_kernel<<<grid_for(static_cast<int64_t>(rows) * hidden), 256, 0, stream>>>(gu, rows, hidden, h);
  cuda::check_cuda(cudaGetLastError(), "engine: swiglu kernel");
}

void fp16_to_bf16(const uint16_t* src, int64_t n, uint16_t* dst, cudaStream_t stream) {
  fp16_to_bf16_kernel<<<grid_for(n), 256, 0, stream>>>(src, n, dst);
  cuda::check_cuda(cudaGetLastError(), "engine: fp16 to bf16 kernel");
}

void f32_to_bf16(const float* src, int64_t n, uint16_t* dst, cudaStream_t stream) {
  f32_to_bf16_kernel<<<grid_for(n), 256, 0, stream>>>(src, n, dst);
  cuda::check_cuda(cudaGetLastError(), "engine: float32 to bf16 kernel");
}

}  // namespace flashkv::engine_cuda
