// Where the split-KV decode's K / V tiles come from (sm80/decode_kernel.cuh is templated on it): the one page layout
// of kvcache/page_layout.hpp in the format of kvcache/format/traits.hpp, delivered per 64-token block as two
// kBlockN x kHeadDim 16-bit shared-memory tiles (SmemTile, swizzled) that the mainloop's ldmatrix / mma read.
//
//   Kv16Source     16-bit pages of the query dtype (bf16 / fp16 caches, flash-attn tensors): cp.async straight into
//                  the stage's tiles (no conversion).
//   KvQuantSource  packed pages of any token-granular format (fp8 static / per-token scale, int8 / int4 / int2 with
//                  [scale, min] per token and channel group — KVCode x KVScaling fixed at compile time, group size and
//                  metadata bytes at run time): the stage holds the block's raw codes and metadata (cp.async, so the
//                  HBM stream stays pipelined 3 deep); before the MMAs every thread converts 8 codes at a time in
//                  registers (8 bytes -> 8 codes with shifts and masks; int -> float; fp8 -> fp16 by moving the bits,
//                  equal to fp8_bits_to_float for all 256 codes of both kinds, verified offline)
//                  and applies the token's scale / min (x̂ = min + scale·code with the trait's rounding order, fp8
//                  x̂ = fp8·scale), giving exactly KVHalfFormat::dequant's float, rounded once to the query dtype into
//                  the block's conversion tiles. KIVI keys (channel_affine, G tokens per unit) are not token-granular
//                  and are not instantiated (the host names them in an UnsupportedError).
// Both: key slots past the sequence's length are never read (Kv16: zero-filled by cp.async; quant: written as 0 by the
// conversion, whatever the page holds there).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/common/ptx.cuh"
#include "cuda/common/tile.cuh"
#include "cuda/decode_params.hpp"
#include "kvcache/format/traits.hpp"

