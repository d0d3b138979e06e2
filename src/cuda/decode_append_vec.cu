// The vector 16-bit append (decode_append.hpp, append_kv_vec): one thread per 16-byte chunk (8 channels) of K and of V,
// the token row's page lookup once per chunk pair, for the shapes that allow 16-byte loads (head_dim a multiple of 8,
// element strides and pointers aligned); decode_append.cu keeps the general kernel for everything else, with the same
// result bit for bit. The quantizing vector kernel is decode_append_quant_vec.cu.
// Value check (p.bad != nullptr): the smallest flat (b, i, h, c) index of a non-finite value by atomicMin; the row is
// still copied (as the general kernel does).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

}  // namespace flashkv::cuda
