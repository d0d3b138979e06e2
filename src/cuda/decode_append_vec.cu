// Vectorized append kernels (decode_append.hpp): 16-byte loads of 8 channels per lane, for the shapes that allow them
// (head_dim a multiple of 8 — a power of two <= 256 for the quantized one —, element strides and pointers aligned);
// decode_append.cu / decode_append_quant.cu keep the general kernels for everything else. Same results bit for bit:
//   16-bit copy     one thread per 16-byte chunk of K and of V; the token row's page lookup once per chunk pair.
//   quantize        L = head_dim / 8 lanes per (token, kv head) row, 32 / L rows per warp, one half (K or V) per
//                   blockIdx.y: lane l holds channels 8l .. 8l + 7. Group extremes by an ordered butterfly over the
//                   group's G / 8 lanes (the lower-channel operand wins ties, so the result — even the sign of a zero —
//                   is the CPU's ascending scan `v < mn ? v : mn`), the trait's asym_params / asym_code /
//                   fp8_token_scale / float_to_fp8_bits, and the planar bytes (kvcache/format/traits.hpp pack_byte:
//                   byte i = code i | code i + head_dim / 2 << 4 for int4) formed by a shuffle from the partner lane.
// Value check (p.bad != nullptr): the smallest flat (b, i, h, c) index of a bad value by atomicMin; the 16-bit copy still
// copies the row, the quantized append does not write it (as the general kernels do).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>

#include "cuda/check.hpp"
#include "cuda/decode_append.hpp"

namespace flashkv::cuda {
namespace {

bool aligned(const void* ptr, int64_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(bytes) == 0; }

unsigned grid_for(int64_t work, int per_block) {
  const int64_t blocks = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

// ---- 16-bit copy ----------------------------------------------------------------------------------------------------

/// Bit e of the result set when 16-bit element e of the 8 in `w` has every exponent bit set (inf / NaN).
__device__ __forceinline__ unsigned bad_halves(const uint4& w, uint16_t mask) {
  const uint32_t m2 = static_cast<uint32_t>(mask) * 0x10001u;
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  unsigned bits = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t eq = __vcmpeq2(words[k] & m2, m2);  // 0xffff per equal halfword
    bits |= ((eq & 1u) | ((eq >> 15) & 2u)) << (2 * k);
  }
  return bits;
}

constexpr int kCopyThreads = 256;

__global__ void __launch_bounds__(kCopyThreads) append_kv_vec_kernel(const AppendParams p, int64_t chunks) {
  const int cpr = p.head_dim / 8;  // chunks per kv head
  const int64_t per_token = static_cast<int64_t>(p.num_heads_kv) * cpr;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(kCopyThreads) + threadIdx.x; idx < chunks;
       idx += static_cast<int64_t>(gridDim.x) * kCopyThreads) {
    const int64_t token = idx / per_token;  // (b, i)
    const int j = static_cast<int>(idx - token * per_token);
    const int hk = j / cpr, c = 8 * (j - hk * cpr);
    const uint32_t tu = static_cast<uint32_t>(token);  // tokens < 2^31 (append_kv_vec): 32-bit division
    const uint32_t bu = p.seqlen_new == 1 ? tu : tu / static_cast<uint32_t>(p.seqlen_new);
    const int b = static_cast<int>(bu), i = static_cast<int>(tu - bu * static_cast<uint32_t>(p.seqlen_new));
    int64_t kdst, vdst;
    if (!append16_slot(p, b, i, kdst, vdst)) continue;
    const uint4 kx = *reinterpret_cast<const uint4*>(p.k_new + b * p.kn_batch + i * p.kn_row + hk * p.kn_head + c);
    const uint4 vx = *reinterpret_cast<const uint4*>(p.v_new + b * p.vn_batch + i * p.vn_row + hk * p.vn_head + c);
    if (p.bad != nullptr) {
      const unsigned kb = bad_halves(kx, p.exp_mask), vb = bad_halves(vx, p.exp_mask);
      const unsigned long long flat = static_cast<unsigned long long>(idx) * 8;  // (b, i, h, c) row-major
      if (kb != 0) atomicMin(&p.bad[0], flat + static_cast<unsigned>(__ffs(kb) - 1));
      if (vb != 0) atomicMin(&p.bad[1], flat + static_cast<unsigned>(__ffs(vb) - 1));
    }
    *reinterpret_cast<uint4*>(p.k_cache + kdst + hk * p.k_head + c) = kx;
    *reinterpret_cast<uint4*>(p.v_cache + vdst + hk * p.v_head + c) = vx;
  }
}

// ---- quantize on write ----------------------------------------------------------------------------------------------

/// 8 consecutive channels as float (exact conversions: bf16 by a shift, fp16 by the hardware's cvt.f32.f16), one
/// branch on the dtype per row rather than per element.
__device__ __forceinline__ void load8(const void* base, int32_t dtype, int64_t off, float (&x)[8]) {
  if (dtype == 0) {
    const float4* s = reinterpret_cast<const float4*>(static_cast<const float*>(base) + off);
    const float4 a = s[0], b = s[1];
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
    return;
  }
  const uint4 w = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + off);
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  if (dtype == 1) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      x[2 * k] = __uint_as_float(words[k] << 16), x[2 * k + 1] = __uint_as_float(words[k] & 0xffff0000u);
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint16_t lo = static_cast<uint16_t>(words[k] & 0xffffu), hi = static_cast<uint16_t>(words[k] >> 16);
    asm("cvt.f32.f16 %0, %1;" : "=f"(x[2 * k]) : "h"(lo));
    asm("cvt.f32.f16 %0, %1;" : "=f"(x[2 * k + 1]) : "h"(hi));
  }
}

