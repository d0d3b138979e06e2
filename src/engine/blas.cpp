// OpenBLAS, loaded at first use; see blas.hpp for why (kernel family and threading are decided before it initializes).
#include "engine/blas.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <vector>

#include "flashkv/error.hpp"

namespace flashkv::engine_detail {

namespace {

Blas load() {
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    ::setenv("OPENBLAS_CORETYPE", "SkylakeX", 0);
  std::vector<std::string> candidates;
  if (const char* p = std::getenv("FLASHKV_BLAS"); p != nullptr && p[0] != '\0') candidates.emplace_back(p);
  candidates.emplace_back("/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0");
  candidates.emplace_back("libopenblas.so.0");
  std::string tried;
  for (const std::string& path : candidates) {
    void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      tried += (tried.empty() ? "" : "; ") + path + ": " + ::dlerror();
      continue;
    }
    Blas b;
    b.library = path;
    b.sgemm = reinterpret_cast<decltype(b.sgemm)>(::dlsym(h, "cblas_sgemm"));
    b.sgemv = reinterpret_cast<decltype(b.sgemv)>(::dlsym(h, "cblas_sgemv"));
    if (b.sgemm == nullptr || b.sgemv == nullptr) {
      tried += (tried.empty() ? "" : "; ") + path + ": no cblas_sgemm / cblas_sgemv";
      ::dlclose(h);
      continue;
    }
    auto config = reinterpret_cast<char* (*)()>(::dlsym(h, "openblas_get_config"));
    auto corename = reinterpret_cast<char* (*)()>(::dlsym(h, "openblas_get_corename"));
    auto parallel = reinterpret_cast<int (*)()>(::dlsym(h, "openblas_get_parallel"));
    b.info = config != nullptr ? config() : path;
    if (corename != nullptr) b.info += std::string(" | core ") + corename();
    if (parallel != nullptr) b.info += std::string(" | ") + (parallel() == 2 ? "openmp" : parallel() == 1 ? "pthreads" : "sequential");
    return b;  // the handle stays open for the life of the process
  }
  throw IoError("flashkv: cannot load OpenBLAS for the engine's matrix products (run scripts/setup): " + tried);
}

}  // namespace

const Blas& blas() {
  static const Blas b = load();
  return b;
}

}  // namespace flashkv::engine_detail
