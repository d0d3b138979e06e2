#include "cli/util_memory.hpp"

#include <algorithm>
#include <fstream>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace flashkv::cli {
namespace {

/// Value in bytes of a "Key:   123 kB" line of /proc/self/status, or -1.
int64_t status_bytes(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(f, line)) {
    if (line.rfind(k, 0) == 0) return std::stoll(line.substr(k.size())) * 1024;
  }
  return -1;
}

}  // namespace

void release_freed_memory_eagerly() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 64 * 1024);  // fixed threshold: disables glibc's dynamic raise of it
  mallopt(M_TRIM_THRESHOLD, 128 * 1024);
#endif
}

PeakRssProbe::PeakRssProbe() {
  std::ofstream clear("/proc/self/clear_refs");
  if (!clear) return;
  clear << "5";
  clear.close();
  if (!clear) return;
  start_rss_ = status_bytes("VmRSS");
  ok_ = start_rss_ >= 0;
}

int64_t PeakRssProbe::peak_extra_bytes() const {
  if (!ok_) return -1;
  const int64_t hwm = status_bytes("VmHWM");
  return hwm < 0 ? -1 : std::max<int64_t>(0, hwm - start_rss_);
}

}  // namespace flashkv::cli
