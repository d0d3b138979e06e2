// The small kernels of the CUDA engine's Llama forward pass (include/flashkv/model.hpp, ARCHITECTURE), each matching the
// CPU engine's arithmetic (src/engine/engine.cpp) in float32, with its outputs rounded once to the 16-bit type the
// next GEMM or attention reads. All run on `stream`, asynchronously; shapes are row-major, counts in elements.
// bf16 / fp16 values are passed as raw 16-bit words (uint16_t).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace flashkv::engine_cuda {

/// x[r, :] = table[tokens[r], :] for r < rows: table [vocab, dim] float32, tokens [rows] int32 (checked by the Engine),
/// x [rows, dim] float32.
void embed_rows(const float* table, const int32_t* tokens, int rows, int dim, float* x, cudaStream_t stream);

/// out[r, :] = bf16(weight ⊙ (inv_r · x[r, :])), inv_r = float(1 / sqrt(Σ x² / dim + eps)) with Σ x² in float64
/// (Zhang & Sennrich 2019; the CPU engine's rmsnorm). x [rows, dim] float32 (row stride dim), weight [dim] float32,
/// out [rows, dim] bf16.
void rmsnorm_bf16(const float* x, const float* weight, int rows, int dim, float eps, uint16_t* out,
                  cudaStream_t stream);

/// RoPE of the interleaved-pair layout and the split of the fused projection: qkv [rows, (hq + 2·hk)·hd] float32
/// (q heads, then k heads, then v heads), pos [rows] int32 positions, rope_cos / rope_sin [context, hd / 2] float32
/// (engine_detail::rope_tables). Pair (x[2i], x[2i+1]) of every q and k head becomes (x0·c − x1·s, x0·s + x1·c) in
/// float32; v is copied. Outputs q [rows, hq, hd], k / v [rows, hk, hd] rounded to bf16 (fp16 = false) or fp16.
void rope_split(const float* qkv, const int32_t* pos, const float* rope_cos, const float* rope_sin, int rows, int hq,
                int hk, int hd, bool fp16, uint16_t* q, uint16_t* k, uint16_t* v, cudaStream_t stream);

/// SwiGLU (Shazeer 2020): h[r, i] = bf16(g · (1 / (1 + exp(−g))) · u) with g = gu[r, i], u = gu[r, hidden + i];
/// gu [rows, 2·hidden] float32 (the fused gate/up projection), h [rows, hidden] bf16.
void swiglu_bf16(const float* gu, int rows, int hidden, uint16_t* h, cudaStream_t stream);

/// dst[i] = bf16(float(src[i])) for n fp16 values (an fp16 cache's attention output feeding the bf16 Wo GEMM).
void fp16_to_bf16(const uint16_t* src, int64_t n, uint16_t* dst, cudaStream_t stream);

/// dst[i] = bf16(src[i]) for n float32 values (weight upload).
void f32_to_bf16(const float* src, int64_t n, uint16_t* dst, cudaStream_t stream);

}  // namespace flashkv::engine_cuda
