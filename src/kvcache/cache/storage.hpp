// Storage: one byte buffer of a PagedKVCache (codes pool, metadata pool, a sequence's window buffer) in host memory
// or in device memory through the registered decode backend's memory hooks (core::DecodeBackend). The same bytes, the
// same layout (kvcache/page_layout.hpp), either side; copies go between any two storages.
#pragma once

#include <cstdint>

#include "flashkv/types.hpp"

namespace flashkv::kv {

class Storage {
 public:
  Storage() = default;
  /// `bytes` bytes on `device` filled with `fill`. CapacityError when the memory cannot be allocated;
  /// UnsupportedError for a device without a decode backend.
  Storage(Device device, int32_t device_index, int64_t bytes, uint8_t fill);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  Storage(Storage&& o) noexcept;
  Storage& operator=(Storage&& o) noexcept;

  uint8_t* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  int32_t device_index() const { return device_index_; }
  bool on_host() const { return device_ == Device::cpu; }

  /// Bytes [off, off + n) set to `value`.
  void fill(int64_t off, int64_t n, uint8_t value);
  /// Copies n bytes from host memory `src` to [off, off + n).
  void write(int64_t off, const void* src, int64_t n);
  /// Copies [off, off + n) to host memory `dst`.
  void read(int64_t off, void* dst, int64_t n) const;
  /// Copies n bytes from `src` at src_off to this at off (any devices).
  void copy_from(const Storage& src, int64_t src_off, int64_t off, int64_t n);
  /// Grows to new_bytes (>= bytes()), keeping the contents, new bytes = `fill`. CapacityError if it cannot allocate
  /// (the storage is unchanged then).
  void grow(int64_t new_bytes, uint8_t fill);

 private:
  void release();
  uint8_t* data_ = nullptr;
  int64_t bytes_ = 0;
  Device device_ = Device::cpu;
  int32_t device_index_ = 0;
};

}  // namespace flashkv::kv
