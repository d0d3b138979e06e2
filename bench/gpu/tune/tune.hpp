// Kernel tuning harness (development tool, not part of the library): every variant registers itself here; tune_main.cu
// times them on the FA3-paper shapes and checks each against the first registered variant of its (mode, head_dim).
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "cuda/params.hpp"

namespace tune {

using FwdFn = void (*)(const flashkv::cuda::FwdParams&, cudaStream_t);
using BwdFn = void (*)(const flashkv::cuda::BwdParams&, cudaStream_t);

struct Variant {
  std::string name;
  int head_dim;
  bool bwd;
  FwdFn fwd = nullptr;
  BwdFn bwd_fn = nullptr;
};

inline std::vector<Variant>& registry() {
  static std::vector<Variant> v;
  return v;
}

struct Register {
  Register(const char* name, int d, FwdFn f) { registry().push_back({name, d, false, f, nullptr}); }
  Register(const char* name, int d, BwdFn f) { registry().push_back({name, d, true, nullptr, f}); }
};

}  // namespace tune
