// The compiled kernel instantiations of the CUDA backend, keyed by (kind, arch, head_dim, dtype), and the one
// dispatcher that picks the family for a call.
//
// Each instantiation lives in its own generated translation unit named for its key (fwd_hdim128_bf16_sm90.cu;
// src/cuda/generate_instantiations.py writes them into the build tree, together with the table that lists them), so
// the set that is compiled is chosen at configure time (FLASHKV_CUDA_HEADDIMS / FLASHKV_CUDA_DTYPES /
// FLASHKV_CUDA_ALL_INSTANTIATIONS). A request for a head_dim that is not compiled uses the next larger compiled one
// (zero padding); a request that no compiled instantiation covers is an UnsupportedError that names the missing
// combination — never a silent fallback.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "cuda/params.hpp"
#include "flashkv/attention.hpp"
#include "flashkv/types.hpp"

namespace flashkv::cuda {

enum class KernelKind : int32_t { fwd = 0, bwd = 1, decode = 2, fwd_v1 = 3 };
const char* kernel_kind_name(KernelKind k);

/// The kernel family of an instantiation: sm80 (mma.sync, runs on every sm_80+ GPU), sm90 (wgmma with cp.async,
/// sm_90a only) or sm90ws (TMA + wgmma, warp-specialized, forward only, sm_90a only).
enum class KernelArch : int32_t { sm80 = 0, sm90 = 1, sm90ws = 2 };
const char* kernel_arch_name(KernelArch a);  ///< "sm80" | "sm90" | "sm90ws"

using FwdLaunch = LaunchInfo (*)(const FwdParams&, cudaStream_t);
using BwdLaunch = LaunchInfo (*)(const BwdParams&, cudaStream_t);
using DecodeLaunch = void (*)(const DecodeParams&, cudaStream_t);

struct KernelEntry {
  KernelKind kind;
  KernelArch arch;
  int32_t head_dim;  ///< compiled (maximum) head dim of this instantiation
  DType dtype;
  void* launch;      ///< FwdLaunch (fwd, fwd_v1) / BwdLaunch / DecodeLaunch depending on kind
  int (*smem_bytes)();  ///< sm90/sm90ws: dynamic shared memory of its one configuration (the dispatcher's fit test)

  FwdLaunch fwd() const { return reinterpret_cast<FwdLaunch>(launch); }
  BwdLaunch bwd() const { return reinterpret_cast<BwdLaunch>(launch); }
};

/// The generated table (kernel_table.cu in the build tree) and its length.
extern const KernelEntry kKernelTable[];
extern const int kKernelTableSize;

/// The sm80 instantiation with the smallest compiled head dim >= head_dim for (kind, dtype); throws UnsupportedError
/// ("flashkv: CUDA <kind> kernel for head_dim <d>, dtype <t> is not compiled in this build (compiled: ...)").
const KernelEntry& find_kernel(KernelKind kind, int64_t head_dim, DType dtype);

/// What the automatic choice looks at besides (kind, head_dim, dtype).
struct CallShape {
  int64_t seqlen_k = 0;  ///< fixed-length seqlen_k; varlen: max_seqlen_k
  bool masked = false;   ///< causal or sliding window
  bool varlen = false;   ///< cu_seqlens given
  bool softcap = false;  ///< softcap > 0
};

/// The instantiation that runs a call of (kind, head_dim, dtype) on the current device for the requested family,
/// decided once per call (device properties cached per device, no locks, no environment reads after the first call):
///   auto: the compiled head dim is the smallest sm80 one >= head_dim. When the device runs sm90 kernels
///         (device_runs_sm90) and FLASHKV_CUDA_SM80_ONLY is not set: for a forward, the sm90ws kernel of exactly that
///         head dim where sm90ws_preferred(head_dim, shape...) (common/auto_family.hpp: where the H200 measured it ahead),
///         else the sm90 kernel of exactly that head dim; each only if it fits the device's shared memory. Else sm80.
///   sm80 / sm90 / sm90ws: that family's smallest compiled head dim >= head_dim, or UnsupportedError naming the family
///         and why (no such kind in the family, not compiled, not this GPU, not this build, not enough shared memory).
const KernelEntry& select_kernel(KernelKind kind, KernelFamily family, int64_t head_dim, DType dtype,
                                 const CallShape& shape = {});

/// True when the current device can run this build's sm90 kernels: compute capability 9.0 and a binary with sm_90a
/// code that the driver picks (cached per device).
bool device_runs_sm90();

/// Human-readable list of the compiled instantiations, e.g.
/// "forward head_dim 64/128 x bfloat16/float16 (sm80; sm90 64/128; sm90ws 64/128)".
std::string compiled_kernels();

}  // namespace flashkv::cuda
