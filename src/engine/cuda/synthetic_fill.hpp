// The CUDA engine's synthetic K/V staging (Engine::append_synthetic; the values of src/engine/synthetic_kv.hpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace flashkv::engine_cuda {

/// k / v [n, num_heads_kv, head_dim] (bf16, or fp16 when `fp16`, as raw 16-bit words) = synthetic_kv_value(seed,
/// half, layer, pos0 + t, head, channel, ...) for t < n; exact in either type. Asynchronous on `stream`.
void synthetic_kv(uint64_t seed, int layer, int num_layers, int64_t pos0, int n, int num_heads_kv, int head_dim,
                  bool fp16, uint16_t* k, uint16_t* v, cudaStream_t stream);

}  // namespace flashkv::engine_cuda
