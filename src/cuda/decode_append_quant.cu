// Quantize-on-write append of a device PagedKVCache (decode_append.hpp): the general encode kernels (the vector kernel
// of decode_append_quant_vec.cu takes the shapes it can first), each checking the values it encodes when p.bad is set. The
// codes and metadata are those of the CPU codec bit for bit, from the same float rows (bf16 / fp16 / float32 inputs
// convert exactly) and the same trait functions (format/traits.hpp; nvcc compiles them without contraction across
// their roundings: the divisions and reciprocals are IEEE, no fast-math flags in this target):
//   warp kernel    integer codes (token_affine, channel groups of >= 16) and fp8 (static or per-token scale) at head_dim
//                  a multiple of 32: one warp per (token, kv head, half), lane l holding channels l + 32k (coalesced
//                  loads); group extremes / amax by shuffles (min / max are exact in any order), then the trait's
//                  asym_params / asym_code / fp8_token_scale / float_to_fp8_bits, pack_byte for the planar bytes;
//   thread kernel  everything else (16-bit / float32 codes, other head dims): one thread per row calling encode_unit.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/check.hpp"
#include "cuda/decode_append.hpp"

namespace flashkv::cuda {
namespace {

constexpr int kMaxHeadDim = 256;

__device__ __forceinline__ float load_in(const void* base, int32_t dtype, int64_t off) {
  if (dtype == 0) return static_cast<const float*>(base)[off];
  const uint16_t h = static_cast<const uint16_t*>(base)[off];
  return dtype == 1 ? kv::bf16_bits_to_float(h) : kv::fp16_bits_to_float(h);
}

__device__ __forceinline__ bool needs_fp16_range(const kv::KVHalfFormat& f) {
  return f.code == kv::KVCode::f16 || f.scaling == kv::KVScaling::token_affine ||
         f.scaling == kv::KVScaling::channel_affine;
}

/// Whether sequence b's append is valid on the device (the host checked; a mismatch skips the sequence as the 16-bit
/// append does, never clamps).
__device__ __forceinline__ bool seq_ok(const QuantAppendParams& p, int b) {
  const int64_t cached = p.seqlens[b];
  return cached >= 0 && cached + p.seqlen_new <= p.capacity;
}

/// A value `f` cannot store: non-finite, or beyond the fp16 range where the half stores fp16 (codes or scale / min).
__device__ __forceinline__ bool bad_value(float x, const kv::KVHalfFormat& f) {
  return !isfinite(x) || (needs_fp16_range(f) && fabsf(x) > 65504.0f);
}

__global__ void quant_append_kernel(const QuantAppendParams p, int64_t rows) {
  float x[kMaxHeadDim];
  uint8_t tmp[kMaxHeadDim];
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < 2 * rows;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int half = static_cast<int>(idx / rows);
    const int64_t r = idx % rows;  // (b, i, h)
    const int h = static_cast<int>(r % p.num_heads_kv);
    const int i = static_cast<int>((r / p.num_heads_kv) % p.seqlen_new);
    const int b = static_cast<int>(r / (static_cast<int64_t>(p.num_heads_kv) * p.seqlen_new));
    if (!seq_ok(p, b)) continue;
    const int64_t src = half == 0 ? b * p.kn_batch + i * p.kn_row + h * p.kn_head
                                  : b * p.vn_batch + i * p.vn_row + h * p.vn_head;
    const void* in = half == 0 ? p.k_new : p.v_new;
    for (int c = 0; c < p.head_dim; ++c) x[c] = load_in(in, p.dtype, src + c);
    if (p.bad != nullptr) {
      int bad_c = -1;
      for (int c = p.head_dim - 1; c >= 0; --c)
        if (bad_value(x[c], p.format[half])) bad_c = c;
      if (bad_c >= 0) {
        atomicMin(&p.bad[half], static_cast<unsigned long long>(r * p.head_dim + bad_c));
        continue;
      }
    }
    const int64_t pos = p.seqlens[b] + i;
    const int64_t page = p.page_table[b * p.page_table_batch + pos / p.page_size];
    const int32_t slot = static_cast<int32_t>(pos % p.page_size);
    const kv::KVHalfFormat& f = p.format[half];
    uint8_t* codes = p.codes[half] + page * p.page_stride[half] + h * p.head_stride[half];
    uint8_t* meta = p.meta[half] != nullptr ? p.meta[half] + page * p.meta_page_stride[half] + h * p.meta_head_stride[half]
                                            : nullptr;
    const float hs = p.head_scales[half] != nullptr ? p.head_scales[half][h] : 1.0f;
    f.encode_unit(x, codes, meta, slot, hs, tmp);
  }
}

constexpr int kWarpsPerBlock = 4;

/// A group extreme as the CPU's sequential scan finds it (`v < mn ? v : mn` over ascending channels): the smallest
/// (largest) value, and among equal values (only ±0 differ in bits) the one of the lowest channel — so even the sign
/// of a zero extreme, and with it the fp16 min / scale bits, equals the CPU's.
struct Extreme {
  float v;
  int c;
};
template <bool kMin>
__device__ __forceinline__ Extreme pick(Extreme a, Extreme b) {
  const bool take = (kMin ? b.v < a.v : b.v > a.v) || (b.v == a.v && b.c < a.c);
  return take ? b : a;
}
template <bool kMin>
__device__ __forceinline__ Extreme warp_extreme(Extreme e, int width) {
  for (int o = 1; o < width; o <<= 1) {
    const Extreme other{__shfl_xor_sync(0xffffffffu, e.v, o), __shfl_xor_sync(0xffffffffu, e.c, o)};
    e = pick<kMin>(e, other);
  }
  return e;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 1; o < 32; o <<= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// One warp per (b, i, h, half) row; E = head_dim / 32 channels per lane.
template <int E>
__global__ void quant_append_warp_kernel(const QuantAppendParams p, int64_t rows) {
  __shared__ uint8_t tmp[kWarpsPerBlock][32 * E];
  const int lane = threadIdx.x % 32, wib = threadIdx.x / 32;
  const int64_t warp0 = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  for (int64_t idx = warp0; idx < 2 * rows; idx += nwarps) {
    const int half = static_cast<int>(idx / rows);
    const int64_t r = idx % rows;  // (b, i, h)
    const int h = static_cast<int>(r % p.num_heads_kv);
    const int i = static_cast<int>((r / p.num_heads_kv) % p.seqlen_new);
    const int b = static_cast<int>(r / (static_cast<int64_t>(p.num_heads_kv) * p.seqlen_new));
    if (!seq_ok(p, b)) continue;  // uniform over the warp
    const kv::KVHalfFormat& f = p.format[half];
    const int64_t src = half == 0 ? b * p.kn_batch + i * p.kn_row + h * p.kn_head
                                  : b * p.vn_batch + i * p.vn_row + h * p.vn_head;
    const void* in = half == 0 ? p.k_new : p.v_new;
    float x[E];
#pragma unroll
    for (int k = 0; k < E; ++k) x[k] = load_in(in, p.dtype, src + lane + 32 * k);
    if (p.bad != nullptr) {  // the row's smallest bad channel, over the warp (uniform skip)
      unsigned bad_c = 0xffffffffu;
#pragma unroll
      for (int k = E - 1; k >= 0; --k)
        if (bad_value(x[k], f)) bad_c = static_cast<unsigned>(lane + 32 * k);
      bad_c = __reduce_min_sync(0xffffffffu, bad_c);
      if (bad_c != 0xffffffffu) {
        if (lane == 0) atomicMin(&p.bad[half], static_cast<unsigned long long>(r * p.head_dim + bad_c));
        continue;
      }
    }
    const int64_t pos = p.seqlens[b] + i;
    const int64_t page = p.page_table[b * p.page_table_batch + pos / p.page_size];
    const int32_t slot = static_cast<int32_t>(pos % p.page_size);
    uint8_t* row = p.codes[half] + page * p.page_stride[half] + h * p.head_stride[half] +
                   static_cast<int64_t>(slot) * f.code_bytes;
    uint8_t* meta = p.meta[half] != nullptr
                        ? p.meta[half] + page * p.meta_page_stride[half] + h * p.meta_head_stride[half] + f.meta_offset(slot)
                        : nullptr;
    if (kv::is_fp8_code(f.code)) {
      const bool e4m3 = f.code == kv::KVCode::e4m3;
      float scale = p.head_scales[half] != nullptr ? p.head_scales[half][h] : 1.0f;
      if (f.scaling == kv::KVScaling::token_f32) {
        float a = 0.0f;
#pragma unroll
        for (int k = 0; k < E; ++k) a = fmaxf(a, fabsf(x[k]));
        scale = kv::KVHalfFormat::fp8_token_scale(warp_max(a), e4m3);  // |x| >= +0: no signed-zero ties
        if (lane == 0) memcpy(meta, &scale, 4);
      }
      const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
#pragma unroll
      for (int k = 0; k < E; ++k) row[lane + 32 * k] = kv::float_to_fp8_bits(x[k] * inv, e4m3);
      continue;
    }
    // integer codes, [scale, min] per token and group of f.group channels
    const int G = f.group, width = G < 32 ? G : 32, qmax = f.qmax();
    Extreme mn[E], mx[E];
#pragma unroll
    for (int k = 0; k < E; ++k) {
      const Extreme e{x[k], lane + 32 * k};
      mn[k] = warp_extreme<true>(e, width), mx[k] = warp_extreme<false>(e, width);
    }
    if (G > 32) {  // groups span G / 32 consecutive k
      const int span = G / 32;
      Extreme gmn[E], gmx[E];
#pragma unroll
      for (int k = 0; k < E; ++k) {
        const int k0 = k / span * span;
        Extreme a = mn[k0], c = mx[k0];
        for (int j = k0 + 1; j < k0 + span; ++j) a = pick<true>(a, mn[j]), c = pick<false>(c, mx[j]);
        gmn[k] = a, gmx[k] = c;
      }
#pragma unroll
      for (int k = 0; k < E; ++k) mn[k] = gmn[k], mx[k] = gmx[k];
    }
#pragma unroll
    for (int k = 0; k < E; ++k) {
      const int c = lane + 32 * k;
      const kv::KVHalfFormat::AsymParams ap = kv::KVHalfFormat::asym_params(mn[k].v, mx[k].v, qmax);
      tmp[wib][c] = kv::KVHalfFormat::asym_code(x[k], ap, qmax);
      if (c % G == 0) {  // the group's first channel writes its [scale, min]
        uint8_t* m = meta + 4 * (c / G);
        memcpy(m, &ap.scale_bits, 2);
        memcpy(m + 2, &ap.min_bits, 2);
      }
    }
    __syncwarp();
    const int bits = f.bits();
    for (int j = lane; j < f.code_bytes; j += 32) row[j] = kv::KVHalfFormat::pack_byte(tmp[wib], 32 * E, bits, j);
    __syncwarp();
  }
}

/// The warp kernel's formats: fp8 (static / per token) and integer codes with token groups of >= 16 channels.
bool warp_encodable(const kv::KVHalfFormat& f, int head_dim) {
  if (head_dim % 32 != 0 || head_dim > kMaxHeadDim) return false;
  if (kv::is_fp8_code(f.code)) return f.scaling == kv::KVScaling::head_static || f.scaling == kv::KVScaling::token_f32;
  return kv::is_integer_code(f.code) && f.scaling == kv::KVScaling::token_affine && f.group >= 16 &&
         (f.group < 32 ? 32 % f.group == 0 : f.group % 32 == 0);
}

unsigned grid_for(int64_t total, int threads) {
  const int64_t blocks = (total + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
}

thread_local int last_c = 0, last_l = 0;
thread_local bool any_launch = false;

}  // namespace

void note_quant_append_kernel(int channels_per_lane, int lanes_per_row) {
  last_c = channels_per_lane, last_l = lanes_per_row, any_launch = true;
}

std::string quant_append_last_kernel() {
  if (!any_launch) return "";
  if (last_c > 0) return "vector C" + std::to_string(last_c) + " L" + std::to_string(last_l);
  return last_c == 0 ? "warp" : "thread";
}

void quant_append(const QuantAppendParams& p, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(p.batch) * p.seqlen_new * p.num_heads_kv;
  if (rows == 0) return;
  if (quant_append_vec(p, stream)) return;
  const int e = p.head_dim / 32;
  if (warp_encodable(p.format[0], p.head_dim) && warp_encodable(p.format[1], p.head_dim) && (e == 2 || e == 4 || e == 8)) {
    const unsigned grid = grid_for(2 * rows, kWarpsPerBlock);
    if (e == 2) quant_append_warp_kernel<2><<<grid, 32 * kWarpsPerBlock, 0, stream>>>(p, rows);
    if (e == 4) quant_append_warp_kernel<4><<<grid, 32 * kWarpsPerBlock, 0, stream>>>(p, rows);
    if (e == 8) quant_append_warp_kernel<8><<<grid, 32 * kWarpsPerBlock, 0, stream>>>(p, rows);
    check_cuda(cudaGetLastError(), "quant_append (warp) launch");
    note_quant_append_kernel(0, 0);
    return;
  }
  quant_append_kernel<<<grid_for(2 * rows, 64), 64, 0, stream>>>(p, rows);
  check_cuda(cudaGetLastError(), "quant_append launch");
  note_quant_append_kernel(-1, -1);
}

}  // namespace flashkv::cuda
