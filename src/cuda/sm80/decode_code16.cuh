// Exact 16-bit images of KV codes for the quantized decode's MMAs (sm80/decode_kv_source.cuh, KvQuantSource).
//
// The decode folds every scale and zero point out of the per-element path (scores: per key after the QK MMA; values:
// into P before the P·V MMA, the zero points added in float32), so a code only has to become a 16-bit number the
// tensor core can multiply, EXACTLY: Code16<C, T> turns packed code bytes into T bits whose value is
//     v16 = (code_value − kOff) · kMul         (code_value: the fp8 value or the unsigned integer code)
// with a few 32-bit integer / paired half operations per two codes (PRMT byte moves, LOP3 masks, one HFMA2 / HADD2):
//   e4m3 -> bf16  sign | mag << 4 is the value · 2^-120 (bf16 exponent field = the e4m3 one, subnormals included), then
//                 one fma.rn.bf16x2 by 2^120 (exact: the result is an e4m3 value, normal in bf16)        kMul 1
//   e4m3 -> fp16  sign | mag << 7 is the value · 2^-8 (fp16 subnormals for the e4m3 subnormals, exact)     kMul 2^-8
//   e5m2 -> bf16  sign | mag << 5 is the value · 2^-112, then fma.rn.bf16x2 by 2^112                      kMul 1
//   e5m2 -> fp16  the byte is the top byte of the fp16 value                                             kMul 1
//   u8   -> bf16  (0x43 | low 7 bits) − (0x43 | ~bit 7 << 7) as bf16 = u − 128 (both exact in [128, 256])  kOff 128
//   u8   -> fp16  0x64 | u is 1024 + u; − 1152                                                           kOff 128
//   u4   -> bf16  0x43 | u is 128 + u; − 136                                                             kOff 8
//   u4   -> fp16  0x64 | u is 1024 + u; − 1032                                                           kOff 8
// The integer offsets centre the codes (|v16| <= 2^(bits−1)) so that rounding P·scale to T costs what rounding x̂
// costs, not 2^bits times more. Invalid codes (fp8 NaN / inf) do not occur in appended pages (append rejects
// non-finite input and saturates); they map to arbitrary values here (finite, except e5m2 -> fp16: inf / NaN), and
// slots past a sequence's end are zeroed by the caller. Verified for all 256 bytes of every kind against KVHalfFormat::code_value
// (tests/cuda/test_decode_quant_cuda.cpp, Code16EqualsTheCodeValues).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kvcache/format/traits.hpp"

namespace flashkv::cuda::sm80 {

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
/// a · b + c on two bf16 lanes (round to nearest; subnormal inputs are honoured).
__device__ __forceinline__ uint32_t fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ uint32_t add_f16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("add.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

template <kv::KVCode C, class T>
struct Code16 {
  static_assert(C == kv::KVCode::e4m3 || C == kv::KVCode::e5m2 || C == kv::KVCode::u8 || C == kv::KVCode::u4,
                "Code16 converts fp8 and 8 / 4-bit integer codes");
  static constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  static constexpr float kMul = (C == kv::KVCode::e4m3 && !kBf16) ? 1.0f / 256.0f : 1.0f;
  static constexpr float kOff = C == kv::KVCode::u8 ? 128.0f : (C == kv::KVCode::u4 ? 8.0f : 0.0f);

  /// 8-bit codes: the 4 code bytes of w (byte i = element i) -> two registers of two T each (element 0 low half).
  __device__ __forceinline__ static void convert4(uint32_t w, uint32_t& x01, uint32_t& x23) {
    if constexpr (C == kv::KVCode::e5m2 && !kBf16) {
      x01 = prmt(w, 0u, 0x1404u), x23 = prmt(w, 0u, 0x3424u);  // [b1][0][b0][0]: the fp16 bits
    } else if constexpr (C == kv::KVCode::e4m3 || C == kv::KVCode::e5m2) {
      // lanes [sign x 8][byte] (PRMT's sign replication), shifted so the magnitude sits under the exponent field: the
      // replicated sign lands on bit 15, the byte's own sign bit and the low lane's spill are masked away
      constexpr int kShift = C == kv::KVCode::e5m2 ? 5 : (kBf16 ? 4 : 7);
      constexpr uint32_t kMask = C == kv::KVCode::e5m2 ? 0x8fe08fe0u : (kBf16 ? 0x87f087f0u : 0xbf80bf80u);
      x01 = (prmt(w, 0u, 0x9180u) << kShift) & kMask;
      x23 = (prmt(w, 0u, 0xb3a2u) << kShift) & kMask;
      if constexpr (kBf16) {
        constexpr uint32_t kUp = C == kv::KVCode::e5m2 ? 0x77807780u : 0x7b807b80u;  // 2^112 / 2^120
        x01 = fma_bf16x2(x01, kUp, 0x80008000u), x23 = fma_bf16x2(x23, kUp, 0x80008000u);
      }
    } else {
      static_assert(C == kv::KVCode::u8, "4-bit codes: convert8");
      if constexpr (kBf16) {
        const uint32_t lo7 = w & 0x7f7f7f7fu, hi = ~w & 0x80808080u;
        const uint32_t y01 = prmt(lo7, 0x43434343u, 0x4140u), y23 = prmt(lo7, 0x43434343u, 0x4342u);
        const uint32_t z01 = prmt(hi, 0x43434343u, 0x4140u), z23 = prmt(hi, 0x43434343u, 0x4342u);
        x01 = fma_bf16x2(z01, 0xbf80bf80u, y01), x23 = fma_bf16x2(z23, 0xbf80bf80u, y23);  // y − z
      } else {
        x01 = add_f16x2(prmt(w, 0x64646464u, 0x4140u), 0xe480e480u);  // (1024 + u) − 1152
        x23 = add_f16x2(prmt(w, 0x64646464u, 0x4342u), 0xe480e480u);
      }
    }
  }
  /// 4-bit planar codes: the 4 bytes of w hold elements i (low nibble) and i + head_dim / 2 (high nibble) ->
  /// lo[0..1] the four low-nibble elements, hi[0..1] the four high-nibble ones (two T per register).
  __device__ __forceinline__ static void convert8(uint32_t w, uint32_t (&lo)[2], uint32_t (&hi)[2]) {
    static_assert(C == kv::KVCode::u4, "convert8 is for 4-bit codes");
    const uint32_t l = w & 0x0f0f0f0fu, h = (w >> 4) & 0x0f0f0f0fu;
    constexpr uint32_t kMagic = kBf16 ? 0x43434343u : 0x64646464u;
    const uint32_t a = prmt(l, kMagic, 0x4140u), b = prmt(l, kMagic, 0x4342u);
    const uint32_t c = prmt(h, kMagic, 0x4140u), d = prmt(h, kMagic, 0x4342u);
    if constexpr (kBf16) {  // (128 + u) · 1 − 136
      lo[0] = fma_bf16x2(a, 0x3f803f80u, 0xc308c308u), lo[1] = fma_bf16x2(b, 0x3f803f80u, 0xc308c308u);
      hi[0] = fma_bf16x2(c, 0x3f803f80u, 0xc308c308u), hi[1] = fma_bf16x2(d, 0x3f803f80u, 0xc308c308u);
    } else {  // (1024 + u) − 1032
      lo[0] = add_f16x2(a, 0xe408e408u), lo[1] = add_f16x2(b, 0xe408e408u);
      hi[0] = add_f16x2(c, 0xe408e408u), hi[1] = add_f16x2(d, 0xe408e408u);
    }
  }
};

}  // namespace flashkv::cuda::sm80
