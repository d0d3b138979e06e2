// Hopper (sm_90a) warpgroup-MMA plumbing for the sm90 kernels: shared-memory matrix descriptors for the 128-byte
// swizzled layouts, the wgmma fences and group waits, and the panel tile layout the descriptors describe.
// Source: PTX ISA 8.x, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate" (matrix descriptor format, canonical
// layouts K-major / MN-major with 128B swizzle); FlashAttention-3 (Shah et al. 2024) §3 uses the same instructions.
#pragma once

#include <cstdint>

#include "cuda/common/ptx.cuh"
#include "cuda/sm90/wgmma_ops.cuh"

namespace flashkv::cuda::sm90 {

using namespace ::flashkv::cuda::attn;  // the shared collectives (common/) are the sm90 family's vocabulary

/// True in the device pass that compiles sm_90a code (wgmma exists); the sm90 kernels' bodies exist only there and
/// are a trap elsewhere (kernel/fwd_kernel.cuh), which the host dispatch never reaches (kernels.cpp).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
inline constexpr bool kSm90aDevice = true;
#else
inline constexpr bool kSm90aDevice = false;
#endif

/// kRows x kCols 16-bit elements stored as kCols/64 panels of 64 columns; in a panel, row r occupies 128 bytes and its
/// 16-byte chunk c sits at chunk c ^ (r & 7) (the hardware's 128-byte swizzle, so the base must be 1024-aligned).
/// This is the canonical SWIZZLE_128B layout of wgmma for a K-major operand whose K runs along the columns and for
/// an MN-major operand whose M/N runs along the columns (then the rows are its K).
template <int kRows_, int kCols_>
struct PanelTile {
  static constexpr int kRows = kRows_;
  static constexpr int kCols = kCols_;
  static constexpr int kChunks = kCols / 8;
  static constexpr int kRowBytes = 128;
  static constexpr int kPanelBytes = kRows * 128;
  static constexpr int kBytes = (kCols / 64) * kPanelBytes;
  static_assert(kCols % 64 == 0 && kRows % 8 == 0, "panel tiles hold whole 64-column panels of 8-row atoms");
  /// Byte offset of (row, 16-byte chunk).
  __device__ __forceinline__ static uint32_t offset(int row, int chunk) {
    return static_cast<uint32_t>((chunk >> 3) * kPanelBytes + row * 128 + (((chunk ^ row) & 7) << 4));
  }
  /// Byte offset of element (row, col), col even (4-byte fragment stores).
  __device__ __forceinline__ static uint32_t offset_elem(int row, int col) {
    return offset(row, col >> 3) + static_cast<uint32_t>((col & 7) * 2);
  }
};

/// kRows x kCols 1-byte elements (the FP8 forward's tiles) stored as kCols/kW panels of kW bytes (kW = 128, 64 or 32:
/// the swizzle width); in a panel, row r occupies kW bytes and its 16-byte chunk c sits at chunk c ^ swz(r), the
/// hardware's kW-byte swizzle (TMA CU_TENSOR_MAP_SWIZZLE_{128,64,32}B, wgmma layout types 1/2/3: address bits [4, 4 +
/// log2(kW/16)) XOR bits [7, ...)), so panels must be 8 * kW-byte aligned. The canonical K-major layout of wgmma for
/// an 8-bit operand whose K runs along the columns.
template <int kRows_, int kCols_, int kW_>
struct SwizzledTile8 {
  static constexpr int kRows = kRows_, kCols = kCols_, kW = kW_;
  static constexpr int kChunksPerPanelRow = kW / 16;
  static constexpr int kPanels = kCols / kW;
  static constexpr int kPanelBytes = kRows * kW;
  static constexpr int kBytes = kPanels * kPanelBytes;
  static_assert(kW == 128 || kW == 64 || kW == 32, "wgmma swizzle widths");
  static_assert(kCols % kW == 0 && kRows % 8 == 0, "whole panels of 8-row atoms");
  __host__ __device__ static constexpr int swz(int row) { return (row * kW / 128) & (kChunksPerPanelRow - 1); }
  /// Byte offset of (row, 16-byte chunk of the row).
  __device__ __forceinline__ static uint32_t offset(int row, int chunk) {
    return static_cast<uint32_t>((chunk / kChunksPerPanelRow) * kPanelBytes + row * kW +
                                 (((chunk % kChunksPerPanelRow) ^ swz(row)) << 4));
  }
  /// Byte offset of the first byte of K column `k` (a multiple of 16) in panel-relative terms for a wgmma descriptor
  /// start: the panel of k and the byte within the row (the hardware applies the swizzle).
  __host__ __device__ static constexpr uint32_t k_offset(int k) {
    return static_cast<uint32_t>((k / kW) * kPanelBytes + k % kW);
  }
};

/// Descriptor of a K-major operand with the kW-byte swizzle (SwizzledTile8 panels: rows kW bytes apart, 8-row atoms
/// 8 * kW bytes apart; the leading offset is unused).
template <int kW>
__device__ __forceinline__ uint64_t desc_kmajor_sw(uint32_t addr) {
  constexpr uint64_t kLayout = kW == 128 ? 1 : kW == 64 ? 2 : 3;
  return static_cast<uint64_t>((addr >> 4) & 0x3FFF) | (uint64_t{1} << 16) | (uint64_t{(8 * kW) >> 4} << 32) |
         (kLayout << 62);
}

/// Descriptor of a K-major SWIZZLE_128B operand starting at shared address `addr` (rows 128 bytes apart, 8-row atoms
/// 1024 bytes apart; the leading offset is unused). Adding b/16 to a descriptor moves its start by b bytes.
__device__ __forceinline__ uint64_t desc_kmajor(uint32_t addr) {
  return static_cast<uint64_t>((addr >> 4) & 0x3FFF) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}
/// Descriptor of an MN-major SWIZZLE_128B operand: 64 M/N elements per 128-byte row, rows along K (8-row atoms 1024
/// bytes apart), successive 64-wide M/N panels `panel_bytes` apart.
__device__ __forceinline__ uint64_t desc_mnmajor(uint32_t addr, uint32_t panel_bytes) {
  return static_cast<uint64_t>((addr >> 4) & 0x3FFF) | (static_cast<uint64_t>((panel_bytes >> 4) & 0x3FFF) << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/// Generic-proxy shared-memory writes (st.shared, cp.async) become visible to the tensor cores' async proxy.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/// Keeps the compiler from moving accesses of accumulator registers across a wgmma issue or wait.
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

}  // namespace flashkv::cuda::sm90
