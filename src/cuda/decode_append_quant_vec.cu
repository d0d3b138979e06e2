// The vector quantize-on-write append (decode_append.hpp, quant_append_vec): L = head_dim / C lanes per (token, kv
// head) row, C = 16 / 32 consecutive channels per lane, 32 / L rows per warp, one half (K or V) per blockIdx.y.
// Same codes and metadata as the CPU codec (kv::KVHalfFormat::encode_unit) bit for bit; the general kernels of
// decode_append_quant.cu take every shape this one does not.
//
// Throughput (issue 12: append at HBM write speed). The kernel is instruction-bound unless the per-row work is
// amortized, so:
//   * C is the wider of 32 / 16 that every half's channel group (and, for 4-bit codes, head_dim / 2) allows, so
//     that a row's index arithmetic, page lookup, metadata and group reductions are shared by few lanes (run11's
//     Nsight Compute: 8 channels per lane spent ~800 warp instructions per 2 rows, at 16.5 % of DRAM bandwidth);
//   * the row index is split by multiply-high divisors (core::FastDivmod), the page by shifts (page_size is a power
//     of two), positions in 32 bits (the launcher checks capacity < 2^31);
//   * the value check (p.bad) is a packed max over the raw 16-bit words per lane and one vote per warp; only a warp
//     holding a bad value looks for its smallest flat index (the general kernels' rule);
//   * a code is cvt.rni.sat.u8 (4-bit: of min(q, 15)): the trait's asym_code (round half to even, clamp to
//     [0, qmax]) on every finite input; the lane's extremes are min / max instructions (the scan only for
//     a zero extreme, whose sign the CPU takes from the first zero); fp8 pairs convert in one cvt.rn.satfinite.e4m3x2 / e5m2x2 (sm_89+).
// Group extremes: the lane's min / max instructions (its ascending scan `v < mn ? v : mn`, the CPU's order, where the
// extreme is a zero) then an ordered butterfly over the group's lanes in which the lower-channel operand wins ties, so
// even the sign of a zero extreme is the CPU's.
// Planar bytes (kvcache/format/traits.hpp pack_byte): 8-bit byte c = code c; 4-bit byte c = code c | code c + d/2 << 4,
// the high nibble from lane lr + L/2 by one shuffle per 4 bytes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/fast_divmod.hpp"
#include "cuda/check.hpp"
#include "cuda/decode_append.hpp"

