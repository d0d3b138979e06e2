// Device side of the quantized decode's conversion tests (test_decode_quant_cuda.cpp): runs the 8-code register
// conversion (sm80/decode_kv_source.cuh: dequant8<KVCode, KVScaling, head_dim>) over staged rows in device memory, and
// the decode's exact 16-bit code images (sm80/decode_code16.cuh: Code16) over all code bytes. Plain C++17 interface.
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

/// The decode's exact 16-bit code images (sm80/decode_code16.cuh, Code16<code, bf16 ? bfloat16 : float16>) of all 256
/// code bytes: out (device, 512 floats) [b] = the image of byte b (4-bit codes: of its low nibble; [256 + b]: of its
/// high nibble); *mul / *off (host) = Code16's kMul / kOff (image = (code_value − off) · mul). False for other codes.
bool code16_on_device(kv::KVCode code, bool bf16, float* out, float* mul, float* off);

/// The register-direct decode's conversions (sm80/decode_frag.hpp, FragCode<code, bf16, centered>) on the device:
/// out (device, 1024 words) [4b + k] = result register k of word b = bytes b, b + 37, b + 101, b + 203 (mod 256)
/// (8-bit: pairs8's x02, x13, then 0, 0; 4-bit: pairs4's x[0..3]). False for a combination it does not instantiate.
bool frag_code_on_device(kv::KVCode code, bool bf16, bool centered, uint32_t* out);

}  // namespace flashkv::cudatest
