#include "core/path_log.hpp"

#include "flashkv/diagnostics.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace flashkv::core {
namespace {
thread_local std::string g_last_path;
}

bool path_log_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("FLASHKV_LOG");
    return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

void record_path(std::string description) {
  g_last_path = std::move(description);
  if (path_log_enabled()) std::fprintf(stderr, "flashkv: %s\n", g_last_path.c_str());
}

const std::string& last_path() { return g_last_path; }

}  // namespace flashkv::core

namespace flashkv {
std::string last_kernel_path() { return core::last_path(); }
}  // namespace flashkv