namespace flashkv::cuda {
namespace {

/// What the launcher derives from QuantAppendParams once per launch.
struct VecArgs {
  core::FastDivmod heads, seqlen_new;  ///< row -> (token, h), token -> (b, i)
  int32_t page_shift = 0;              ///< log2(page_size)
  /// Per half: a 16-bit input value whose |bits| (sign cleared) is >= this is bad — non-finite, or above 65504 where
  /// the half stores fp16 (codes or scale / min). bf16: 0x7f80 / 0x4780 (65536, the first bf16 above 65504); fp16:
  /// 0x7c00 (a finite fp16 is <= 65504).
  uint32_t bad_from[2] = {0x7f80u, 0x7f80u};
};

__device__ __forceinline__ bool bad_value(float x, bool fp16_range) {
  return !isfinite(x) || (fp16_range && fabsf(x) > 65504.0f);
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

/// The CPU's ascending scan `v < m ? v : m` (kMin) / `v > m ? v : m` over the lane's C values.
template <bool kMin, int C>
__device__ __forceinline__ float scan_extreme(const float (&x)[C]) {
  float m = x[0];
#pragma unroll
  for (int e = 1; e < C; ++e) m = kMin ? (x[e] < m ? x[e] : m) : (x[e] > m ? x[e] : m);
  return m;
}

/// round_even(q) clamped to [0, 255] (cvt.rni.sat.u8; NaN gives 0): the trait's asym_code for qmax = 255; 4-bit codes
/// clamp q to 15 first.
__device__ __forceinline__ uint32_t code_u8(float q) {
  uint16_t c;
  asm("cvt.rni.sat.u8.f32 %0, %1;" : "=h"(c) : "f"(q));
  return c;
}

/// Two fp8 codes, (lo, hi) -> bits 0-7 / 8-15: kv::float_to_fp8_bits of each (hardware pair conversion on sm_89+).
__device__ __forceinline__ uint32_t fp8x2(float lo, float hi, bool e4m3) {
#if __CUDA_ARCH__ >= 890
  uint16_t r;
  if (e4m3) {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  }
  return r;
#else
  return kv::float_to_fp8_bits(lo, e4m3) | (static_cast<uint32_t>(kv::float_to_fp8_bits(hi, e4m3)) << 8);
#endif
}

/// Four byte codes (each < 256) -> one little-endian word.
__device__ __forceinline__ uint32_t pack4(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3) {
  return __byte_perm(__byte_perm(c0, c1, 0x0040), __byte_perm(c2, c3, 0x0040), 0x5410);
}

/// C channels of one lane as float (exact conversions) and, for 16-bit inputs, whether any is bad (packed max of the
/// sign-cleared halfwords against bad_from; float32 inputs test each value).
template <int C>
__device__ __forceinline__ bool load_lane(const void* base, int32_t dtype, int64_t off, float (&x)[C],
                                          uint32_t bad_from, bool fp16_range) {
  if (dtype == 0) {
    const float4* s = reinterpret_cast<const float4*>(static_cast<const float*>(base) + off);
    bool bad = false;
#pragma unroll
    for (int k = 0; k < C / 4; ++k) {
      const float4 a = s[k];
      x[4 * k] = a.x, x[4 * k + 1] = a.y, x[4 * k + 2] = a.z, x[4 * k + 3] = a.w;
    }
#pragma unroll
    for (int e = 0; e < C; ++e) bad |= bad_value(x[e], fp16_range);  // no short circuit: no branches
    return bad;
  }
  const uint4* s = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + off);
  uint32_t w[C / 2];
#pragma unroll
  for (int k = 0; k < C / 8; ++k) {
    const uint4 v = s[k];
    w[4 * k] = v.x, w[4 * k + 1] = v.y, w[4 * k + 2] = v.z, w[4 * k + 3] = v.w;
  }
  uint32_t m = 0;
#pragma unroll
  for (int k = 0; k < C / 2; ++k) m = __vmaxu2(m, w[k] & 0x7fff7fffu);
  if (dtype == 1) {
#pragma unroll
    for (int k = 0; k < C / 2; ++k) x[2 * k] = __uint_as_float(w[k] << 16), x[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
  } else {
#pragma unroll
    for (int k = 0; k < C / 2; ++k) {
      const uint16_t lo = static_cast<uint16_t>(w[k] & 0xffffu), hi = static_cast<uint16_t>(w[k] >> 16);
      asm("cvt.f32.f16 %0, %1;" : "=f"(x[2 * k]) : "h"(lo));
      asm("cvt.f32.f16 %0, %1;" : "=f"(x[2 * k + 1]) : "h"(hi));
    }
  }
  return max(m & 0xffffu, m >> 16) >= bad_from;
}

/// Stores C bytes (C / 4 words) at dst, 16 bytes per instruction.
template <int C>
__device__ __forceinline__ void store_bytes(uint8_t* dst, const uint32_t (&w)[C / 4]) {
  static_assert(C % 16 == 0, "16-byte stores");
#pragma unroll
  for (int k = 0; k < C / 16; ++k)
    reinterpret_cast<uint4*>(dst)[k] = make_uint4(w[4 * k], w[4 * k + 1], w[4 * k + 2], w[4 * k + 3]);
}

/// C channels per lane (16 / 32), L lanes per row; 4 warps per block.
template <int C, int L>
__global__ void __launch_bounds__(128) quant_append_vec_kernel(const QuantAppendParams p, const VecArgs a, int32_t rows) {
  constexpr int kRowsPerWarp = 32 / L;
  const int half = static_cast<int>(blockIdx.y);
  const kv::KVHalfFormat& f = p.format[half];
  const int lane = threadIdx.x % 32, lr = lane % L;
  const int warp0 = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) / 32);
  const int nwarps = static_cast<int>(gridDim.x * blockDim.x / 32);
  const void* in = half == 0 ? p.k_new : p.v_new;
  const int64_t sb = half == 0 ? p.kn_batch : p.vn_batch, si = half == 0 ? p.kn_row : p.vn_row,
                sh = half == 0 ? p.kn_head : p.vn_head;
  const bool fp8 = kv::is_fp8_code(f.code);
  const bool e4m3 = f.code == kv::KVCode::e4m3;
  const bool four_bit = f.bits() == 4;
  const uint32_t qmax = static_cast<uint32_t>(f.qmax());
  const int group_lanes = fp8 ? L : f.group / C;  // lanes sharing one [scale, min] (fp8: the row's scale)
  // the lane's [scale, min] word of its group, and the row's metadata unit (token formats: one unit per slot)
  const int meta_word = fp8 ? 0 : (C * lr) / f.group;
  const int64_t meta_unit = f.meta_bytes_per_unit;
  const uint32_t bad_from = a.bad_from[half];
  const bool fp16_range = !fp8;  // integer codes store an fp16 scale / min
  const int32_t slot_mask = (1 << a.page_shift) - 1;
  for (int w = warp0; w * kRowsPerWarp < rows; w += nwarps) {  // warp-uniform loop: the shuffles below are full
    const int r = w * kRowsPerWarp + lane / L;                     // (b, i, h)
    bool live = r < rows;
    uint32_t tu, hu, bu, iu;
    a.heads.divmod(static_cast<uint32_t>(live ? r : 0), tu, hu);
    a.seqlen_new.divmod(tu, bu, iu);
    const int b = static_cast<int>(bu), i = static_cast<int>(iu), h = static_cast<int>(hu);
    const int32_t cached = p.seqlens[b];
    live = live && cached >= 0 && static_cast<int64_t>(cached) + p.seqlen_new <= p.capacity;  // then pos < 2^31
    float x[C];
    const bool lane_bad = load_lane<C>(in, p.dtype, b * sb + i * si + h * sh + C * lr, x, bad_from, fp16_range);
    if (p.bad != nullptr && __any_sync(0xffffffffu, lane_bad)) {  // rare: the row's smallest bad channel
      unsigned bad_c = 0xffffffffu;
#pragma unroll
      for (int e = C - 1; e >= 0; --e)
        if (bad_value(x[e], fp16_range)) bad_c = static_cast<unsigned>(C * lr + e);
      for (int o = 1; o < L; o <<= 1) bad_c = min(bad_c, __shfl_xor_sync(0xffffffffu, bad_c, o));
      if (bad_c != 0xffffffffu) {
        if (live && lr == 0) atomicMin(&p.bad[half], static_cast<unsigned long long>(r) * p.head_dim + bad_c);
        live = false;
      }
    }
    const int32_t pos = live ? cached + i : 0;
    const int64_t page = live ? p.page_table[b * p.page_table_batch + (pos >> a.page_shift)] : 0;
    const int32_t slot = pos & slot_mask;
    uint8_t* row = p.codes[half] + page * p.page_stride[half] + h * p.head_stride[half] +
                   static_cast<int64_t>(slot) * f.code_bytes;
    uint8_t* meta = p.meta[half] != nullptr
                        ? p.meta[half] + page * p.meta_page_stride[half] + h * p.meta_head_stride[half] + slot * meta_unit
                        : nullptr;
    uint32_t out[C / 4];  // the lane's C codes, one per byte (channels C lr .. C lr + C - 1)
    if (fp8) {
      float scale = p.head_scales[half] != nullptr ? p.head_scales[half][h] : 1.0f;
      if (f.scaling == kv::KVScaling::token_f32) {
        float am = 0.0f;
#pragma unroll
        for (int e = 0; e < C; ++e) am = fmaxf(am, fabsf(x[e]));
        for (int o = 1; o < L; o <<= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));  // |x| >= +0: no ties
        scale = kv::KVHalfFormat::fp8_token_scale(am, e4m3);
        if (live && lr == 0) *reinterpret_cast<float*>(meta) = scale;  // 4-byte aligned (the launcher checks)
      }
      const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
#pragma unroll
      for (int k = 0; k < C / 4; ++k) {
        const uint32_t p01 = fp8x2(x[4 * k] * inv, x[4 * k + 1] * inv, e4m3);
        const uint32_t p23 = fp8x2(x[4 * k + 2] * inv, x[4 * k + 3] * inv, e4m3);
        out[k] = __byte_perm(p01, p23, 0x5410);
      }
    } else {
      // the lane's extremes: min / max instructions give the ascending scan's value (equal floats have equal bits)
      // except for a zero extreme, whose sign the scan takes from the first zero: then the scan itself (rare)
      float mn = x[0], mx = x[0];
#pragma unroll
      for (int e = 1; e < C; ++e) mn = fminf(mn, x[e]), mx = fmaxf(mx, x[e]);
      if (mn == 0.0f) mn = scan_extreme<true, C>(x);
      if (mx == 0.0f) mx = scan_extreme<false, C>(x);  // (defensive: a zero maximum's sign does not reach the scale)
      mn = ordered_extreme<true>(mn, lr, group_lanes), mx = ordered_extreme<false>(mx, lr, group_lanes);
      const kv::KVHalfFormat::AsymParams ap = kv::KVHalfFormat::asym_params(mn, mx, static_cast<int32_t>(qmax));
      uint32_t c[C];
      if (four_bit) {  // the clamp to qmax = 15 in float (an integer bound: the same as clamping the rounded code)
#pragma unroll
        for (int e = 0; e < C; ++e) c[e] = code_u8(fminf((x[e] - ap.minf) * ap.inv, 15.0f));
      } else {  // qmax = 255: the conversion's own saturation
#pragma unroll
        for (int e = 0; e < C; ++e) c[e] = code_u8((x[e] - ap.minf) * ap.inv);
      }
#pragma unroll
      for (int k = 0; k < C / 4; ++k) out[k] = pack4(c[4 * k], c[4 * k + 1], c[4 * k + 2], c[4 * k + 3]);
      if (live && (lr & (group_lanes - 1)) == 0) {  // the group's first lane (group_lanes: a power of two)
        const uint32_t sm = static_cast<uint32_t>(ap.scale_bits) | (static_cast<uint32_t>(ap.min_bits) << 16);
        *reinterpret_cast<uint32_t*>(meta + 4 * meta_word) = sm;
      }
    }
    bool store = live;
    if (four_bit) {  // planar nibbles: the partner lane lr + L/2 holds channels + d/2
#pragma unroll
      for (int k = 0; k < C / 4; ++k) out[k] |= __shfl_xor_sync(0xffffffffu, out[k], L / 2) << 4;
      store = store && lr < L / 2;
    }
    if (store) store_bytes<C>(row + C * lr, out);
  }
}

