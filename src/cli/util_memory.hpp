// Peak extra resident memory of a piece of code, measured by the kernel (Linux /proc): reset the high-water mark
// (write "5" to /proc/self/clear_refs), read VmRSS before, VmHWM after. Used by `flashkv bench attention`.
#pragma once

#include <cstdint>

namespace flashkv::cli {

/// Makes every large allocation (>= 64 KiB) an mmap that free() returns to the OS, so scratch buffers freed by an
/// earlier call do not hide the memory a later call needs (glibc would otherwise keep them in its heap).
void release_freed_memory_eagerly();

class PeakRssProbe {
 public:
  /// Resets the high-water mark and records the current resident set. ok() is false where /proc does not allow it.
  PeakRssProbe();
  bool ok() const { return ok_; }
  /// Peak resident bytes above the starting point since construction (>= 0), or -1 if !ok().
  int64_t peak_extra_bytes() const;

 private:
  bool ok_ = false;
  int64_t start_rss_ = 0;
};

}  // namespace flashkv::cli
