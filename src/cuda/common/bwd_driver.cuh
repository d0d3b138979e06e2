// The backward driver shared by both kernel families (FA2 Alg. 2, Dao 2023 §3.1.2): preprocess (D = rowsum(dout o
// out), lse * log2(e), zero dq_accum), the family's main K/V-block-parallel kernel (kernel/bwd_kernel.cuh with
// sm80/mainloop_bwd.cuh or sm90/mainloop_bwd.cuh), dq conversion (dq = dq_accum * softmax_scale -> dtype), for GQA
// the fixed-order sum of the per-query-head dk/dv over each group, and the non-finite fix-up
// (common/nonfinite_fixup.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "cuda/check.hpp"
#include "cuda/util.hpp"
#include "cuda/common/nonfinite_fixup.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/params.hpp"

namespace flashkv::cuda {

namespace attn {

/// Lanes that share one (row, head) in the preprocess: 8 columns (16 bytes) per lane and pass.
__host__ __device__ inline int preprocess_lanes(int head_dim) { return head_dim <= 64 ? 8 : (head_dim <= 128 ? 16 : 32); }

/// preprocess_lanes(head_dim) lanes per (packed query row, head), 16-byte loads (the launcher guarantees 16-byte
/// aligned rows and head_dim % 8 == 0): D = rowsum(dout o out), lse * log2(e), dq_accum row = 0.
template <class T>
__global__ void bwd_preprocess_kernel(const BwdParams p) {
  const int lanes = preprocess_lanes(p.head_dim);
  const int64_t gid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (gid == 0 && p.nonfinite_flag != nullptr) *p.nonfinite_flag = 0;  // before the main kernel can set it
  const int64_t item = gid / lanes;  // (packed row, head)
  const int li = static_cast<int>(gid % lanes);
  const bool valid = item < p.total_q * p.num_heads;
  const int64_t r = valid ? item / p.num_heads : 0;  // packed row
  const int h = valid ? static_cast<int>(item % p.num_heads) : 0;
  int64_t b, i;  // batch and row within the sequence (varlen: batch stride 0, row index = packed row)
  if (p.cu_seqlens_q != nullptr) {
    b = 0;
    i = r;
  } else {
    b = r / p.seqlen_q;
    i = r % p.seqlen_q;
  }
  float acc = 0.f;
  if (valid) {
    const T* o = static_cast<const T*>(p.out) + b * p.out_s.batch + i * p.out_s.row + h * p.out_s.head;
    const T* d = static_cast<const T*>(p.dout) + b * p.dout_s.batch + i * p.dout_s.row + h * p.dout_s.head;
    for (int c = li * 8; c < p.head_dim; c += 8 * lanes) {
      const uint4 ov = __ldg(reinterpret_cast<const uint4*>(o + c));
      const uint4 dv = __ldg(reinterpret_cast<const uint4*>(d + c));
      const uint32_t ow[4] = {ov.x, ov.y, ov.z, ov.w}, dw[4] = {dv.x, dv.y, dv.z, dv.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const float2 a = unpack2<T>(ow[w]), e = unpack2<T>(dw[w]);
        acc += a.x * e.x + a.y * e.y;
      }
    }
  }
  for (int off = lanes / 2; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (!valid) return;
  float* dqa = p.dq_accum + item * static_cast<int64_t>(p.head_dim_rounded);  // item = r * num_heads + h
  for (int c = li * 4; c < p.head_dim_rounded; c += 4 * lanes) {
    *reinterpret_cast<float4*>(dqa + c) = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  if (li == 0) {
    // lse is [batch, heads, seqlen_q] (fixed) or [heads, total_q] (varlen, batch stride 0 and i = packed row).
    const float lse = p.lse[b * p.lse_batch + h * p.lse_head + i * p.lse_row];
    p.dsum[static_cast<int64_t>(h) * p.total_q + r] = acc;
    p.lse_log2[static_cast<int64_t>(h) * p.total_q + r] = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
  }
}

/// dq = dq_accum * softmax_scale in the output dtype; 8 columns (two float4 loads, one 16-byte store) per thread.
template <class T>
__global__ void bwd_convert_dq_kernel(const BwdParams p) {
  const int64_t idx = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x);
  const int chunks = p.head_dim / 8;
  if (idx >= p.total_q * p.num_heads * chunks) return;
  const int c = static_cast<int>(idx % chunks) * 8;
  const int64_t rh = idx / chunks;
  const int64_t r = rh / p.num_heads;
  const int h = static_cast<int>(rh % p.num_heads);
  int64_t b = 0, i = r;
  if (p.cu_seqlens_q == nullptr) b = r / p.seqlen_q, i = r % p.seqlen_q;
  const float4* src = reinterpret_cast<const float4*>(p.dq_accum + rh * p.head_dim_rounded + c);
  const float4 v0 = src[0], v1 = src[1];
  const float sc = p.softmax_scale;
  // A non-finite dq (a leak of a boundary tile's 0 x inf, or a legitimate one) triggers the fix-up kernel.
  const bool bad = not_finite(v0.x) || not_finite(v0.y) || not_finite(v0.z) || not_finite(v0.w) ||
                   not_finite(v1.x) || not_finite(v1.y) || not_finite(v1.z) || not_finite(v1.w);
  if (bad && p.nonfinite_flag != nullptr) *p.nonfinite_flag = 1;
  uint4 out;
  out.x = pack2<T>(v0.x * sc, v0.y * sc);
  out.y = pack2<T>(v0.z * sc, v0.w * sc);
  out.z = pack2<T>(v1.x * sc, v1.y * sc);
  out.w = pack2<T>(v1.z * sc, v1.w * sc);
  T* dst = static_cast<T*>(p.dq) + b * p.dq_s.batch + i * p.dq_s.row + h * p.dq_s.head + c;
  *reinterpret_cast<uint4*>(dst) = out;
}

/// GQA: dk[r, hk] = sum over the group's query heads (fixed order) of dk_accum[r, h]; same for dv.
template <class T>
__global__ void bwd_reduce_kv_kernel(const BwdParams p) {
  const int64_t idx = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x);
  const int half_d = p.head_dim / 2;
  if (idx >= p.total_k * p.num_heads_kv * half_d) return;
  const int group = p.num_heads / p.num_heads_kv;
  const int c = static_cast<int>(idx % half_d) * 2;
  const int64_t rh = idx / half_d;
  const int64_t r = rh / p.num_heads_kv;
  const int hk = static_cast<int>(rh % p.num_heads_kv);
  int64_t b = 0, j = r;
  if (p.cu_seqlens_k == nullptr) b = r / p.seqlen_k, j = r % p.seqlen_k;
  float2 sk = make_float2(0.f, 0.f), sv = make_float2(0.f, 0.f);
  for (int gi = 0; gi < group; ++gi) {
    const int64_t off = (r * p.num_heads + hk * group + gi) * p.head_dim_rounded + c;
    const float2 a = *reinterpret_cast<const float2*>(p.dk_accum + off);
    const float2 v = *reinterpret_cast<const float2*>(p.dv_accum + off);
    sk.x += a.x, sk.y += a.y, sv.x += v.x, sv.y += v.y;
  }
  T* dk = static_cast<T*>(p.dk) + b * p.dk_s.batch + j * p.dk_s.row + hk * p.dk_s.head + c;
  T* dv = static_cast<T*>(p.dv) + b * p.dv_s.batch + j * p.dv_s.row + hk * p.dv_s.head + c;
  *reinterpret_cast<uint32_t*>(dk) = pack2<T>(sk.x, sk.y);
  *reinterpret_cast<uint32_t*>(dv) = pack2<T>(sv.x, sv.y);
}

}  // namespace attn

/// Preprocess, main kernel (`plain`, or `softcap` when p.softcap != 0) of configuration Cfg (kSmemBytes, kThreads,
/// kBlockN, kHeadDim), dq conversion, (GQA) dk/dv reduction and the non-finite fix-up (common/nonfinite_fixup.cuh:
/// returns at once unless an output holds a non-finite value). Shared by the sm80 and sm90 main kernels.
template <class Cfg, class T>
void run_bwd_with(const BwdParams& params, cudaStream_t stream, void (*plain)(BwdParams), void (*softcap)(BwdParams)) {
  require_smem(Cfg::kSmemBytes, "backward", Cfg::kHeadDim);  // before anything is launched
  // The fix-up's flag: zeroed by the preprocess, set by the dk/dv epilogue and the dq conversion. The caller may pass
  // one (attention_cuda.cpp: behind dsum's last element), else a stream-ordered allocation freed after the fix-up has
  // run. Without query rows there is nothing to fix (every gradient is 0).
  DeviceBuffer flag(params.total_q > 0 && params.nonfinite_flag == nullptr ? sizeof(int32_t) : 0, stream);
  BwdParams p = params;
  if (p.nonfinite_flag == nullptr) p.nonfinite_flag = flag.as<int32_t>();
  if (p.total_q > 0) {
    const int64_t threads = p.total_q * p.num_heads * attn::preprocess_lanes(p.head_dim);
    attn::bwd_preprocess_kernel<T><<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(p);
    check_cuda(cudaGetLastError(), "bwd preprocess launch");
  }
  if (p.deterministic) {
    check_cuda(cudaMemsetAsync(p.dq_semaphore, 0,
                               static_cast<size_t>(p.batch) * p.num_heads * p.num_m_blocks * sizeof(int32_t), stream),
               "cudaMemsetAsync(dq semaphore)");
  }
  auto kernel = p.softcap ? softcap : plain;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes),
             "cudaFuncSetAttribute(bwd)");
  const dim3 grid((p.seqlen_k + Cfg::kBlockN - 1) / Cfg::kBlockN, p.num_heads, p.batch);
  if (grid.x > 0) {
    kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
    check_cuda(cudaGetLastError(), "bwd kernel launch");
  }
  const int64_t nq = p.total_q * p.num_heads * (p.head_dim / 8);
  if (nq > 0) {
    attn::bwd_convert_dq_kernel<T><<<static_cast<unsigned>((nq + 255) / 256), 256, 0, stream>>>(p);
    check_cuda(cudaGetLastError(), "bwd dq conversion launch");
  }
  if (p.num_heads != p.num_heads_kv) {
    const int64_t nk = p.total_k * p.num_heads_kv * (p.head_dim / 2);
    if (nk > 0) {
      attn::bwd_reduce_kv_kernel<T><<<static_cast<unsigned>((nk + 255) / 256), 256, 0, stream>>>(p);
      check_cuda(cudaGetLastError(), "bwd dk/dv reduction launch");
    }
  }
  if (p.total_q > 0) {
    attn::bwd_nonfinite_fixup_kernel<T, Cfg::kHeadDim>
        <<<attn::fixup_blocks(p.total_q * p.num_heads + p.total_k * p.num_heads_kv), attn::kFixupThreads, 0, stream>>>(
            p);
    check_cuda(cudaGetLastError(), "bwd non-finite fix-up launch");
  }
}

}  // namespace flashkv::cuda
