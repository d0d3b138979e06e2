// Host side of the TMA loads: tensor maps (CUtensorMap) for [batch, seqlen, heads, head_dim] tensors, boxes of
// 64 head-dim columns (128 bytes of 16-bit elements) x kRows rows with the 128-byte swizzle, i.e. one panel of
// sm90::PanelTile per copy; the FP8 forward's 1-byte elements take boxes of 128 (or, head_dim 64, 64) columns with
// the 128-byte (64-byte) swizzle, one panel of sm90::SwizzledTile8.
//
// cuTensorMapEncodeTiled is a driver entry point; it is fetched through the runtime (cudaGetDriverEntryPointByVersion)
// so the library does not link libcuda. Source: CUDA Driver API, "Tensor Map Object Management".
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "flashkv/error.hpp"

namespace flashkv::cuda::sm90 {

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

inline EncodeTiledFn encode_tiled_fn() {
  static EncodeTiledFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || p == nullptr)
      throw UnsupportedError("flashkv: the CUDA driver does not provide cuTensorMapEncodeTiled (the sm90ws kernels' "
                             "TMA needs a driver of CUDA 12.0 or later)");
    return reinterpret_cast<EncodeTiledFn>(p);
  }();
  return fn;
}

/// Tensor map of a 4-D tensor with element (c, row, head, batch) at base + c + row*row_stride + head*head_stride +
/// batch*batch_stride (strides in ELEMENTS, multiples of 8 = 16 bytes), boxes of 64 x box_rows x 1 x 1. Rows past
/// `rows` and columns past `cols` read as zeros (the tile padding the kernels rely on). swizzle_bytes (128, 64 or 32)
/// is the box's inner extent in bytes and its shared-memory swizzle.
inline CUtensorMap make_tma_map_4d(const void* base, CUtensorMapDataType dtype, int elem_bytes, int64_t cols,
                                   int64_t rows, int64_t heads, int64_t batch, int64_t row_stride,
                                   int64_t head_stride, int64_t batch_stride, int box_rows, int swizzle_bytes = 128) {
  CUtensorMap map{};
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch < 1 ? 1 : batch)};
  // Strides of dims 1..3 in bytes; a zero batch stride (one batch) is replaced by any valid multiple of 16.
  const int64_t bs = batch_stride != 0 ? batch_stride : row_stride * rows;
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(row_stride * elem_bytes),
                                 static_cast<cuuint64_t>(head_stride * elem_bytes),
                                 static_cast<cuuint64_t>(bs * elem_bytes)};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(swizzle_bytes / elem_bytes), static_cast<cuuint32_t>(box_rows), 1,
                             1};
  const CUtensorMapSwizzle swizzle = swizzle_bytes == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                                     : swizzle_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                           : CU_TENSOR_MAP_SWIZZLE_32B;
  const cuuint32_t estride[4] = {1, 1, 1, 1};
  const CUresult r = encode_tiled_fn()(&map, dtype, 4, const_cast<void*>(base), dims, strides, box, estride,
                                       CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                                       CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {  // the host has padded/aligned the tensors (attention_cuda.cpp), so this is not the user's
    throw Error("flashkv: CUDA error in cuTensorMapEncodeTiled (" + std::to_string(static_cast<int>(r)) + ")",
                Status::internal);
  }
  return map;
}

}  // namespace flashkv::cuda::sm90
