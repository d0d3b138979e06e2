// Device side of test_kv_traits_cuda.cpp: the format trait (src/kvcache/format/traits.hpp) compiled by nvcc, run on
// buffers in device memory. Plain C++17 interface (the test includes the C++20 public headers, this file only the trait).
#pragma once

#include <cstdint>

#include "kvcache/format/traits.hpp"

namespace flashkv::cudatest {

/// Encodes the P / tokens_per_unit units of x [P][head_dim] (device) into one page-head (device codes / meta), one
/// thread per unit; scratch: P · head_dim bytes of device memory.
void trait_encode_on_device(const kv::KVHalfFormat& f, const float* x, int P, uint8_t* codes, uint8_t* meta,
                            float head_scale, uint8_t* scratch);
/// out[t·head_dim + c] = f.dequant(codes, meta, t, c, head_scale) for t < P, on the device.
void trait_dequant_on_device(const kv::KVHalfFormat& f, const uint8_t* codes, const uint8_t* meta, int P,
                             float head_scale, float* out);

}  // namespace flashkv::cudatest
