// Storage (storage.hpp): host memory with new[], device memory through core::DecodeBackend's hooks.
#include "kvcache/cache/storage.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>

#include "core/backend.hpp"
#include "flashkv/error.hpp"

namespace flashkv::kv {
namespace {
constexpr int kHostToDevice = 0, kDeviceToHost = 1, kDeviceToDevice = 2;

uint8_t* allocate(Device device, int32_t index, int64_t bytes) {
  const size_t n = static_cast<size_t>(std::max<int64_t>(bytes, 1));
  if (device == Device::cpu) return new (std::nothrow) uint8_t[n];
  return static_cast<uint8_t*>(core::require_decode_backend(device).alloc(n, index));
}
void deallocate(Device device, int32_t index, uint8_t* p) {
  if (p == nullptr) return;
  if (device == Device::cpu) {
    delete[] p;
  } else if (const core::DecodeBackend* be = core::decode_backend(device)) {
    be->free(p, index);
  }
}
}  // namespace

Storage::Storage(Device device, int32_t device_index, int64_t bytes, uint8_t fill_value)
    : bytes_(bytes), device_(device), device_index_(device_index) {
  data_ = allocate(device, device_index, bytes);
  if (data_ == nullptr) {
    throw CapacityError("flashkv: cannot allocate " + std::to_string(bytes) + " bytes of KV cache memory on " +
                        device_name(device));
  }
  fill(0, bytes, fill_value);
}

Storage::~Storage() { release(); }

Storage::Storage(Storage&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), device_(o.device_),
      device_index_(o.device_index_) {}

Storage& Storage::operator=(Storage&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    device_ = o.device_;
    device_index_ = o.device_index_;
  }
  return *this;
}

void Storage::release() {
  deallocate(device_, device_index_, data_);
  data_ = nullptr;
  bytes_ = 0;
}

void Storage::fill(int64_t off, int64_t n, uint8_t value) {
  if (n <= 0) return;
  if (on_host()) {
    std::memset(data_ + off, value, static_cast<size_t>(n));
  } else {
    core::require_decode_backend(device_).fill(data_ + off, value, static_cast<size_t>(n), device_index_);
  }
}

void Storage::write(int64_t off, const void* src, int64_t n) {
  if (n <= 0) return;
  if (on_host()) {
    std::memcpy(data_ + off, src, static_cast<size_t>(n));
  } else {
    core::require_decode_backend(device_).copy(data_ + off, src, static_cast<size_t>(n), kHostToDevice, device_index_);
  }
}

void Storage::read(int64_t off, void* dst, int64_t n) const {
  if (n <= 0) return;
  if (on_host()) {
    std::memcpy(dst, data_ + off, static_cast<size_t>(n));
  } else {
    core::require_decode_backend(device_).copy(dst, data_ + off, static_cast<size_t>(n), kDeviceToHost, device_index_);
  }
}

void Storage::copy_from(const Storage& src, int64_t src_off, int64_t off, int64_t n) {
  if (n <= 0) return;
  if (on_host() && src.on_host()) {
    std::memmove(data_ + off, src.data_ + src_off, static_cast<size_t>(n));
  } else if (on_host()) {
    src.read(src_off, data_ + off, n);
  } else if (src.on_host()) {
    write(off, src.data_ + src_off, n);
  } else if (device_index_ == src.device_index_) {
    core::require_decode_backend(device_).copy(data_ + off, src.data_ + src_off, static_cast<size_t>(n),
                                               kDeviceToDevice, device_index_);
  } else {  // two devices: through the host
    std::unique_ptr<uint8_t[]> tmp(new uint8_t[static_cast<size_t>(n)]);
    src.read(src_off, tmp.get(), n);
    write(off, tmp.get(), n);
  }
}

void Storage::grow(int64_t new_bytes, uint8_t fill_value) {
  if (new_bytes <= bytes_) return;
  Storage bigger(device_, device_index_, new_bytes, fill_value);  // throws CapacityError, leaving *this unchanged
  bigger.copy_from(*this, 0, 0, bytes_);
  *this = std::move(bigger);
}

}  // namespace flashkv::kv
