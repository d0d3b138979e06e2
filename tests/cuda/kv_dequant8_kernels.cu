// Kernels of kv_dequant8_kernels.hpp.
#include <cuda_runtime_api.h>

#include "cuda/sm80/decode_kv_source.cuh"
#include "kv_dequant8_kernels.hpp"

namespace flashkv::cudatest {
namespace {

using kv::KVCode;
using kv::KVScaling;

template <KVCode C, KVScaling S, int D>
__global__ void dequant8_rows(kv::KVHalfFormat f, const uint8_t* codes, const uint8_t* meta, int rows, float hs,
                              float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;  // one thread per 8 codes
  if (i >= rows * (D / 8)) return;
  const int r = i / (D / 8), c0 = (i % (D / 8)) * 8;
  float x[8];
  cuda::sm80::dequant8<C, S, D>(f, codes, meta, r, c0, hs, x);
  for (int k = 0; k < 8; ++k) out[r * D + c0 + k] = x[k];
}

template <KVCode C, KVScaling S, int D>
bool launch(const kv::KVHalfFormat& f, const uint8_t* codes, const uint8_t* meta, int rows, float hs, float* out) {
  if (f.code != C || f.scaling != S || f.head_dim != D) return false;
  const int n = rows * (D / 8);
  dequant8_rows<C, S, D><<<(n + 127) / 128, 128>>>(f, codes, meta, rows, hs, out);
  return cudaGetLastError() == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess;
}

template <int D>
bool any_format(const kv::KVHalfFormat& f, const uint8_t* codes, const uint8_t* meta, int rows, float hs, float* out) {
  return launch<KVCode::u8, KVScaling::token_affine, D>(f, codes, meta, rows, hs, out) ||
         launch<KVCode::u4, KVScaling::token_affine, D>(f, codes, meta, rows, hs, out) ||
         launch<KVCode::u2, KVScaling::token_affine, D>(f, codes, meta, rows, hs, out) ||
         launch<KVCode::e4m3, KVScaling::head_static, D>(f, codes, meta, rows, hs, out) ||
         launch<KVCode::e4m3, KVScaling::token_f32, D>(f, codes, meta, rows, hs, out) ||
         launch<KVCode::e5m2, KVScaling::head_static, D>(f, codes, meta, rows, hs, out) ||
         launch<KVCode::e5m2, KVScaling::token_f32, D>(f, codes, meta, rows, hs, out);
}

}  // namespace

bool dequant8_on_device(const kv::KVHalfFormat& f, const uint8_t* codes, const uint8_t* meta, int rows,
                        float head_scale, float* out) {
  return any_format<64>(f, codes, meta, rows, head_scale, out) || any_format<128>(f, codes, meta, rows, head_scale, out);
}

}  // namespace flashkv::cudatest
