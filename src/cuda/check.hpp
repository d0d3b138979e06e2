// CUDA runtime error -> flashkv::Error (Status::internal) with the failing call named.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "flashkv/error.hpp"

namespace flashkv::cuda {

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw Error(std::string("flashkv: CUDA error in ") + what + ": " + cudaGetErrorName(err) + " (" +
                    cudaGetErrorString(err) + ")",
                Status::internal);
  }
}

}  // namespace flashkv::cuda
