// Thin wrappers over the warp-level instructions every CUDA kernel family of flashkv uses (sm_80 and later, so shared by
// the sm80 mma.sync and the sm90 wgmma kernels): cp.async (global -> shared, 16 or 4 bytes, zero-fill), vector float
// reductions, acquire loads, ex2.approx / tanh.approx, 16-bit packing, quad (4-lane) reductions and the non-finite
// test of packed 16-bit values. The MMA atoms live with their family: sm80/mma.cuh (ldmatrix, mma.sync), sm90/wgmma.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flashkv::cuda::attn {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// 16-byte asynchronous copy; when `pred` is false the destination is zero-filled and `src` is not read.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool pred) {
  const int bytes = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
/// 16-byte asynchronous copy of a source that is known to be valid (no zero-fill operand).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
/// dst[0..1] += (a, b) in global memory, relaxed, no return value (one vector reduction on sm_90, two on sm_80).
__device__ __forceinline__ void red_add_f32x2(float* dst, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
#endif
}
/// 4-byte asynchronous copy (cached at all levels; lse / D rows of the backward).
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
/// Prefetch of the cache line holding `p` into L2 (a hint: no register, no shared memory, no fault semantics needed
/// beyond a valid address).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }
/// 4-byte asynchronous copy; pred false zero-fills dst and does not read src.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool pred) {
  const int bytes = pred ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
/// Load with acquire semantics at GPU scope (the deterministic backward's turn counters).
__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/// Two floats -> one 32-bit register holding two T (round to nearest even); `lo` is the lower address.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <class T>
__device__ __forceinline__ float2 unpack2(uint32_t v);
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t v) {
  return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v));
}
template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t v) {
  return __half22float2(*reinterpret_cast<__half2*>(&v));
}

/// 2^x (MUFU.EX2; ex2(-inf) = 0).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
/// 2^x on the FMA pipe (FlashAttention-4's software exponential, ported to Hopper's scalar FFMA): x = i + f with
/// i = floor(x) (one round-down add of 1.5*2^23), 2^f by a degree-3 minimax polynomial (max relative error 7.5e-5 on
/// [0, 1): below the 16-bit rounding of P), times 2^i built from the integer bits. Matches exp2_approx's special
/// cases: x < -126 gives 0 (2^i with i = -127 is the float 0, as MUFU's flush to zero), -inf gives 0, NaN stays NaN
/// (fmaxf would drop it: the clamp is max.NaN). 9 instructions, 8 of them on the FMA/ALU pipes.
/// Source: Zadouri et al., "FlashAttention-4" (2026), "software emulation of the exponential".
__device__ __forceinline__ float exp2_poly3(float x) {
  constexpr float kMagic = 12582912.f;  // 1.5 * 2^23: adding it leaves floor(x) in the low mantissa bits
  asm("max.NaN.f32 %0, %0, 0fC2FE0000;\n" : "+f"(x));  // x = max(x, -127), NaN kept
  const float j = __fadd_rd(x, kMagic);
  const float f = x - __fsub_rn(j, kMagic);  // f in [0, 1)
  const float p = fmaf(fmaf(fmaf(0.07802403f, f, 0.22606707f), f, 0.695834f), f, 0.99992514f);
  // bits(j) = 0x4B400000 + i; (bits << 23) = i << 23 (mod 2^32); + 127 << 23 = the float 2^i (0 for i = -127).
  const float scale = __uint_as_float((__float_as_uint(j) << 23) + 0x3F800000u);
  return p * scale;
}
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/// Exponent bits of T (all ones: +-inf or NaN), for the non-finite tests of packed 16-bit values.
template <class T>
struct NonFiniteBits;
template <>
struct NonFiniteBits<__nv_bfloat16> {
  static constexpr uint32_t kPair = 0x7F807F80u;
};
template <>
struct NonFiniteBits<__half> {
  static constexpr uint32_t kPair = 0x7C007C00u;
};
/// True when either 16-bit half of `w` is +-inf or NaN.
template <class T>
__device__ __forceinline__ bool pair_nonfinite(uint32_t w) {
  return __vcmpeq2(w & NonFiniteBits<T>::kPair, NonFiniteBits<T>::kPair) != 0u;
}
/// True when one of the eight 16-bit values of a 16-byte chunk is +-inf or NaN.
template <class T>
__device__ __forceinline__ bool chunk_nonfinite(const uint4& c) {
  return pair_nonfinite<T>(c.x) || pair_nonfinite<T>(c.y) || pair_nonfinite<T>(c.z) || pair_nonfinite<T>(c.w);
}

}  // namespace flashkv::cuda::attn
