// Device Hadamard rotation of query rows, appended rows and merged decode outputs (decode_rotate.hpp): one warp per
// row, the row in shared memory, kv::hadamard_rotate_lanes — the CPU cache's own definition — over the warp's lanes.
#include "cuda/decode_rotate.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/merge.hpp"
#include "cuda/check.hpp"
#include "cuda/sm80/decode_kernel.cuh"  // decode_seq / decode_rule: the combine's row geometry
#include "kvcache/format/hadamard.hpp"

namespace flashkv::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kMaxDim = 256;

__device__ __forceinline__ float load_as(const void* base, int32_t dtype, int64_t off) {
  if (dtype == 0) return static_cast<const float*>(base)[off];
  if (dtype == 1) return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[off]);
  return __half2float(static_cast<const __half*>(base)[off]);
}

__device__ __forceinline__ void store_as(void* base, int32_t dtype, int64_t off, float x) {
  if (dtype == 0) {
    static_cast<float*>(base)[off] = x;
  } else if (dtype == 1) {
    static_cast<__nv_bfloat16*>(base)[off] = __float2bfloat16_rn(x);
  } else {
    static_cast<__half*>(base)[off] = __float2half_rn(x);
  }
}

__device__ __forceinline__ void rotate_warp(float* x, int32_t n, const float* signs, float norm, bool inverse) {
  kv::hadamard_rotate_lanes(x, n, signs, norm, inverse, static_cast<int32_t>(threadIdx.x % 32), 32, [] { __syncwarp(); });
}

__global__ void rotate_rows_kernel(const RotateRowsParams p) {
  __shared__ float buf[kWarps][kMaxDim];
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= static_cast<int64_t>(p.batch) * p.rows * p.heads) return;
  const int64_t h = row % p.heads, i = (row / p.heads) % p.rows, b = row / (static_cast<int64_t>(p.heads) * p.rows);
  float* x = buf[threadIdx.x / 32];
  const int64_t so = b * p.src_batch + i * p.src_row + h * p.src_head;
  for (int c = lane; c < p.head_dim; c += 32) x[c] = load_as(p.src, p.src_dtype, so + c);
  __syncwarp();
  if (p.signs != nullptr) rotate_warp(x, p.head_dim, p.signs, p.norm, p.inverse);
  const int64_t d = b * p.dst_batch + i * p.dst_row + h * p.dst_head;
  for (int c = lane; c < p.head_dim; c += 32) store_as(p.dst, p.dst_dtype, d + c, x[c]);
}

/// decode_combine_kernel's merge (core/merge.hpp, the same float32 operations in the same order), then the inverse
/// rotation, then one rounding to the output dtype.
__global__ void decode_rotate_out_kernel(const DecodeParams p, const int32_t dtype, const float* signs, const float norm) {
  __shared__ float buf[kWarps][kMaxDim];
  const int64_t warp_id = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t rows = static_cast<int64_t>(p.batch) * p.num_heads * p.seqlen_q;
  if (warp_id >= rows) return;
  const int qi = static_cast<int>(warp_id % p.seqlen_q);
  const int h = static_cast<int>((warp_id / p.seqlen_q) % p.num_heads);
  const int b = static_cast<int>(warp_id / (static_cast<int64_t>(p.seqlen_q) * p.num_heads));
  const sm80::DecodeSeq sq = sm80::decode_seq(p, b);
  if (qi >= sq.seqlen_q) return;  // varlen: past this sequence's queries
  float M = -INFINITY;
  for (int s = 0; s < p.num_splits; ++s) M = core::merge_max(M, p.lse_accum[s * rows + warp_id]);
  float* x = buf[threadIdx.x / 32];
  for (int c = lane; c < p.head_dim; c += 32) x[c] = 0.f;
  float L = 0.f;
  for (int s = 0; s < p.num_splits; ++s) {
    const float w = core::merge_weight(p.lse_accum[s * rows + warp_id], M);
    L = core::merge_accumulate(L, w, 1.f);
    const float* src = p.o_accum + (s * rows + warp_id) * p.head_dim;
    for (int c = lane; c < p.head_dim; c += 32) x[c] = core::merge_accumulate(x[c], w, src[c]);
  }
  const core::MaskRule rule = sm80::decode_rule(p, sq);
  const bool has_keys = rule.row_last(qi) > rule.row_first(qi);
  float inv = core::merged_inv_sum(L, has_keys);
  if (sq.broken) inv = NAN;
  for (int c = lane; c < p.head_dim; c += 32) x[c] *= inv;
  __syncwarp();
  rotate_warp(x, p.head_dim, signs, norm, true);
  const int64_t o = b * p.out_batch + (sq.q_row0 + qi) * p.out_row + h * p.out_head;
  for (int c = lane; c < p.head_dim; c += 32) store_as(p.out, dtype, o + c, x[c]);
}

unsigned blocks_for(int64_t rows) { return static_cast<unsigned>((rows + kWarps - 1) / kWarps); }

}  // namespace

void rotate_rows(const RotateRowsParams& p, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(p.batch) * p.rows * p.heads;
  if (rows == 0) return;
  if (p.head_dim > kMaxDim) throw UnsupportedError("flashkv: the CUDA Hadamard rotation supports head_dim <= 256");
  rotate_rows_kernel<<<blocks_for(rows), kWarps * 32, 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "Hadamard rotation launch");
}

void decode_rotate_out(const DecodeParams& p, int32_t dtype, const float* signs, float norm, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(p.batch) * p.num_heads * p.seqlen_q;
  if (rows == 0) return;
  if (p.head_dim > kMaxDim) throw UnsupportedError("flashkv: the CUDA Hadamard rotation supports head_dim <= 256");
  decode_rotate_out_kernel<<<blocks_for(rows), kWarps * 32, 0, stream>>>(p, dtype, signs, norm);
  check_cuda(cudaGetLastError(), "decode output rotation launch");
}

}  // namespace flashkv::cuda
