// Device side of the quantized decode's conversion test (test_decode_quant_cuda.cpp): runs the decode's 8-code
// register conversion (sm80/decode_kv_source.cuh: dequant8<KVCode, KVScaling, head_dim>) over staged rows in device
// memory. Plain C++17 interface.
#pragma once

#include <cstdint>

#include "kvcache/format/traits.hpp"

namespace flashkv::cudatest {

/// out[r·head_dim + c] = dequant8's x̂ of row r, channel c for r < rows: codes [rows][f.code_bytes], meta
/// [rows][f.meta_bytes_per_unit] (token-granular formats), device pointers. Returns false when (f.code, f.scaling,
/// f.head_dim) is not one of the conversions this test instantiates (u8 / u4 / u2 token_affine, e4m3 / e5m2
/// head_static / token_f32; head_dim 64 / 128).
bool dequant8_on_device(const kv::KVHalfFormat& f, const uint8_t* codes, const uint8_t* meta, int rows,
                        float head_scale, float* out);

}  // namespace flashkv::cudatest
