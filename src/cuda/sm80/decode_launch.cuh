// Host launchers of the split-KV decode kernel and its combine kernel (decode_kernel.cuh), one per KV source
// (decode_kv_source.cuh): run_decode for 16-bit pages of the query dtype, run_decode_quant for packed pages of one
// (KVCode, KVScaling) pair per half. Instantiated by the generated decode_*.cu / decode_quant_*.cu files
// (src/cuda/generate_instantiations.py).
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/check.hpp"
#include "cuda/sm80/decode_kernel.cuh"

namespace flashkv::cuda {

template <int kHeadDim, class T, class Src>
void launch_decode(const DecodeParams& p, cudaStream_t stream) {
  using Cfg = sm80::DecodeConfig<kHeadDim, Src>;
  void (*kernel)(const DecodeParams);
  if constexpr (Src::kMinCtasPerSm > 1) {
    kernel = sm80::decode_kernel_capped<Cfg, T>;
  } else {
    kernel = sm80::decode_kernel<Cfg, T>;
  }
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes),
             "cudaFuncSetAttribute(decode)");
  if (p.query_ctas_per_sm != nullptr) {  // plan time: occupancy of this instantiation, no launch
    int n = 0;
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, Cfg::kThreads, Cfg::kSmemBytes),
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor(decode)");
    *p.query_ctas_per_sm = n;
    return;
  }
  const int row_tiles = (p.rows_per_kv_head + 15) / 16;
  const dim3 grid(p.num_splits, p.num_heads_kv * row_tiles, p.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  check_cuda(cudaGetLastError(), "decode kernel launch");
  if (p.num_splits > 1) {
    const int64_t threads = static_cast<int64_t>(p.batch) * p.num_heads * p.seqlen_q * 32;
    sm80::decode_combine_kernel<kHeadDim, T><<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(p);
    check_cuda(cudaGetLastError(), "decode combine launch");
  }
}

template <int kHeadDim, class T>
void run_decode(const DecodeParams& p, cudaStream_t stream) {
  launch_decode<kHeadDim, T, sm80::Kv16Source<T, kHeadDim>>(p, stream);
}

/// Packed pages: K codes KC scaled by KS, V codes VC scaled by VS (DecodeParams strides in bytes, metadata, formats).
template <int kHeadDim, class T, kv::KVCode KC, kv::KVScaling KS, kv::KVCode VC, kv::KVScaling VS>
void run_decode_quant(const DecodeParams& p, cudaStream_t stream) {
  launch_decode<kHeadDim, T, sm80::KvQuantSource<T, kHeadDim, KC, KS, VC, VS>>(p, stream);
}

}  // namespace flashkv::cuda