/// Channels per lane the vector kernel can give half f: the wider of 32 / 16 that divides its token group (fp8: the
/// whole row) and, for 4-bit codes, head_dim / 2 (a lane's nibbles pair with a partner lane's); 0 where the half takes
/// the general kernels (2-bit token codes, which no device format uses; groups not a power-of-two multiple of 16).
int lane_channels(const kv::KVHalfFormat& f, int head_dim) {
  int span = 0;
  if (kv::is_fp8_code(f.code)) {
    if (f.scaling != kv::KVScaling::head_static && f.scaling != kv::KVScaling::token_f32) return 0;
    span = head_dim;
  } else {
    if (!kv::is_integer_code(f.code) || f.scaling != kv::KVScaling::token_affine) return 0;
    if (f.bits() != 8 && f.bits() != 4) return 0;
    if (f.group < 16 || (f.group & (f.group - 1)) != 0 || head_dim % f.group != 0) return 0;
    span = f.bits() == 4 ? (f.group < head_dim / 2 ? f.group : head_dim / 2) : f.group;
  }
  for (int c : {32, 16})
    if (span % c == 0) return c;
  return 0;
}

unsigned grid_for(int64_t warps) {
  const int64_t blocks = (warps + 3) / 4;
  return static_cast<unsigned>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

template <int C, int L>
void launch(const QuantAppendParams& p, const VecArgs& a, int32_t rows, cudaStream_t stream) {
  const int64_t warps = (static_cast<int64_t>(rows) + 32 / L - 1) / (32 / L);
  quant_append_vec_kernel<C, L><<<dim3(grid_for(warps), 2), 128, 0, stream>>>(p, a, rows);
}

/// The instantiated lane layouts: 32 channels per lane at head_dim 32 .. 256 (every kv_cache_dtype's groups), 16 at
/// head_dim 16 / 32 (int4 at 32: its nibble partner; 16-channel rows). Anything else takes the general kernels.
bool launch_cl(int C, int L, const QuantAppendParams& p, const VecArgs& a, int32_t rows, cudaStream_t stream) {
  if (C == 32 && L == 1) return launch<32, 1>(p, a, rows, stream), true;
  if (C == 32 && L == 2) return launch<32, 2>(p, a, rows, stream), true;
  if (C == 32 && L == 4) return launch<32, 4>(p, a, rows, stream), true;
  if (C == 32 && L == 8) return launch<32, 8>(p, a, rows, stream), true;
  if (C == 16 && L == 1) return launch<16, 1>(p, a, rows, stream), true;
  if (C == 16 && L == 2) return launch<16, 2>(p, a, rows, stream), true;
  return false;
}

bool aligned(const void* ptr, int64_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(bytes) == 0; }

}  // namespace

