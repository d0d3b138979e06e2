// Host launchers of the split-KV decode kernel (decode_kernel.cuh) and its combine kernel (common/decode_combine.cuh), one per KV source
// (decode_kv_source.cuh): run_decode for 16-bit pages of the query dtype, run_decode_quant for packed pages of one
// (KVCode, KVScaling) pair per half. Instantiated by the generated decode_*.cu / decode_quant_*.cu files
// (src/cuda/generate_instantiations.py).
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/check.hpp"
#include "cuda/common/decode_combine.cuh"
#include "cuda/decode_kernel_choice.hpp"
#include "cuda/sm80/decode_kernel.cuh"
#include "cuda/util.hpp"

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
  DecodeParams d = p;
  // the fused combine needs its weights in the kernel's shared memory (after the Q tile); else the combine kernel
  static_assert(Cfg::kCombineBytes == 4 * 16 * (kHeadDim + 2) * 4, "fused_combine_fits' scratch size");
  if (d.num_splits <= 1 || !fused_combine_fits(d.num_splits, kHeadDim)) d.split_counters = nullptr;
  const bool combine_kernel = d.num_splits > 1 && d.split_counters == nullptr;
  // PDL only where the combine kernel's image has griddepcontrol.wait (sm_90 code, not sm_80 PTX JIT-compiled)
  static const bool combine_has_wait = [] {
    cudaFuncAttributes a = {};
    return cudaFuncGetAttributes(&a, decode_combine_kernel<kHeadDim, T>) == cudaSuccess && a.binaryVersion >= 90;
  }();
  d.combine_pdl = combine_kernel && combine_has_wait && dependent_launch_ok(stream);
  const int row_tiles = (d.rows_per_kv_head + 15) / 16;
  const dim3 grid(d.num_splits, d.num_heads_kv * row_tiles, d.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(d);
  check_cuda(cudaGetLastError(), "decode kernel launch");
  if (combine_kernel) {
    const int64_t threads = static_cast<int64_t>(d.batch) * d.num_heads * d.seqlen_q * 32;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>((threads + 255) / 256));
    cfg.blockDim = dim3(256);
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = d.combine_pdl ? 1 : 0;
    check_cuda(cudaLaunchKernelEx(&cfg, decode_combine_kernel<kHeadDim, T>, d), "decode combine launch");
  }
}

template <int kHeadDim, class T>
void run_decode(const DecodeParams& p, cudaStream_t stream) {
  launch_decode<kHeadDim, T, sm80::Kv16Source<T, kHeadDim>>(p, stream);
}

/// Packed pages: K codes KC scaled by KS, V codes VC scaled by VS (DecodeParams strides in bytes, metadata, formats).
/// Where the fragments are register-direct and keys_m_kernel(p) (decode_kernel_choice.hpp: the keys-as-M loop on, every CTA
/// with at most 8 query rows — a decode step with GQA <= 8 —, whole-head affine groups), the keys-as-M kernel (its own
/// occupancy, KvQuantSource's kKeysMOnly); else the kernel with both loops.
template <int kHeadDim, class T, kv::KVCode KC, kv::KVScaling KS, kv::KVCode VC, kv::KVScaling VS>
void run_decode_quant(const DecodeParams& p, cudaStream_t stream) {
  using Src = sm80::KvQuantSource<T, kHeadDim, KC, KS, VC, VS>;
  if constexpr (Src::kRegDirect) {
    if (keys_m_kernel(p)) {
      launch_decode<kHeadDim, T, sm80::KvQuantSource<T, kHeadDim, KC, KS, VC, VS, true>>(p, stream);
      return;
    }
  }
  launch_decode<kHeadDim, T, Src>(p, stream);
}

}  // namespace flashkv::cuda