__device__ __forceinline__ bool bad_value(float x, const kv::KVHalfFormat& f) {
  const bool fp16 = f.code == kv::KVCode::f16 || f.scaling == kv::KVScaling::token_affine ||
                    f.scaling == kv::KVScaling::channel_affine;
  return !isfinite(x) || (fp16 && fabsf(x) > 65504.0f);
}

/// Group min (kMin) / max over `lanes` consecutive lanes (a power of two, aligned): the ascending scan's result. At
/// butterfly step o a lane's segment merges with the adjacent one; the lower-channel operand wins ties.
template <bool kMin>
__device__ __forceinline__ float ordered_extreme(float v, int lane, int lanes) {
  for (int o = 1; o < lanes; o <<= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    const bool other_lower = (lane & o) != 0;
    const float lo = other_lower ? other : v, hi = other_lower ? v : other;  // lo: the lower channels' result
    v = kMin ? (hi < lo ? hi : lo) : (hi > lo ? hi : lo);
  }
  return v;
}

/// L lanes per row (head_dim = 8 L), one half per blockIdx.y; 4 warps per block.
template <int L>
__global__ void __launch_bounds__(128) quant_append_vec_kernel(const QuantAppendParams p, int64_t rows) {
  constexpr int kRowsPerWarp = 32 / L;
  const int half = static_cast<int>(blockIdx.y);
  const kv::KVHalfFormat& f = p.format[half];
  const int lane = threadIdx.x % 32, lr = lane % L;
  const int64_t warp0 = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  const void* in = half == 0 ? p.k_new : p.v_new;
  const int64_t sb = half == 0 ? p.kn_batch : p.vn_batch, si = half == 0 ? p.kn_row : p.vn_row,
                sh = half == 0 ? p.kn_head : p.vn_head;
  const bool fp8 = kv::is_fp8_code(f.code);
  const bool e4m3 = f.code == kv::KVCode::e4m3;
  const int bits = f.bits(), qmax = f.qmax();
  const int group_lanes = fp8 ? L : f.group / 8;
  for (int64_t w = warp0; w * kRowsPerWarp < rows; w += nwarps) {  // warp-uniform loop: the shuffles below are full
    const int64_t r = w * kRowsPerWarp + lane / L;                   // (b, i, h)
    bool live = r < rows;
    const int64_t rr = live ? r : 0;
    const uint32_t ru = static_cast<uint32_t>(rr);  // rows < 2^31 (quant_append_vec): 32-bit division
    const uint32_t tu = ru / static_cast<uint32_t>(p.num_heads_kv);
    const int h = static_cast<int>(ru - tu * static_cast<uint32_t>(p.num_heads_kv));
    const uint32_t bu = p.seqlen_new == 1 ? tu : tu / static_cast<uint32_t>(p.seqlen_new);
    const int b = static_cast<int>(bu), i = static_cast<int>(tu - bu * static_cast<uint32_t>(p.seqlen_new));
    const int64_t cached = p.seqlens[b];
    live = live && cached >= 0 && cached + p.seqlen_new <= p.capacity;
    float x[8];
    load8(in, p.dtype, b * sb + i * si + h * sh + 8 * lr, x);
    if (p.bad != nullptr) {  // the row's smallest bad channel, over its L lanes
      unsigned bad_c = 0xffffffffu;
#pragma unroll
      for (int e = 7; e >= 0; --e)
        if (bad_value(x[e], f)) bad_c = static_cast<unsigned>(8 * lr + e);
      for (int o = 1; o < L; o <<= 1) bad_c = min(bad_c, __shfl_xor_sync(0xffffffffu, bad_c, o));
      if (bad_c != 0xffffffffu) {
        if (live && lr == 0) atomicMin(&p.bad[half], static_cast<unsigned long long>(rr * p.head_dim + bad_c));
        live = false;
      }
    }
    const int64_t pos = live ? cached + i : 0;
    const int64_t page = live ? p.page_table[b * p.page_table_batch + pos / p.page_size] : 0;
    const int32_t slot = static_cast<int32_t>(pos % p.page_size);
    uint8_t* row = p.codes[half] + page * p.page_stride[half] + h * p.head_stride[half] +
                   static_cast<int64_t>(slot) * f.code_bytes;
    uint8_t* meta = p.meta[half] != nullptr
                        ? p.meta[half] + page * p.meta_page_stride[half] + h * p.meta_head_stride[half] + f.meta_offset(slot)
                        : nullptr;
    uint32_t lo = 0, hi = 0;  // the lane's 8 codes, one per byte (channels 8 lr .. 8 lr + 7)
    if (fp8) {
      float scale = p.head_scales[half] != nullptr ? p.head_scales[half][h] : 1.0f;
      if (f.scaling == kv::KVScaling::token_f32) {
        float a = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) a = fmaxf(a, fabsf(x[e]));
        for (int o = 1; o < L; o <<= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));  // |x| >= +0: no ties
        scale = kv::KVHalfFormat::fp8_token_scale(a, e4m3);
        if (live && lr == 0) memcpy(meta, &scale, 4);
      }
      const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const uint32_t c = kv::float_to_fp8_bits(x[e] * inv, e4m3);
        if (e < 4) lo |= c << (8 * e); else hi |= c << (8 * (e - 4));
      }
    } else {
      float mn = x[0], mx = x[0];
#pragma unroll
      for (int e = 1; e < 8; ++e) mn = x[e] < mn ? x[e] : mn, mx = x[e] > mx ? x[e] : mx;
      mn = ordered_extreme<true>(mn, lr, group_lanes), mx = ordered_extreme<false>(mx, lr, group_lanes);
      const kv::KVHalfFormat::AsymParams ap = kv::KVHalfFormat::asym_params(mn, mx, qmax);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const uint32_t c = kv::KVHalfFormat::asym_code(x[e], ap, qmax);
        if (e < 4) lo |= c << (8 * e); else hi |= c << (8 * (e - 4));
      }
      if (live && lr % group_lanes == 0) {  // the group's first lane writes its [scale, min]
        uint8_t* m = meta + 4 * ((8 * lr) / f.group);
        memcpy(m, &ap.scale_bits, 2);
        memcpy(m + 2, &ap.min_bits, 2);
      }
    }
    // planar bytes: byte c of the row = code c (8 bits) / code c | code c + d/2 << 4 (4 bits: from lane lr + L/2)
    int store_lanes = L;
    if (bits == 4) {
      lo |= __shfl_xor_sync(0xffffffffu, lo, L / 2) << 4, hi |= __shfl_xor_sync(0xffffffffu, hi, L / 2) << 4;
      store_lanes = L / 2;
    }
    if (live && lr < store_lanes) *reinterpret_cast<uint2*>(row + 8 * lr) = make_uint2(lo, hi);
  }
}

