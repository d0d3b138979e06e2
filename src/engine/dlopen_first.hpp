// Internal: loading the first usable shared library of a candidate list (dlopen), for the libraries the engine loads at
// run time instead of linking — OpenBLAS (blas.cpp) and cuBLAS (cuda/gemm.cpp) — with one wording of what was tried.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace flashkv::engine_detail {

struct DlopenResult {
  void* handle = nullptr;  ///< the library kept open (for the life of the process), or nullptr when none was taken
  std::string path;        ///< the candidate it came from
  std::string tried;       ///< "PATH: reason; PATH: reason" for every candidate refused before it (or all of them)
};

/// Tries $`env` first when that variable is set and non-empty, then `candidates` in order: dlopen(RTLD_NOW |
/// RTLD_LOCAL), then `accept(handle)`, which looks up the symbols it needs and returns "" to take the library or the
/// reason it cannot (e.g. "no cblas_sgemm / cblas_sgemv"; the handle is then closed). The first taken library is
/// returned; each refused candidate adds "PATH: " + dlerror() or + the reason to `tried`.
DlopenResult dlopen_first(const char* env, const std::vector<std::string>& candidates,
                          const std::function<std::string(void*)>& accept);

}  // namespace flashkv::engine_detail
