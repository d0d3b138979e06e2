// Tile-shape sweep of the sm80 forward kernel (development tool, not part of the library): times several
// (kBlockM, kBlockN, warps) configurations per head dim on the FA3-paper shapes (16k tokens, hidden 2048) with CUDA
// events, so FwdTiles<> in src/cuda/sm80/fwd_launch.cuh can be chosen from measurements.
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude bench/gpu/tune_fwd.cu -o tune_fwd
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>

#include "cuda/sm80/fwd_kernel.cuh"

using namespace flashkv::cuda;
using T = __nv_bfloat16;

__global__ void fill(T* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
    x[i] = __float2bfloat16((h & 0xffff) / 32768.f - 1.f);
  }
}

template <int D, int BM, int BN, int W>
void run(int s, bool causal, T* q, T* k, T* v, T* o) {
  using Cfg = sm80::FwdConfig<D, BM, BN, W>;
  const int b = 16384 / s, h = 2048 / D;
  FwdParams p;
  p.q = q, p.k = k, p.v = v, p.out = o;
  p.q_s = p.k_s = p.v_s = p.out_s = TensorStrides{int64_t(s) * h * D, int64_t(h) * D, D};
  p.batch = b, p.num_heads = p.num_heads_kv = h, p.head_dim = D, p.seqlen_q = p.seqlen_k = s;
  p.window_right = causal ? 0 : -1;
  p.softmax_scale_log2 = 1.4426950408889634f / std::sqrt(float(D));
  auto kernel = sm80::fwd_kernel<Cfg, T>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  const dim3 grid((s + BM - 1) / BM, h, b);
  for (int i = 0; i < 3; ++i) kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes>>>(p);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  const int iters = 20;
  cudaEventRecord(e0);
  for (int i = 0; i < iters; ++i) kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes>>>(p);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  ms /= iters;
  const double flops = 4.0 * b * h * double(s) * s * D / (causal ? 2 : 1);
  std::printf("d=%3d s=%5d causal=%d  %3dx%3d w%d: %7.1f TFLOP/s  (%s)\n", D, s, int(causal), BM, BN, W,
              flops / ms / 1e9, cudaGetErrorString(cudaGetLastError()));
}

int main() {
  const size_t n = size_t(16384) * 2048;
  T *q, *k, *v, *o;
  cudaMalloc(&q, n * 2), cudaMalloc(&k, n * 2), cudaMalloc(&v, n * 2), cudaMalloc(&o, n * 2);
  fill<<<1024, 256>>>(q, n, 1), fill<<<1024, 256>>>(k, n, 2), fill<<<1024, 256>>>(v, n, 3);
  for (int s : {1024, 4096, 16384})
    for (bool c : {false, true}) {
      run<64, 128, 64, 4>(s, c, q, k, v, o);
      run<64, 128, 128, 4>(s, c, q, k, v, o);
      run<64, 64, 64, 4>(s, c, q, k, v, o);
      run<64, 128, 128, 8>(s, c, q, k, v, o);
      run<128, 128, 64, 4>(s, c, q, k, v, o);
      run<128, 128, 32, 4>(s, c, q, k, v, o);
      run<128, 128, 64, 8>(s, c, q, k, v, o);
      run<128, 64, 64, 4>(s, c, q, k, v, o);
      run<128, 128, 128, 8>(s, c, q, k, v, o);
      run<256, 128, 64, 8>(s, c, q, k, v, o);
      run<256, 64, 64, 4>(s, c, q, k, v, o);
      run<256, 128, 32, 8>(s, c, q, k, v, o);
      run<256, 64, 32, 4>(s, c, q, k, v, o);
    }
  return 0;
}