/// A half the vector kernel encodes: fp8 (static / per-token scale) or int8 / int4 codes per token with groups of
/// 8 .. d channels whose lane count G / 8 is a power of two (2-bit token codes, which no device format uses, take the
/// general kernels).
bool vec_encodable(const kv::KVHalfFormat& f, int head_dim) {
  if (kv::is_fp8_code(f.code)) return f.scaling == kv::KVScaling::head_static || f.scaling == kv::KVScaling::token_f32;
  if (!kv::is_integer_code(f.code) || f.scaling != kv::KVScaling::token_affine) return false;
  const int gl = f.group / 8;
  return (f.bits() == 8 || (f.bits() == 4 && head_dim >= 16)) && f.group % 8 == 0 && gl >= 1 && (gl & (gl - 1)) == 0 &&
         head_dim % f.group == 0;
}

}  // namespace

bool append_kv_vec(const AppendParams& p, cudaStream_t stream) {
  const int64_t es[] = {p.kn_batch, p.kn_row, p.kn_head, p.vn_batch, p.vn_row, p.vn_head,
                        p.k_page,   p.k_row,  p.k_head,  p.v_page,   p.v_row,  p.v_head};
  if (p.head_dim % 8 != 0) return false;
  for (int64_t s : es)
    if (s % 8 != 0) return false;
  if (!aligned(p.k_new, 16) || !aligned(p.v_new, 16) || !aligned(p.k_cache, 16) || !aligned(p.v_cache, 16)) return false;
  const int64_t chunks = static_cast<int64_t>(p.batch) * p.seqlen_new * p.num_heads_kv * (p.head_dim / 8);
  if (chunks == 0) return true;
  if (static_cast<int64_t>(p.batch) * p.seqlen_new >= (int64_t{1} << 31)) return false;  // 32-bit token arithmetic
  append_kv_vec_kernel<<<grid_for(chunks, kCopyThreads), kCopyThreads, 0, stream>>>(p, chunks);
  check_cuda(cudaGetLastError(), "append_kv (vector) launch");
  return true;
}

