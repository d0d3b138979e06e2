// Element access and tile loads/stores with dtype conversion for the CPU kernels (float16/bfloat16 are converted per
// tile to float32; all arithmetic is float32). Addressing follows src/core/problem.hpp.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

#include "core/float16.hpp"
#include "core/problem.hpp"
#include "cpu/tile_math.hpp"

namespace flashkv::cpu {

/// Byte pointer of element `offset` (in elements) of a q/k/v-dtype buffer.
FLASHKV_ALWAYS_INLINE const void* elem_ptr(const void* base, int64_t offset, DType t) {
  return static_cast<const char*>(base) + offset * (t == DType::float32 ? 4 : 2);
}
FLASHKV_ALWAYS_INLINE void* elem_ptr(void* base, int64_t offset, DType t) {
  return static_cast<char*>(base) + offset * (t == DType::float32 ? 4 : 2);
}

/// Element offset of (batch b, row, head h) for a tensor with strides s, where row is relative to the sequence start
/// row0 (0 for fixed-length, cu_seqlens[b] for varlen).
FLASHKV_ALWAYS_INLINE int64_t offset_of(const core::Strides3& s, int64_t b, int64_t row0, int64_t row, int64_t h) {
  return b * s.batch + (row0 + row) * s.row + h * s.head;
}

FLASHKV_ALWAYS_INLINE int64_t lse_offset(const core::LseStrides& s, int64_t b, int64_t row0, int64_t row, int64_t h) {
  return b * s.batch + h * s.head + (row0 + row) * s.row;
}

/// IEEE binary16 bits -> float, exact (same results as core/float16.hpp fp16_to_float, checked exhaustively by
/// tests/cpu/test_tile_io.cpp) but branch-free so conversion loops vectorize: the 15 exponent+mantissa bits are
/// placed in a float32 and rescaled by 2^112 (normals and subnormals alike); Inf/NaN keep an all-ones exponent.
FLASHKV_ALWAYS_INLINE float fp16_to_float_fast(uint16_t h) {
  const uint32_t em = static_cast<uint32_t>(h & 0x7fffu) << 13;
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const float scaled = std::bit_cast<float>(em) * 0x1p112f;
  const uint32_t u = em >= (0x7c00u << 13) ? (em | 0x7f800000u) : std::bit_cast<uint32_t>(scaled);
  return std::bit_cast<float>(u | sign);
}

/// dst[r*dim + c] = float(src row r, column c), r < rows; src rows are `row_stride` elements apart.
FLASHKV_ALWAYS_INLINE void load_rows(const void* src, DType t, int64_t row_stride, int rows, int dim,
                                     float* __restrict dst) {
  for (int r = 0; r < rows; ++r) {
    float* d = dst + static_cast<int64_t>(r) * dim;
    if (t == DType::float32) {
      std::memcpy(d, static_cast<const float*>(src) + r * row_stride, sizeof(float) * dim);
    } else if (t == DType::float16) {
      const uint16_t* s = static_cast<const uint16_t*>(src) + r * row_stride;
      for (int c = 0; c < dim; ++c) d[c] = fp16_to_float_fast(s[c]);
    } else {
      const uint16_t* s = static_cast<const uint16_t*>(src) + r * row_stride;
      for (int c = 0; c < dim; ++c) d[c] = bf16_to_float(s[c]);
    }
  }
}

/// Transposed load of up to kBlockN rows: dst[c*kBlockN + r] = float(src row r, column c); columns r >= rows are 0.
/// Each row is first converted into a contiguous float32 row (vectorized), then scattered into the column layout.
FLASHKV_ALWAYS_INLINE void load_rows_transposed(const void* src, DType t, int64_t row_stride, int rows, int dim,
                                                float* __restrict dst) {
  for (int c = 0; c < dim; ++c) {
    for (int r = rows; r < kBlockN; ++r) dst[static_cast<int64_t>(c) * kBlockN + r] = 0.0f;
  }
  float row[256];  // head_dim <= 256 (validated)
  for (int r = 0; r < rows; ++r) {
    const float* converted = row;
    if (t == DType::float32) {
      converted = static_cast<const float*>(src) + r * row_stride;
    } else if (t == DType::float16) {
      const uint16_t* s = static_cast<const uint16_t*>(src) + r * row_stride;
      for (int c = 0; c < dim; ++c) row[c] = fp16_to_float_fast(s[c]);
    } else {
      const uint16_t* s = static_cast<const uint16_t*>(src) + r * row_stride;
      for (int c = 0; c < dim; ++c) row[c] = bf16_to_float(s[c]);
    }
    for (int c = 0; c < dim; ++c) dst[static_cast<int64_t>(c) * kBlockN + r] = converted[c];
  }
}

/// dst[c] = convert(src[c]) for c < dim (round to nearest even for float16/bfloat16).
FLASHKV_ALWAYS_INLINE void store_row(const float* __restrict src, int dim, void* dst, DType t) {
  if (t == DType::float32) {
    std::memcpy(dst, src, sizeof(float) * dim);
  } else if (t == DType::float16) {
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (int c = 0; c < dim; ++c) d[c] = float_to_fp16(src[c]);
  } else {
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (int c = 0; c < dim; ++c) d[c] = float_to_bf16(src[c]);
  }
}

/// Writes `dim` zeros (a valid zero in every dtype is all-zero bits).
FLASHKV_ALWAYS_INLINE void store_zero_row(int dim, void* dst, DType t) {
  std::memset(dst, 0, static_cast<std::size_t>(dim) * (t == DType::float32 ? 4 : 2));
}

}  // namespace flashkv::cpu
