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

/// Every one of the 2^32 float bit patterns except NaN through the device's hardware conversions and the portable
/// definitions of the same functions (format/traits.hpp): mismatches[0] float_to_fp8_bits e4m3, [1] e5m2,
/// [2] fp16_bits_round_down, [3] fp16_bits_round_up; first[i] the smallest float bits that differ (UINT32_MAX: none).
/// `hardware` = whether the device build has the hardware fp8 path (sm_89+). Host arrays of 4; synchronizes.
void conversions_vs_portable(unsigned long long (&mismatches)[4], uint32_t (&first)[4], bool& hardware);

}  // namespace flashkv::cudatest
