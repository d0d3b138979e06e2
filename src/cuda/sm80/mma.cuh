// The Ampere (sm_80) MMA atoms of the sm80 kernel family: ldmatrix (shared -> mma fragments, optionally transposed) and
// mma.sync m16n8k16 (bf16/fp16 inputs, float32 accumulation). Everything arch-neutral (cp.async, exp2, packing, quad
// reductions, tiles, softmax, masks, epilogues) is in src/cuda/common/ (namespace attn), visible here by the
// using-directive below.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), lane = 4*g + t:
//   A 16x16 (row-major): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B 16x8  (k x n):     b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g)
//   C 16x8  (float):     c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1)   (common/frag.cuh: the same as wgmma's)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/common/ptx.cuh"

namespace flashkv::cuda::sm80 {

using namespace ::flashkv::cuda::attn;  // the shared collectives (common/) are the sm80 family's vocabulary

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// The transpose of one 8x8 matrix of 16-bit elements in the fragment layout (lane 4g + t holds row g, columns
/// 2t..2t+1; PTX movmatrix, sm_75+): the result holds row g of the transposed matrix, i.e. elements (2t, g), (2t+1, g).
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t d;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(d) : "r"(x));
  return d;
}

/// d += a * b for one m16n8k16 tile; T is __nv_bfloat16 or __half.
template <class T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace flashkv::cuda::sm80
