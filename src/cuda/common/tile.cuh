// Shared-memory tiles of kRows x kCols 16-bit elements with an XOR swizzle on 16-byte chunks, so that both the
// cp.async writes (one chunk per thread) and the ldmatrix reads (8 rows of one logical chunk) are bank-conflict free:
//   physical chunk = (c & ~7) | ((c ^ row) & 7)
// The row pitch is rounded up to a multiple of 8 chunks (128 bytes), e.g. head_dim 96 uses a 128-element pitch.
#pragma once

#include <cstdint>

#include "cuda/common/ptx.cuh"

namespace flashkv::cuda::attn {

template <int kRows_, int kCols_>
struct SmemTile {
  static constexpr int kRows = kRows_;
  static constexpr int kCols = kCols_;                      ///< logical columns (elements)
  static constexpr int kChunks = kCols / 8;                 ///< logical 16-byte chunks per row
  static constexpr int kPitchChunks = (kChunks + 7) / 8 * 8;  ///< physical chunks per row
  static constexpr int kRowBytes = kPitchChunks * 16;        ///< bytes from one row to the next
  static constexpr int kBytes = kRows * kPitchChunks * 16;
  static_assert(kCols % 16 == 0, "tile columns must be a multiple of 16");

  /// Byte offset of (row, chunk) inside the tile.
  __device__ __forceinline__ static uint32_t offset(int row, int chunk) {
    return static_cast<uint32_t>((row * kPitchChunks + ((chunk & ~7) | ((chunk ^ row) & 7))) * 16);
  }
  /// Byte offset of element (row, col) (col even; used for 4-byte fragment stores).
  __device__ __forceinline__ static uint32_t offset_elem(int row, int col) {
    return offset(row, col >> 3) + static_cast<uint32_t>((col & 7) * 2);
  }
};

/// ldmatrix address generator for one operand: lane `lr` supplies row R0 + lr and logical chunk cb + C0 + lc
/// (lc in {0, 1}) for compile-time R0 (multiple of 8) and C0 (even), and a per-thread chunk base cb (even; e.g. the
/// warp's column offset). Because the swizzle only XORs the low 3 chunk bits with the low 3 row bits, the lane- and
/// cb-dependent part is a 4-entry table (with the carry of cb + C0 folded in) and every (R0, C0) address is base +
/// compile-time constant + table entry — unrolled loops neither materialize one address register per fragment nor
/// index the table dynamically (which would put it in local memory).
template <class Tile>
struct LdsmAddr {
  uint32_t base;
  uint32_t tab[4];
  __device__ __forceinline__ LdsmAddr(uint32_t smem, int lr, int lc, int cb = 0) {
    base = smem + static_cast<uint32_t>((lr * Tile::kPitchChunks + (cb & ~7)) * 16);
    const int x = (lc ^ lr) & 7;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int v = (cb & 7) + 2 * i;
      tab[i] = static_cast<uint32_t>(((v & 8) + ((v & 7) ^ x)) * 16);
    }
  }
  __device__ __forceinline__ uint32_t operator()(int r0, int c0) const {
    return base + static_cast<uint32_t>(r0 * Tile::kPitchChunks * 16 + (c0 & ~7) * 16) + tab[(c0 & 7) >> 1];
  }
};

/// Copies rows [row0, row0 + Tile::kRows) of a strided global matrix into a tile with cp.async. Row r is valid when
/// row0 + r < num_rows; chunk c is valid when 8c < num_cols; invalid chunks are zero-filled (so padded rows/columns
/// contribute exactly 0). `row_ptr(r)` returns the global address of row row0 + r (only called for valid rows).
template <class Tile, int kThreads, class RowPtr>
__device__ __forceinline__ void load_tile_async(uint32_t smem_base, RowPtr row_ptr, int valid_rows, int num_cols,
                                                const void* any_valid_ptr) {
  constexpr int kTotal = Tile::kRows * Tile::kChunks;
  if constexpr (kThreads % Tile::kChunks == 0 && kTotal % kThreads == 0) {
    // Every thread keeps one chunk column; rows advance by a constant, so the swizzled offset is loop-invariant.
    constexpr int kRowStep = kThreads / Tile::kChunks;
    const int c = static_cast<int>(threadIdx.x) % Tile::kChunks;
    const int r0 = static_cast<int>(threadIdx.x) / Tile::kChunks;
    const uint32_t dst0 = smem_base + Tile::offset(r0, c);
    const bool col_ok = c * 8 < num_cols;
#pragma unroll
    for (int it = 0; it < kTotal / kThreads; ++it) {
      const int r = r0 + it * kRowStep;
      const bool ok = col_ok && r < valid_rows;
      const void* src = ok ? reinterpret_cast<const char*>(row_ptr(r)) + c * 16 : any_valid_ptr;
      // kRowStep is a multiple of 8 whenever kChunks <= kThreads / 8, keeping (row & 7) and thus the swizzle fixed.
      const uint32_t dst = (kRowStep % 8 == 0) ? dst0 + static_cast<uint32_t>(it * kRowStep * Tile::kRowBytes)
                                               : smem_base + Tile::offset(r, c);
      cp_async_16(dst, src, ok);
    }
  } else {
#pragma unroll
    for (int it = 0; it < (kTotal + kThreads - 1) / kThreads; ++it) {
      const int i = it * kThreads + static_cast<int>(threadIdx.x);
      if (kTotal % kThreads != 0 && i >= kTotal) break;
      const int r = i / Tile::kChunks;
      const int c = i % Tile::kChunks;
      const bool ok = r < valid_rows && c * 8 < num_cols;
      const void* src = ok ? reinterpret_cast<const char*>(row_ptr(r)) + c * 16 : any_valid_ptr;
      cp_async_16(smem_base + Tile::offset(r, c), src, ok);
    }
  }
}

