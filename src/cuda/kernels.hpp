// The compiled kernel instantiations of the CUDA backend and how to find one.
//
// Each (kind, head_dim, dtype) instantiation lives in its own generated translation unit
// (src/cuda/generate_instantiations.py writes them into the build tree, together with the table that lists them), so
// the set that is compiled is chosen at configure time (FLASHKV_CUDA_HEADDIMS / FLASHKV_CUDA_DTYPES /
// FLASHKV_CUDA_ALL_INSTANTIATIONS). A request for a head_dim that is not compiled uses the next larger compiled one
// (zero padding); a request that no compiled instantiation covers is an UnsupportedError that names the missing
// combination — never a silent fallback.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "cuda/params.hpp"
#include "flashkv/types.hpp"

namespace flashkv::cuda {

enum class KernelKind : int32_t { fwd = 0, bwd = 1, decode = 2, fwd_v1 = 3 };
const char* kernel_kind_name(KernelKind k);

using FwdLaunch = void (*)(const FwdParams&, cudaStream_t);
using BwdLaunch = void (*)(const BwdParams&, cudaStream_t);
using DecodeLaunch = void (*)(const DecodeParams&, cudaStream_t);

struct KernelEntry {
  KernelKind kind;
  int32_t head_dim;  ///< compiled (maximum) head dim of this instantiation
  DType dtype;
  void* launch;      ///< FwdLaunch / BwdLaunch / DecodeLaunch depending on kind
};

/// The generated table (kernel_table.cu in the build tree) and its length.
extern const KernelEntry kKernelTable[];
extern const int kKernelTableSize;

/// The instantiation with the smallest compiled head dim >= head_dim for (kind, dtype); throws UnsupportedError
/// ("flashkv: CUDA <kind> kernel for head_dim <d>, dtype <t> is not compiled in this build (compiled: ...)").
const KernelEntry& find_kernel(KernelKind kind, int64_t head_dim, DType dtype);

/// Human-readable list of the compiled instantiations, e.g. "fwd: 64/128 x bfloat16/float16; ...".
std::string compiled_kernels();

}  // namespace flashkv::cuda
