// Internal: ggml's tensor element types as stored in GGUF files — block sizes and dequantization to float32.
// The block layouts are documented at flashkv::GgufType (flashkv/model.hpp); every product in the formulas is exact in
// float32, so each value is the float32 nearest to the exact formula (what ggml's reference dequantizers compute).
#pragma once

#include <cstdint>
#include <string>

namespace flashkv::engine_detail {

struct GgmlTypeInfo {
  uint32_t id;
  const char* name;      // ggml's name: "Q4_K"
  int32_t block_values;  // values per block (1 for F32/F16/BF16)
  int32_t block_bytes;   // bytes per block
  /// Dequantizes `n_blocks` consecutive blocks at `src` into `dst` (n_blocks · block_values floats).
  void (*dequantize)(const uint8_t* src, float* dst, int64_t n_blocks);
};

/// The type's description, or nullptr when this engine cannot read it.
const GgmlTypeInfo* ggml_type_info(uint32_t type);
/// ggml's name for any type id ("Q2_K", ...), "type<N>" if unknown.
std::string ggml_type_name(uint32_t type);
/// Comma-separated names of the supported types (for error messages).
std::string ggml_supported_types();

/// Dequantizes `n_values` values (a multiple of the block size) of `type` from `src` to `dst`, in parallel (OpenMP).
/// Returns the index of the first non-finite value produced, or −1.
int64_t ggml_dequantize(const GgmlTypeInfo& type, const uint8_t* src, float* dst, int64_t n_values);

}  // namespace flashkv::engine_detail
