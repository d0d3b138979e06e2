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

/// All 256 code bytes (word i = bytes 4i..4i+3) through Code16<C, T>: out[b] = the value of byte b's 16-bit image
/// (4-bit codes: out[b] = low nibble image, out[256 + b] = high nibble image).
template <KVCode C, class T>
__global__ void code16_all(float* out) {
  const int i = threadIdx.x;  // 64 threads, one word each
  const uint32_t w = static_cast<uint32_t>(4 * i) | (static_cast<uint32_t>(4 * i + 1) << 8) |
                     (static_cast<uint32_t>(4 * i + 2) << 16) | (static_cast<uint32_t>(4 * i + 3) << 24);
  uint32_t r[4];
  if constexpr (C == KVCode::u4) {
    uint32_t lo[2], hi[2];
    cuda::sm80::Code16<C, T>::convert8(w, lo, hi);
    r[0] = lo[0], r[1] = lo[1], r[2] = hi[0], r[3] = hi[1];
  } else {
    cuda::sm80::Code16<C, T>::convert4(w, r[0], r[1]);
    r[2] = r[3] = 0;
  }
  for (int k = 0; k < (C == KVCode::u4 ? 4 : 2); ++k) {
    const float2 v = cuda::attn::unpack2<T>(r[k]);
    const int base = (k >= 2 ? 256 : 0) + 4 * i + 2 * (k & 1);
    out[base] = v.x, out[base + 1] = v.y;
  }
}

template <KVCode C, class T>
bool code16_launch(float* out, float* mul, float* off) {
  code16_all<C, T><<<1, 64>>>(out);
  *mul = cuda::sm80::Code16<C, T>::kMul, *off = cuda::sm80::Code16<C, T>::kOff;
  return cudaGetLastError() == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess;
}

/// The register-direct fragments' conversions (sm80/decode_frag.hpp, FragCode) on the device: word b = bytes b, b + 37,
/// b + 101, b + 203 (mod 256); out[4b + k] = the k-th result register (8-bit: x02, x13; 4-bit: x[0..3]).
template <KVCode C, bool kBf16, bool kCentered>
__global__ void frag_code_all(uint32_t* out) {
  const uint32_t b = threadIdx.x;  // 256 threads
  const uint32_t w = b | ((b + 37) & 255u) << 8 | ((b + 101) & 255u) << 16 | ((b + 203) & 255u) << 24;
  uint32_t r[4] = {0, 0, 0, 0};
  if constexpr (C == KVCode::u4) {
    cuda::sm80::frag::FragCode<C, kBf16, kCentered>::pairs4(w, r);
  } else {
    cuda::sm80::frag::FragCode<C, kBf16, kCentered>::pairs8(w, r[0], r[1]);
  }
  for (int k = 0; k < 4; ++k) out[4 * b + k] = r[k];
}

template <KVCode C, bool kBf16, bool kCentered>
bool frag_launch(uint32_t* out) {
  frag_code_all<C, kBf16, kCentered><<<1, 256>>>(out);
  return cudaGetLastError() == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess;
}

}  // namespace

bool frag_code_on_device(kv::KVCode code, bool bf16, bool centered, uint32_t* out) {
  if (!centered) return code == KVCode::u4 && bf16 && frag_launch<KVCode::u4, true, false>(out);
  switch (code) {
    case KVCode::e4m3: return bf16 ? frag_launch<KVCode::e4m3, true, true>(out) : frag_launch<KVCode::e4m3, false, true>(out);
    case KVCode::e5m2: return bf16 ? frag_launch<KVCode::e5m2, true, true>(out) : frag_launch<KVCode::e5m2, false, true>(out);
    case KVCode::u8: return bf16 ? frag_launch<KVCode::u8, true, true>(out) : frag_launch<KVCode::u8, false, true>(out);
    case KVCode::u4: return bf16 ? frag_launch<KVCode::u4, true, true>(out) : frag_launch<KVCode::u4, false, true>(out);
    default: return false;
  }
}

bool code16_on_device(kv::KVCode code, bool bf16, float* out, float* mul, float* off) {
  switch (code) {
    case KVCode::e4m3: return bf16 ? code16_launch<KVCode::e4m3, __nv_bfloat16>(out, mul, off) : code16_launch<KVCode::e4m3, __half>(out, mul, off);
    case KVCode::e5m2: return bf16 ? code16_launch<KVCode::e5m2, __nv_bfloat16>(out, mul, off) : code16_launch<KVCode::e5m2, __half>(out, mul, off);
    case KVCode::u8: return bf16 ? code16_launch<KVCode::u8, __nv_bfloat16>(out, mul, off) : code16_launch<KVCode::u8, __half>(out, mul, off);
    case KVCode::u4: return bf16 ? code16_launch<KVCode::u4, __nv_bfloat16>(out, mul, off) : code16_launch<KVCode::u4, __half>(out, mul, off);
    default: return false;
  }
}

bool dequant8_on_device(const kv::KVHalfFormat& f, const uint8_t* codes, const uint8_t* meta, int rows,
                        float head_scale, float* out) {
  return any_format<64>(f, codes, meta, rows, head_scale, out) || any_format<128>(f, codes, meta, rows, head_scale, out);
}

}  // namespace flashkv::cudatest