bool quant_append_vec(const QuantAppendParams& p, cudaStream_t stream) {
  const int c0 = lane_channels(p.format[0], p.head_dim), c1 = lane_channels(p.format[1], p.head_dim);
  const int C = c0 < c1 ? c0 : c1;
  if (C == 0 || p.head_dim % C != 0) return false;
  const int L = p.head_dim / C;
  if (L < 1 || L > 32 || (L & (L - 1)) != 0) return false;
  const int64_t in_elems = p.dtype == 0 ? 4 : 8;  // elements per 16-byte load
  const int64_t es[] = {p.kn_batch, p.kn_row, p.kn_head, p.vn_batch, p.vn_row, p.vn_head};
  for (int64_t s : es)
    if (s % in_elems != 0) return false;
  if (!aligned(p.k_new, 16) || !aligned(p.v_new, 16)) return false;
  const int64_t store_align = 16;  // bytes per store_bytes instruction
  for (int half = 0; half < 2; ++half) {
    const kv::KVHalfFormat& f = p.format[half];
    if (f.tokens_per_unit != 1 || f.code_bytes % store_align != 0 || p.page_stride[half] % store_align != 0 ||
        p.head_stride[half] % store_align != 0 || !aligned(p.codes[half], store_align) ||
        (p.meta[half] != nullptr && (!aligned(p.meta[half], 4) || p.meta_page_stride[half] % 4 != 0 ||
                                     p.meta_head_stride[half] % 4 != 0))) {
      return false;
    }
  }
  const int ps = p.page_size;
  if (ps < 1 || (ps & (ps - 1)) != 0) return false;
  const int64_t rows = static_cast<int64_t>(p.batch) * p.seqlen_new * p.num_heads_kv;
  if (rows == 0) return true;
  // 32-bit row / position arithmetic: the grid-stride loop's row index stays below rows + 32 + 2^23 (65536 blocks of 4
  // warps) < 2^31, the dividend FastDivmod takes; positions below the capacity
  if (rows > (int64_t{1} << 30) || p.capacity >= (int64_t{1} << 31) || p.num_heads_kv < 1 || p.seqlen_new < 1) return false;
  VecArgs a;
  a.heads = core::FastDivmod(static_cast<uint32_t>(p.num_heads_kv));
  a.seqlen_new = core::FastDivmod(static_cast<uint32_t>(p.seqlen_new));
  while ((1 << a.page_shift) < ps) ++a.page_shift;
  for (int half = 0; half < 2; ++half) {
    const bool fp16_range = !kv::is_fp8_code(p.format[half].code);
    a.bad_from[half] = p.dtype == 2 ? 0x7c00u : (fp16_range ? 0x4780u : 0x7f80u);
  }
  if (!launch_cl(C, L, p, a, static_cast<int32_t>(rows), stream)) return false;
  check_cuda(cudaGetLastError(), "quant_append (vector) launch");
  note_quant_append_kernel(C, L);
  return true;
}

}  // namespace flashkv::cuda