namespace flashkv::cuda::sm80 {

inline constexpr int kDecodeBlockN = 64;    ///< tokens per pipeline stage (16 per warp)
inline constexpr int kDecodeThreads = 128;  ///< 4 warps

template <class T, int kHeadDim>
struct Kv16Source {
  using TileKV = attn::SmemTile<kDecodeBlockN, kHeadDim>;
  static constexpr int kStageBytes = 2 * TileKV::kBytes;
  static constexpr int kConvBytes = 0;
  const T* kc;
  const T* vc;
  int head_dim;
  __device__ __forceinline__ Kv16Source(const DecodeParams& p, int hk)
      : kc(static_cast<const T*>(p.k_cache) + hk * p.k_head),
        vc(static_cast<const T*>(p.v_cache) + hk * p.v_head),
        head_dim(p.head_dim) {}
  /// Issues the cp.async copies of keys [j0, j0 + kBlockN) into the stage at `dst`; locate(j, &page, &slot).
  template <class Locate>
  __device__ __forceinline__ void load(const DecodeParams& p, uint32_t dst, int j0, int seqlen_k,
                                       Locate&& locate) const {
    auto row = [&](const T* base, int64_t page_stride, int64_t row_stride, int j) {
      int64_t page;
      int slot;
      locate(j, page, slot);
      return base + page * page_stride + slot * row_stride;
    };
    attn::load_tile_async<TileKV, kDecodeThreads>(
        dst, [&](int r) { return row(kc, p.k_page, p.k_row, j0 + r); }, seqlen_k - j0, head_dim, kc);
    attn::load_tile_async<TileKV, kDecodeThreads>(
        dst + TileKV::kBytes, [&](int r) { return row(vc, p.v_page, p.v_row, j0 + r); }, seqlen_k - j0, head_dim, vc);
  }
  /// Shared-memory address of the block's K tile (V tile at + TileKV::kBytes) once the stage has landed.
  __device__ __forceinline__ uint32_t tiles(uint32_t stage, uint32_t, int, int) const { return stage; }
};

__host__ __device__ constexpr int round16(int x) { return (x + 15) / 16 * 16; }

/// Converts codes c0..c0+7 (c0 a multiple of 8) of row r of a staged block — codes [kBlockN][code_bytes], metadata
/// [kBlockN][meta_bytes_per_unit], the page-head layout of format/traits.hpp — to x̂ (KVHalfFormat::dequant's value).
template <kv::KVCode C, kv::KVScaling S, int kHeadDim>
__device__ __forceinline__ void dequant8(const kv::KVHalfFormat& f, const uint8_t* codes, const uint8_t* meta, int r,
                                         int c0, float head_scale, float x[8]) {
  static_assert(kv::is_integer_code(C) || kv::is_fp8_code(C), "KvQuantSource converts integer and fp8 codes");
  constexpr int kCodeBytes = kHeadDim * kv::code_bits(C) / 8;
  const uint8_t* row = codes + r * kCodeBytes;
  int base = c0, shift = 0;  // planar packing: the 8 codes are bits [shift, shift + bits) of 8 consecutive bytes
  if constexpr (C == kv::KVCode::u4) {
    if (c0 >= kHeadDim / 2) base = c0 - kHeadDim / 2, shift = 4;
  } else if constexpr (C == kv::KVCode::u2) {
    const int plane = c0 / (kHeadDim / 4);
    base = c0 - plane * (kHeadDim / 4), shift = 2 * plane;
  }
  const uint2 w = *reinterpret_cast<const uint2*>(row + base);
  float v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t byte = ((i < 4 ? w.x : w.y) >> (8 * (i & 3))) & 0xFFu;
    if constexpr (kv::is_integer_code(C)) {
      constexpr uint32_t kMask = (1u << kv::code_bits(C)) - 1u;
      v[i] = static_cast<float>((byte >> shift) & kMask);
    } else if constexpr (C == kv::KVCode::e5m2) {
      // e5m2 = the top byte of fp16; the trait reads the inf / NaN codes (> 0x7B) as NaN
      const float f = __half2float(__ushort_as_half(static_cast<unsigned short>(byte << 8)));
      v[i] = (byte & 0x7Fu) > 0x7Bu ? __int_as_float(0x7fc00000) : f;
    } else {  // e4m3: magnitude bits under the fp16 exponent field, times 2^(15 - 7); the NaN code stays NaN
      const unsigned short h = static_cast<unsigned short>(((byte & 0x80u) << 8) | ((byte & 0x7Fu) << 7));
      v[i] = (byte & 0x7Fu) == 0x7Fu ? __int_as_float(0x7fc00000) : __half2float(__ushort_as_half(h)) * 256.0f;
    }
  }
  if constexpr (S == kv::KVScaling::none) {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = v[i];
  } else if constexpr (S == kv::KVScaling::head_static || S == kv::KVScaling::token_f32) {
    float s = head_scale;
    if constexpr (S == kv::KVScaling::token_f32) s = *reinterpret_cast<const float*>(meta + r * 4);
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = __fmul_rn(v[i], s);
  } else {
    static_assert(S == kv::KVScaling::token_affine, "token-granular scalings only");
    const uint32_t sm = *reinterpret_cast<const uint32_t*>(meta + r * f.meta_bytes_per_unit + 4 * (c0 / f.group));
    const float sc = __half2float(__ushort_as_half(static_cast<unsigned short>(sm & 0xFFFFu)));
    const float mn = __half2float(__ushort_as_half(static_cast<unsigned short>(sm >> 16)));
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = __fadd_rn(mn, __fmul_rn(sc, v[i]));  // the trait's order (no contraction)
  }
}

template <class T, int kHeadDim, kv::KVCode KC, kv::KVScaling KS, kv::KVCode VC, kv::KVScaling VS>
struct KvQuantSource {
  using TileKV = attn::SmemTile<kDecodeBlockN, kHeadDim>;
  static constexpr int kCodeBytesK = kHeadDim * kv::code_bits(KC) / 8, kCodeBytesV = kHeadDim * kv::code_bits(VC) / 8;
  static constexpr int kCodeBlockK = round16(kDecodeBlockN * kCodeBytesK), kCodeBlockV = round16(kDecodeBlockN * kCodeBytesV);
  static constexpr int kHalfBytesK = kCodeBlockK + round16(kDecodeBlockN * quant_meta_max(KS, kHeadDim));
  static constexpr int kHalfBytesV = kCodeBlockV + round16(kDecodeBlockN * quant_meta_max(VS, kHeadDim));
  static constexpr int kStageBytes = kHalfBytesK + kHalfBytesV;
  static constexpr int kConvBytes = 2 * TileKV::kBytes;
  static_assert(kCodeBytesK % 16 == 0 && kCodeBytesV % 16 == 0, "code rows are whole 16-byte chunks");

  const uint8_t* codes[2];
  const uint8_t* meta[2];
  kv::KVHalfFormat fmt[2];
  float head_scale[2];
  int64_t page_stride[2], slot_stride[2], meta_page_stride[2];

