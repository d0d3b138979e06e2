// OpenBLAS, loaded at first use; see blas.hpp for why (kernel family and threading are decided before it initializes).
#include "engine/blas.hpp"

#include <dlfcn.h>

#include <cstdlib>

#include "engine/dlopen_first.hpp"
#include "flashkv/error.hpp"

namespace flashkv::engine_detail {

namespace {

Blas load() {
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    ::setenv("OPENBLAS_CORETYPE", "SkylakeX", 0);
  Blas b;
  const DlopenResult lib = dlopen_first("FLASHKV_BLAS",
                                        {"/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0", "libopenblas.so.0"},
                                        [&b](void* h) -> std::string {
                                          b.sgemm = reinterpret_cast<decltype(b.sgemm)>(::dlsym(h, "cblas_sgemm"));
                                          b.sgemv = reinterpret_cast<decltype(b.sgemv)>(::dlsym(h, "cblas_sgemv"));
                                          return b.sgemm && b.sgemv ? "" : "no cblas_sgemm / cblas_sgemv";
                                        });
  if (lib.handle == nullptr)
    throw IoError("flashkv: cannot load OpenBLAS for the engine's matrix products (run scripts/setup): " + lib.tried);
  void* h = lib.handle;  // stays open for the life of the process
  b.library = lib.path;
  auto config = reinterpret_cast<char* (*)()>(::dlsym(h, "openblas_get_config"));
  auto corename = reinterpret_cast<char* (*)()>(::dlsym(h, "openblas_get_corename"));
  auto parallel = reinterpret_cast<int (*)()>(::dlsym(h, "openblas_get_parallel"));
  b.info = config != nullptr ? config() : lib.path;
  if (corename != nullptr) b.info += std::string(" | core ") + corename();
  if (parallel != nullptr) b.info += std::string(" | ") + (parallel() == 2 ? "openmp" : parallel() == 1 ? "pthreads" : "sequential");
  return b;
}

}  // namespace

const Blas& blas() {
  static const Blas b = load();
  return b;
}

}  // namespace flashkv::engine_detail
