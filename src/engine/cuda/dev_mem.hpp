// Owned memory of the CUDA engine: DevMem (cudaMalloc / cudaFree, a fixed address for its life: what a captured CUDA
// graph may point at) and PinnedMem (page-locked host memory, cudaMallocHost / cudaFreeHost: truly asynchronous
// copies, and copies a graph may capture).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>

#include "flashkv/error.hpp"

namespace flashkv::engine_cuda {

/// `bytes` of memory from Kind::alloc, released by Kind::release; CapacityError naming Kind::what when it fails.
template <class Kind>
class OwnedMem {
 public:
  OwnedMem() = default;
  explicit OwnedMem(size_t bytes) : bytes_(bytes) {
    if (bytes > 0 && Kind::alloc(&p_, bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      p_ = nullptr;
      throw CapacityError("flashkv: CUDA engine: cannot allocate " + std::to_string(bytes) + " bytes of " + Kind::what);
    }
  }
  ~OwnedMem() {
    if (p_ != nullptr) Kind::release(p_);
  }
  OwnedMem(OwnedMem&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  OwnedMem& operator=(OwnedMem&& o) noexcept {
    std::swap(p_, o.p_), std::swap(bytes_, o.bytes_);
    return *this;
  }
  template <class T>
  T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

struct DeviceKind {
  static cudaError_t alloc(void** p, size_t n) { return cudaMalloc(p, n); }
  static void release(void* p) { cudaFree(p); }
  static constexpr const char* what = "device memory";
};
struct PinnedKind {
  static cudaError_t alloc(void** p, size_t n) { return cudaMallocHost(p, n); }
  static void release(void* p) { cudaFreeHost(p); }
  static constexpr const char* what = "page-locked host memory";
};

using DevMem = OwnedMem<DeviceKind>;
using PinnedMem = OwnedMem<PinnedKind>;

}  // namespace flashkv::engine_cuda
