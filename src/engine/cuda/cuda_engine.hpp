// The CUDA backend of flashkv::Engine (cuda_engine.cpp; the design is in its file comment and docs/engine.md "CUDA").
// It registers itself with engine_detail::register_cuda_engine() from a static initializer; the CLI and libflashkv
// link every layer whole-archive, so it is always registered there. Other executables call cuda_engine_registered().
#pragma once

namespace flashkv::engine_cuda {

/// Forces the registration of the CUDA engine backend; returns true.
bool cuda_engine_registered();

}  // namespace flashkv::engine_cuda