bool quant_append_vec(const QuantAppendParams& p, cudaStream_t stream) {
  const int L = p.head_dim / 8;
  if (p.head_dim % 8 != 0 || L < 1 || L > 32 || (L & (L - 1)) != 0) return false;
  const int64_t in_align = p.dtype == 0 ? 4 : 2;  // elements per 16 bytes: 4 (float32) / 8 (16-bit)
  const int64_t es[] = {p.kn_batch, p.kn_row, p.kn_head, p.vn_batch, p.vn_row, p.vn_head};
  for (int64_t s : es)
    if (s % (16 / in_align) != 0) return false;
  if (!aligned(p.k_new, 16) || !aligned(p.v_new, 16)) return false;
  for (int half = 0; half < 2; ++half) {
    const kv::KVHalfFormat& f = p.format[half];
    if (!vec_encodable(f, p.head_dim) || f.code_bytes % 8 != 0 || p.page_stride[half] % 8 != 0 ||
        p.head_stride[half] % 8 != 0 || !aligned(p.codes[half], 8)) {
      return false;
    }
  }
  const int64_t rows = static_cast<int64_t>(p.batch) * p.seqlen_new * p.num_heads_kv;
  if (rows == 0) return true;
  if (rows >= (int64_t{1} << 31)) return false;  // the kernel's 32-bit row arithmetic
  const int64_t warps = (rows + 32 / L - 1) / (32 / L);
  const dim3 grid(grid_for(warps, 4), 2);
  switch (L) {
    case 1: quant_append_vec_kernel<1><<<grid, 128, 0, stream>>>(p, rows); break;
    case 2: quant_append_vec_kernel<2><<<grid, 128, 0, stream>>>(p, rows); break;
    case 4: quant_append_vec_kernel<4><<<grid, 128, 0, stream>>>(p, rows); break;
    case 8: quant_append_vec_kernel<8><<<grid, 128, 0, stream>>>(p, rows); break;
    case 16: quant_append_vec_kernel<16><<<grid, 128, 0, stream>>>(p, rows); break;
    default: quant_append_vec_kernel<32><<<grid, 128, 0, stream>>>(p, rows); break;
  }
  check_cuda(cudaGetLastError(), "quant_append (vector) launch");
  return true;
}

}  // namespace flashkv::cuda
