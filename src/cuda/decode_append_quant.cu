// Quantize-on-write append of a device PagedKVCache (decode_append.hpp): the value check and the encode kernel. The
// codes and metadata are those of the CPU codec bit for bit: both call kv::KVHalfFormat::encode_unit (format/
// traits.hpp) on the same float rows (bf16 / fp16 / float32 inputs convert exactly), and nvcc compiles it without
// contraction across its roundings (the division and reciprocal are IEEE: no fast-math flags in this target).
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

__global__ void quant_append_check_kernel(const QuantAppendParams p, int64_t total) {
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int half = static_cast<int>(idx / (total / 2));
    const int64_t flat = idx % (total / 2);  // (b, i, h, c) row-major
    const int c = static_cast<int>(flat % p.head_dim);
    const int h = static_cast<int>((flat / p.head_dim) % p.num_heads_kv);
    const int i = static_cast<int>((flat / (static_cast<int64_t>(p.head_dim) * p.num_heads_kv)) % p.seqlen_new);
    const int b = static_cast<int>(flat / (static_cast<int64_t>(p.head_dim) * p.num_heads_kv * p.seqlen_new));
    const int64_t off = half == 0 ? b * p.kn_batch + i * p.kn_row + h * p.kn_head + c
                                  : b * p.vn_batch + i * p.vn_row + h * p.vn_head + c;
    const float x = load_in(half == 0 ? p.k_new : p.v_new, p.dtype, off);
    const bool bad = !isfinite(x) || (needs_fp16_range(p.format[half]) && fabsf(x) > 65504.0f);
    if (bad) atomicMin(&p.bad[half], static_cast<unsigned long long>(flat));
  }
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

unsigned grid_for(int64_t total, int threads) {
  const int64_t blocks = (total + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
}

}  // namespace

void quant_append_check(const QuantAppendParams& p, cudaStream_t stream) {
  const int64_t total = 2 * static_cast<int64_t>(p.batch) * p.seqlen_new * p.num_heads_kv * p.head_dim;
  check_cuda(cudaMemsetAsync(p.bad, 0xFF, 2 * sizeof(unsigned long long), stream), "quant append check init");
  if (total == 0) return;
  quant_append_check_kernel<<<grid_for(total, 256), 256, 0, stream>>>(p, total);
  check_cuda(cudaGetLastError(), "quant_append_check launch");
}

void quant_append(const QuantAppendParams& p, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(p.batch) * p.seqlen_new * p.num_heads_kv;
  if (rows == 0) return;
  quant_append_kernel<<<grid_for(2 * rows, 64), 64, 0, stream>>>(p, rows);
  check_cuda(cudaGetLastError(), "quant_append launch");
}

}  // namespace flashkv::cuda