/// Per-thread plan for copying Tile-shaped row blocks (Tile: SmemTile or any layout with the same offset/kRowBytes
/// interface whose swizzle depends on row & 7 only, e.g. sm90::PanelTile) of one strided global matrix into shared memory with cp.async:
/// thread i owns chunk column (i % kChunks) and rows row0 + it * kRowStep. Everything that depends only on the thread
/// (row, swizzled destination offset, column validity) is computed once; a copy is then one 64-bit pointer per tile and
/// one pointer increment per 16-byte chunk, instead of recomputing the full address (and a bounds test) per chunk.
template <class Tile, int kThreads>
struct TileCopy {
  /// The per-thread fast path needs whole rows per pass and a row step that keeps the swizzle phase (row & 7) to at
  /// most two values (step a multiple of 4: two precomputed destination offsets); other shapes (head dims 96/192
  /// with these thread counts) use load_tile_async.
  static constexpr bool kFast = kThreads % Tile::kChunks == 0 && (Tile::kRows * Tile::kChunks) % kThreads == 0 &&
                                (kThreads / Tile::kChunks) % 4 == 0;
  static constexpr int kRowStep = kFast ? kThreads / Tile::kChunks : 1;
  static constexpr int kIters = kFast ? Tile::kRows * Tile::kChunks / kThreads : 1;
  static constexpr int kPhases = kRowStep % 8 == 0 ? 1 : 2;  ///< distinct (row & 7) of this thread's rows
  int row0;                   ///< first row of this thread
  uint32_t dst_off[kPhases];  ///< byte offset of (row0 + p * kRowStep, chunk) inside the tile, minus its row part
  int col_bytes;              ///< byte offset of this thread's chunk within a row
  bool col_ok;                ///< chunk < num_cols (else zero-filled: head_dim padding)
  int num_cols;

  __device__ __forceinline__ explicit TileCopy(int num_cols_) : num_cols(num_cols_) {
    const int c = static_cast<int>(threadIdx.x) % Tile::kChunks;
    row0 = static_cast<int>(threadIdx.x) / Tile::kChunks;
#pragma unroll
    for (int ph = 0; ph < kPhases; ++ph)
      dst_off[ph] = Tile::offset(row0 + ph * kRowStep, c) -
                    static_cast<uint32_t>(ph * kRowStep * Tile::kRowBytes);
    col_bytes = c * 16;
    col_ok = c * 8 < num_cols;
  }

  /// Copies rows [0, kRows) of the tile whose row 0 is at `tile_base` (row stride `row_stride` elements) to the
  /// shared tile at `smem_base`. kFull: every row and column exists (no predicates, no address selects); otherwise
  /// rows >= valid_rows and chunks past num_cols are zero-filled and not read.
  template <bool kFull, class T>
  __device__ __forceinline__ void run(uint32_t smem_base, const T* tile_base, int64_t row_stride,
                                      int valid_rows) const {
    if constexpr (!kFast) {
      load_tile_async<Tile, kThreads>(
          smem_base, [&](int r) { return tile_base + r * row_stride; }, valid_rows, num_cols, tile_base);
    } else {
      const char* src = reinterpret_cast<const char*>(tile_base + row0 * row_stride) + col_bytes;
      const int64_t step = static_cast<int64_t>(kRowStep) * row_stride * static_cast<int64_t>(sizeof(T));
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        const uint32_t dst =
            smem_base + dst_off[it % kPhases] + static_cast<uint32_t>(it * kRowStep * Tile::kRowBytes);
        if constexpr (kFull) {
          cp_async_16(dst, src);
        } else {
          const bool ok = col_ok && row0 + it * kRowStep < valid_rows;
          cp_async_16(dst, ok ? static_cast<const void*>(src) : static_cast<const void*>(tile_base), ok);
        }
        src += step;
      }
    }
  }
  /// Same with the full/partial choice made at run time (one warp-uniform branch).
  template <class T>
  __device__ __forceinline__ void copy(uint32_t smem_base, const T* tile_base, int64_t row_stride,
                                       int valid_rows) const {
    if (valid_rows >= Tile::kRows && num_cols >= Tile::kCols) {
      run<true>(smem_base, tile_base, row_stride, valid_rows);
    } else {
      run<false>(smem_base, tile_base, row_stride, valid_rows);
    }
  }
};
}  // namespace flashkv::cuda::attn
