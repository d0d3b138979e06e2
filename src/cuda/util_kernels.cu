// Layout helper kernels (see util.hpp).
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "cuda/check.hpp"
#include "cuda/util.hpp"

namespace flashkv::cuda {
namespace {

template <class E>
__global__ void pad_copy_kernel(const E* __restrict__ src, TensorStrides s, E* __restrict__ dst, int64_t rows,
                                int64_t heads, int64_t dim, int64_t dim_pad, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % dim_pad;
    const int64_t h = (i / dim_pad) % heads;
    const int64_t r = (i / (dim_pad * heads)) % rows;
    const int64_t b = i / (dim_pad * heads * rows);
    dst[i] = c < dim ? src[b * s.batch + r * s.row + h * s.head + c] : E(0);
  }
}

__global__ void unpad_copy_kernel(const uint16_t* __restrict__ src, uint16_t* __restrict__ dst, TensorStrides s,
                                  int64_t rows, int64_t heads, int64_t dim, int64_t dim_pad, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % dim;
    const int64_t h = (i / dim) % heads;
    const int64_t r = (i / (dim * heads)) % rows;
    const int64_t b = i / (dim * heads * rows);
    dst[b * s.batch + r * s.row + h * s.head + c] = src[((b * rows + r) * heads + h) * dim_pad + c];
  }
}

int grid_for(int64_t total) {
  const int64_t blocks = (total + 255) / 256;
  return static_cast<int>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

}  // namespace

void pad_copy(const void* src, const TensorStrides& src_s, void* dst, int64_t batch, int64_t rows, int64_t heads,
              int64_t dim, int64_t dim_pad, cudaStream_t stream, int elem_bytes) {
  const int64_t total = batch * rows * heads * dim_pad;
  if (total == 0) return;
  if (elem_bytes == 1) {
    pad_copy_kernel<<<grid_for(total), 256, 0, stream>>>(static_cast<const uint8_t*>(src), src_s,
                                                         static_cast<uint8_t*>(dst), rows, heads, dim, dim_pad, total);
  } else {
    pad_copy_kernel<<<grid_for(total), 256, 0, stream>>>(static_cast<const uint16_t*>(src), src_s,
                                                         static_cast<uint16_t*>(dst), rows, heads, dim, dim_pad,
                                                         total);
  }
  check_cuda(cudaGetLastError(), "pad_copy launch");
}

void unpad_copy(const void* src, void* dst, const TensorStrides& dst_s, int64_t batch, int64_t rows, int64_t heads,
                int64_t dim, int64_t dim_pad, cudaStream_t stream) {
  const int64_t total = batch * rows * heads * dim;
  if (total == 0) return;
  unpad_copy_kernel<<<grid_for(total), 256, 0, stream>>>(static_cast<const uint16_t*>(src),
                                                         static_cast<uint16_t*>(dst), dst_s, rows, heads, dim,
                                                         dim_pad, total);
  check_cuda(cudaGetLastError(), "unpad_copy launch");
}

DeviceGuard::DeviceGuard(int device) {
  check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ != device) {
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    changed_ = true;
  }
}
DeviceGuard::~DeviceGuard() {
  if (changed_) cudaSetDevice(previous_);
}

DeviceBuffer::DeviceBuffer(size_t bytes, cudaStream_t stream) : stream_(stream) {
  if (bytes > 0) check_cuda(cudaMallocAsync(&ptr_, bytes, stream), "cudaMallocAsync(workspace)");
}
DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cudaFreeAsync(ptr_, stream_);
}

int num_sms() {
  static int cached[64] = {};
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev < 64 && cached[dev] > 0) return cached[dev];
  int n = 0;
  check_cuda(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute(SMs)");
  if (dev < 64) cached[dev] = n;
  return n;
}

namespace {
bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}
}  // namespace

NonfiniteEpoch nonfinite_epoch(cudaStream_t stream) {
  static std::mutex mutex;  // taken only to create a device's slot (once), never on the per-call path
  static std::atomic<unsigned long long*> slots[64] = {};
  static std::atomic<unsigned long long> next{1};
  if (capturing(stream)) return {};
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev >= 64) return {};
  unsigned long long* slot = slots[dev].load(std::memory_order_acquire);
  if (slot == nullptr) {
    std::lock_guard<std::mutex> lock(mutex);
    slot = slots[dev].load(std::memory_order_relaxed);
    if (slot == nullptr) {
      void* ptr = nullptr;
      check_cuda(cudaMalloc(&ptr, sizeof(unsigned long long)), "cudaMalloc(non-finite epoch)");
      check_cuda(cudaMemset(ptr, 0, sizeof(unsigned long long)), "cudaMemset(non-finite epoch)");
      slot = static_cast<unsigned long long*>(ptr);
      slots[dev].store(slot, std::memory_order_release);
    }
  }
  return {slot, next.fetch_add(1, std::memory_order_relaxed)};
}

bool dependent_launch_ok(cudaStream_t stream) {
  static int major[64] = {};
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev >= 64) return false;
  if (major[dev] == 0) {
    check_cuda(cudaDeviceGetAttribute(&major[dev], cudaDevAttrComputeCapabilityMajor, dev),
               "cudaDeviceGetAttribute(compute capability)");
  }
  return major[dev] >= 9 && !capturing(stream);
}

int max_smem_per_block() {
  static int cached[64] = {};
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  int n = dev < 64 ? cached[dev] : 0;
  if (n == 0) {
    check_cuda(cudaDeviceGetAttribute(&n, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
               "cudaDeviceGetAttribute(shared memory per block, opt-in)");
    if (dev < 64) cached[dev] = n;
  }
  // FLASHKV_CUDA_SMEM_LIMIT (bytes) lowers the figure, so that a large GPU runs (and tests) the tile configurations
  // chosen for smaller ones; read on every call so that a test can set and unset it.
  if (const char* env = std::getenv("FLASHKV_CUDA_SMEM_LIMIT")) {
    const long limit = std::strtol(env, nullptr, 10);
    if (limit > 0 && limit < n) n = static_cast<int>(limit);
  }
  return n;
}

void require_smem(int bytes, const char* kernel, int head_dim) {
  const int have = max_smem_per_block();
  if (bytes <= have) return;
  int dev = 0, major = 0, minor = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute(cc)");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), "cudaDeviceGetAttribute(cc)");
  throw UnsupportedError("flashkv: the CUDA " + std::string(kernel) + " kernel for head_dim " +
                         std::to_string(head_dim) + " needs " + std::to_string(bytes) +
                         " bytes of shared memory per block; this GPU (sm_" + std::to_string(major) +
                         std::to_string(minor) + ") allows " + std::to_string(have));
}

namespace {
__global__ void sm90_dispatch_probe_kernel() {}
}  // namespace

bool sm90_binary_selected() {
#if defined(FLASHKV_CUDA_SM90A)
  static std::atomic<int> cached[64] = {};  // 0 unknown, 1 yes, 2 no
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  int c = dev < 64 ? cached[dev].load(std::memory_order_relaxed) : 0;
  if (c == 0) {
    cudaFuncAttributes attr{};
    check_cuda(cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(sm90_dispatch_probe_kernel)),
               "cudaFuncGetAttributes");
    c = attr.binaryVersion == 90 ? 1 : 2;
    if (dev < 64) cached[dev].store(c, std::memory_order_relaxed);
  }
  return c == 1;
#else
  return false;
#endif
}

bool sm90_kernels_compiled() {
#if defined(FLASHKV_CUDA_SM90A)
  return true;
#else
  return false;
#endif
}

}  // namespace flashkv::cuda
