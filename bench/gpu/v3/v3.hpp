// GPU harness for the TMA warp-specialized Hopper forward (development tool, not part of the library): every kernel
// variant registers itself here; v3_api.cu exposes them through a C ABI that harness.py loads with ctypes.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "cuda/params.hpp"

namespace v3 {

using FwdFn = cudaError_t (*)(const flashkv::cuda::FwdParams&, cudaStream_t);

struct Variant {
  std::string name;  ///< "<family>/hd<d>/<tag>", e.g. "ws/hd128/full"
  int head_dim;
  int dtype;  ///< 0 bf16, 1 fp16
  FwdFn fn;
  std::string config;  ///< tile / option summary
};

inline std::vector<Variant>& registry() {
  static std::vector<Variant> v;
  return v;
}

struct Register {
  Register(const char* name, int d, int dtype, FwdFn f, const char* config) {
    registry().push_back({name, d, dtype, f, config});
  }
};

}  // namespace v3