  __device__ __forceinline__ KvQuantSource(const DecodeParams& p, int hk) {
    codes[0] = static_cast<const uint8_t*>(p.k_cache) + hk * p.k_head;
    codes[1] = static_cast<const uint8_t*>(p.v_cache) + hk * p.v_head;
    meta[0] = p.k_meta != nullptr ? p.k_meta + hk * p.k_meta_head : nullptr;
    meta[1] = p.v_meta != nullptr ? p.v_meta + hk * p.v_meta_head : nullptr;
    fmt[0] = p.k_format, fmt[1] = p.v_format;
    fmt[0].code = KC, fmt[0].scaling = KS, fmt[1].code = VC, fmt[1].scaling = VS;  // compile-time: switches fold
    head_scale[0] = KS == kv::KVScaling::head_static ? p.k_head_scales[hk] : 1.f;
    head_scale[1] = VS == kv::KVScaling::head_static ? p.v_head_scales[hk] : 1.f;
    page_stride[0] = p.k_page, page_stride[1] = p.v_page;
    slot_stride[0] = p.k_row, slot_stride[1] = p.v_row;
    meta_page_stride[0] = p.k_meta_page, meta_page_stride[1] = p.v_meta_page;
  }

  template <class Locate>
  __device__ __forceinline__ void load(const DecodeParams&, uint32_t dst, int j0, int seqlen_k,
                                       Locate&& locate) const {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint32_t hdst = dst + (half == 0 ? 0 : kHalfBytesK);
      const int cb = half == 0 ? kCodeBytesK : kCodeBytesV, chunks = cb / 16;
      for (int i = threadIdx.x; i < kDecodeBlockN * chunks; i += kDecodeThreads) {
        const int r = i / chunks, ch = i % chunks, j = j0 + r;
        if (j >= seqlen_k) continue;  // never read: the conversion writes 0 for it
        int64_t page;
        int slot;
        locate(j, page, slot);
        attn::cp_async_16(hdst + r * cb + ch * 16, codes[half] + page * page_stride[half] + slot * slot_stride[half] + ch * 16);
      }
      const kv::KVScaling sc = half == 0 ? KS : VS;
      if (sc == kv::KVScaling::token_f32 || sc == kv::KVScaling::token_affine) {
        const int mb = fmt[half].meta_bytes_per_unit, words = mb / 4;
        const uint32_t mdst = hdst + (half == 0 ? kCodeBlockK : kCodeBlockV);
        for (int i = threadIdx.x; i < kDecodeBlockN * words; i += kDecodeThreads) {
          const int r = i / words, w = i % words, j = j0 + r;
          if (j >= seqlen_k) continue;
          int64_t page;
          int slot;
          locate(j, page, slot);
          attn::cp_async_4(mdst + r * mb + 4 * w, meta[half] + page * meta_page_stride[half] + fmt[half].meta_offset(slot) + 4 * w);
        }
      }
    }
  }

  /// Converts the landed stage into the conversion tiles at `conv` (all threads; ends with __syncthreads).
  __device__ __forceinline__ uint32_t tiles(uint32_t stage, uint32_t conv, int j0, int seqlen_k) const {
    extern __shared__ __align__(128) char smem[];
    const uint8_t* sbase = reinterpret_cast<const uint8_t*>(smem) + (stage - attn::smem_addr(smem));
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint8_t* sc = sbase + (half == 0 ? 0 : kHalfBytesK);
      const uint8_t* sm = sc + (half == 0 ? kCodeBlockK : kCodeBlockV);
      const uint32_t dst = conv + (half == 0 ? 0 : TileKV::kBytes);
      constexpr int kUnits = kDecodeBlockN * (kHeadDim / 8);
#pragma unroll 2
      for (int i = threadIdx.x; i < kUnits; i += kDecodeThreads) {
        const int r = i / (kHeadDim / 8), c0 = (i % (kHeadDim / 8)) * 8;
        float x[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (j0 + r < seqlen_k) {
          if (half == 0) {
            dequant8<KC, KS, kHeadDim>(fmt[0], sc, sm, r, c0, head_scale[0], x);
          } else {
            dequant8<VC, VS, kHeadDim>(fmt[1], sc, sm, r, c0, head_scale[1], x);
          }
        }
        const uint32_t a = attn::pack2<T>(x[0], x[1]), b = attn::pack2<T>(x[2], x[3]);
        const uint32_t c = attn::pack2<T>(x[4], x[5]), d = attn::pack2<T>(x[6], x[7]);
        asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst + TileKV::offset(r, c0 / 8)), "r"(a),
                     "r"(b), "r"(c), "r"(d));
      }
    }
    __syncthreads();
    return conv;
  }
};

}  // namespace flashkv::cuda::sm80
