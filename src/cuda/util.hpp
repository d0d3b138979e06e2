// Layout helpers of the CUDA backend: copies between a caller's strided tensor and a contiguous, head_dim-padded
// workspace (used when head_dim is not a multiple of 8 or a stride/pointer is not 16-byte aligned, so that the
// kernels can use 16-byte cp.async loads), and a device guard.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/params.hpp"

namespace flashkv::cuda {

/// dst[b, r, h, c] (contiguous, dim_pad columns) = src[b, r, h, c] for c < dim, 0 for dim <= c < dim_pad.
/// elem_bytes-byte elements (2: 16-bit, 1: FP8). For packed varlen tensors pass batch = 1 and rows = total rows.
void pad_copy(const void* src, const TensorStrides& src_s, void* dst, int64_t batch, int64_t rows, int64_t heads,
              int64_t dim, int64_t dim_pad, cudaStream_t stream, int elem_bytes = 2);
/// dst[b, r, h, c] (strided) = src[b, r, h, c] (contiguous, dim_pad columns) for c < dim.
void unpad_copy(const void* src, void* dst, const TensorStrides& dst_s, int64_t batch, int64_t rows, int64_t heads,
                int64_t dim, int64_t dim_pad, cudaStream_t stream);

/// Makes `device` current for the guard's lifetime.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool changed_ = false;
};

/// Stream-ordered device allocation released when the owner goes out of scope (cudaMallocAsync/cudaFreeAsync).
class DeviceBuffer {
 public:
  DeviceBuffer(size_t bytes, cudaStream_t stream);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  template <class U>
  U* as() const { return static_cast<U*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
};

/// Number of SMs of the current device (cached per device).
int num_sms();

/// The forward non-finite fix-up's trigger for one call on `stream` (kernel/fwd_kernel.cuh): the current device's
/// persistent 64-bit slot (allocated and zeroed on the first call, never freed) and a generation larger than every one
/// handed out before (process-wide). A kernel raises the slot to the generation with atomicMax, so that concurrent
/// calls on other streams can only make a fix-up scan rows it did not need to (it recomputes only non-finite rows),
/// never skip one. {nullptr, 0} while `stream` is being captured into a CUDA graph (a replay would repeat the
/// generation): the caller then uses a stream-ordered zeroed flag inside the graph, as before.
struct NonfiniteEpoch {
  unsigned long long* slot = nullptr;
  unsigned long long gen = 0;
};
NonfiniteEpoch nonfinite_epoch(cudaStream_t stream);

/// True when the current device supports programmatic dependent launch (compute capability >= 9.0) and `stream` is not
/// being captured: the fix-up kernels are then launched with cudaLaunchAttributeProgrammaticStreamSerialization, so
/// that their launch overlaps the preceding kernel's tail (they wait with griddepcontrol.wait before reading anything).
bool dependent_launch_ok(cudaStream_t stream);

/// Largest dynamic shared memory one block may opt in to on the current device, in bytes (cached per device):
/// 232448 on H100/H200, 166912 on A100, 101376 on sm_86/sm_89 (RTX 30xx/40xx, A10, L4, L40). The environment
/// variable FLASHKV_CUDA_SMEM_LIMIT (bytes) lowers it (tests of the small-GPU tile configurations on a large GPU).
int max_smem_per_block();

/// Throws UnsupportedError when a kernel needs more dynamic shared memory (bytes) than the current device allows —
/// naming the kernel, both sizes and the device — instead of a launch failure.
void require_smem(int bytes, const char* kernel, int head_dim);

/// True when this build carries the sm90 kernels' sm_90a code (CMake defines FLASHKV_CUDA_SM90A only when the
/// architecture list names 90a and no plain sm_90 image the driver could pick instead: a plain sm_90 image would run
/// the sm90 kernels' trap-only bodies).
bool sm90_kernels_compiled();

/// True when the driver runs this build's sm_90a image on the current device (a probe kernel's binaryVersion is 90;
/// cached per device). False in builds without sm_90a code.
bool sm90_binary_selected();

}  // namespace flashkv::cuda
