// Internal: read-only file mapping and a bounds-checked little-endian reader used by every loader. Every read past
// the end raises flashkv::IoError naming the source and the offset, so corrupt files can never crash a loader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>

#include "flashkv/error.hpp"

namespace flashkv::engine_detail {

/// A whole file mapped read-only (or an owned copy of a memory buffer). Never empty-pointer: zero-length files map to
/// an empty span.
class FileImage {
 public:
  static std::shared_ptr<const FileImage> map(const std::string& path);
  static std::shared_ptr<const FileImage> copy(std::span<const uint8_t> bytes, std::string source = "<memory>");
  ~FileImage();
  FileImage(const FileImage&) = delete;
  FileImage& operator=(const FileImage&) = delete;

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& source() const { return source_; }

 private:
  FileImage() = default;
  const uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
  void* mapping_ = nullptr;  // mmap base when mapped
  std::unique_ptr<uint8_t[]> owned_;
  std::string source_;
};

class ByteReader {
 public:
  ByteReader(std::span<const uint8_t> bytes, std::string source) : bytes_(bytes), source_(std::move(source)) {}

  std::size_t offset() const { return offset_; }
  std::size_t size() const { return bytes_.size(); }
  std::size_t remaining() const { return bytes_.size() - offset_; }
  const std::string& source() const { return source_; }

  [[noreturn]] void fail(const std::string& what) const {
    throw IoError("flashkv: " + source_ + ": " + what + " (at byte offset " + std::to_string(offset_) + ")");
  }
  void require(std::size_t n, const char* what) const {
    if (n > remaining())
      fail(std::string("truncated file: need ") + std::to_string(n) + " bytes for " + what + ", only " +
           std::to_string(remaining()) + " left");
  }
  template <class T>
  T read(const char* what) {
    require(sizeof(T), what);
    T v;
    std::memcpy(&v, bytes_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return v;
  }
  std::span<const uint8_t> take(std::size_t n, const char* what) {
    require(n, what);
    auto s = bytes_.subspan(offset_, n);
    offset_ += n;
    return s;
  }
  void seek(std::size_t off, const char* what) {
    if (off > bytes_.size())
      fail(std::string("offset ") + std::to_string(off) + " of " + what + " is past the end of the file (size " +
           std::to_string(bytes_.size()) + ")");
    offset_ = off;
  }
  const uint8_t* data_at(std::size_t off) const { return bytes_.data() + off; }

 private:
  std::span<const uint8_t> bytes_;
  std::string source_;
  std::size_t offset_ = 0;
};

}  // namespace flashkv::engine_detail
