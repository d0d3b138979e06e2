// The compiled quantized-decode instantiations (generated decode_quant_table.cu; src/cuda/generate_instantiations.py,
// CMake FLASHKV_CUDA_KV_FORMATS) and their lookup. One entry = head_dim x query dtype x (KVCode, KVScaling) of K and of
// V; the group size and metadata geometry are run-time (DecodeParams::k_format / v_format).
#pragma once

#include <cstdint>
#include <string>

#include "cuda/kernels.hpp"
#include "flashkv/types.hpp"
#include "kvcache/format/traits.hpp"

namespace flashkv::cuda {

struct QuantDecodeEntry {
  int32_t head_dim;  ///< exact (the format's geometry depends on it: no zero padding)
  DType dtype;       ///< of q / out
  kv::KVCode k_code;
  kv::KVScaling k_scaling;
  kv::KVCode v_code;
  kv::KVScaling v_scaling;
  DecodeLaunch launch;
  const char* name;  ///< the FLASHKV_CUDA_KV_FORMATS entry ("int8", "fp8_e4m3_dynamic", "int8/int4")
};
extern const QuantDecodeEntry kQuantDecodeTable[];
extern const int kQuantDecodeTableSize;

/// The instantiation for (head_dim, dtype, K format, V format), or UnsupportedError naming the combination (k_name /
/// v_name: the kv_cache_dtype names) and listing the compiled ones.
const QuantDecodeEntry& find_quant_decode(int64_t head_dim, DType dtype, const kv::KVHalfFormat& k,
                                          const kv::KVHalfFormat& v, const std::string& k_name,
                                          const std::string& v_name);

}  // namespace flashkv::cuda
