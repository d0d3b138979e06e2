// The Hadamard rotation of rotation = hadamard caches on the device (kvcache/format/hadamard.hpp, the CPU cache's
// definition): the decode rotates its query rows before the unchanged split-KV kernel (a rotated K half stores H·D·k,
// so q·k = (H·D·q)·(H·D·k)) and rotates the merged float32 output back (a rotated V half stores H·D·v, and
// Σ p·(H·D·v) = H·D·o). The device append rotates rows inside its encode kernels (decode_append_quant.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/decode_params.hpp"

namespace flashkv::cuda {

/// Rows (b, i, h) of [batch, rows, heads, head_dim] (element strides per side; dtype 0 float32, 1 bfloat16, 2
/// float16), rotated (or, with signs == nullptr, only converted) in float32 and rounded once to dst_dtype.
struct RotateRowsParams {
  const void* src = nullptr;
  int32_t src_dtype = 1;
  int64_t src_batch = 0, src_row = 0, src_head = 0;
  void* dst = nullptr;
  int32_t dst_dtype = 1;
  int64_t dst_batch = 0, dst_row = 0, dst_head = 0;
  int32_t batch = 0, rows = 0, heads = 0, head_dim = 0;  ///< head_dim a power of two <= 256 when rotating
  const float* signs = nullptr;                          ///< device [head_dim] ±1 (hadamard_signs), nullptr: copy
  float norm = 1.f;                                      ///< kv::hadamard_norm(head_dim)
  bool inverse = false;
};
void rotate_rows(const RotateRowsParams& p, cudaStream_t stream);

/// For a decode whose kernel wrote float32 partials (p.num_splits >= 2: p.o_accum / p.lse_accum, the combine's
/// input): merges them exactly as decode_combine_kernel does, rotates the normalized row back (inverse rotation,
/// signs on the device) and stores it to p.out rounded once to T (bf16: dtype 1, fp16: 2). lse is not written (the
/// combine wrote it; the rotation does not change it).
void decode_rotate_out(const DecodeParams& p, int32_t dtype, const float* signs, float norm, cudaStream_t stream);

}  // namespace flashkv::cuda
