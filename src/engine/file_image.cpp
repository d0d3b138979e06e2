// Read-only file mapping (POSIX mmap) with IoError on every failure.
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/byte_reader.hpp"

namespace flashkv::engine_detail {

std::shared_ptr<const FileImage> FileImage::map(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError("flashkv: cannot open '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw IoError("flashkv: '" + path + "' is not a regular file");
  }
  std::shared_ptr<FileImage> img(new FileImage());
  img->source_ = path;
  img->size_ = static_cast<std::size_t>(st.st_size);
  if (img->size_ > 0) {
    void* p = ::mmap(nullptr, img->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      throw IoError("flashkv: cannot map '" + path + "': " + std::strerror(e));
    }
    img->mapping_ = p;
    img->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return img;
}

std::shared_ptr<const FileImage> FileImage::copy(std::span<const uint8_t> bytes, std::string source) {
  std::shared_ptr<FileImage> img(new FileImage());
  img->source_ = std::move(source);
  img->size_ = bytes.size();
  // Over-allocate as floats so that float32 payloads at 4-aligned offsets stay aligned.
  img->owned_.reset(reinterpret_cast<uint8_t*>(new float[(bytes.size() + 3) / 4 + 1]));
  if (!bytes.empty()) std::memcpy(img->owned_.get(), bytes.data(), bytes.size());
  img->data_ = img->owned_.get();
  return img;
}

FileImage::~FileImage() {
  if (mapping_ != nullptr) ::munmap(mapping_, size_);
  if (owned_) delete[] reinterpret_cast<float*>(owned_.release());
}

}  // namespace flashkv::engine_detail
