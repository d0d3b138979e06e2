// Forward epilogue, shared by both kernel families (FA3 epilogue_fwd.hpp): one division per row, the natural-log lse,
// and coalesced 16-byte stores of O staged through the warp's own Q rows in shared memory (TileQ: the family's Q tile
// layout, which every warp has finished reading once the last K/V block is done).
//
// A row with no visible key (mask rule) stores out = 0 and lse = -inf; every other row is IEEE (OnlineSoftmax::
// finalize): NaN or +inf scores and non-finite V values of visible keys give non-finite outputs. A row whose O holds a
// non-finite element (a legitimate one, or 0 * inf from a masked key in a boundary tile's P V) is flagged, and
// recomputed exactly afterwards (common/nonfinite.cuh: by its warp, or by the fix-up kernel of a mainloop without the
// in-kernel rare path); rows without non-finite values never take that path. What the common path adds to a plain
// store: one FSETP per O element and one vote per warp (the mask rule is evaluated only for rows with l = 0).
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common/block.cuh"
#include "cuda/common/frag.cuh"
#include "cuda/common/nonfinite.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/params.hpp"

namespace flashkv::cuda::attn {

/// O fragment of a warp that owns 16 * kMT consecutive rows starting at 16 * kMT * warp, all kDT * 8 columns.
/// T: the output type; TIn: the inputs' (q, k, v; the rare path reads them); kStageCols: columns per staging pass.
template <class TileQ, int kMT, int kDT, class T, class TIn = T, int kStageCols = kDT * 8>
struct EpilogueFwd {
  /// Rows of the warp whose O held a non-finite element: ballot per (mt, hh), lane 4g + t set for row g.
  struct Flagged {
    uint32_t ballot[kMT][2];
    bool any;  ///< warp-uniform
  };

  /// Stores the block's out and lse; returns the rows that need recompute_flagged (rare: non-finite inputs).
  template <class Softmax>
  __device__ __forceinline__ static Flagged store(const FwdParams& p, const FwdBlock& blk, char* smem, Frag<kMT, kDT> o,
                                               const Softmax& softmax) {
    // The barrier matters when no K/V block was visible: other threads' cp.async writes of Q may still be in flight.
    cp_async_wait<0>();
    __syncthreads();
    return store_warp(p, blk, smem, o, softmax, threadIdx.x / 32);
  }

  /// The same for one warp, without a barrier: `warp` owns rows [16 * kMT * warp, +16 * kMT) of the block and may
  /// stage them through its own rows of the Q tile (the caller guarantees that nothing reads or writes those rows
  /// meanwhile: the warp-specialized kernel, whose consumer warps finish their tiles at different times).
  template <class Softmax>
  __device__ __forceinline__ static Flagged store_warp(const FwdParams& p, const FwdBlock& blk, char* smem,
                                                    Frag<kMT, kDT> o, const Softmax& softmax, int warp) {
    return store_rows(p, blk, smem, warp * 16 * kMT, o, softmax, warp * 16 * kMT, p.softmax_scale_log2, 1.f);
  }

  /// The general form: the warp's rows are [row0, row0 + 16 * kMT) of the block and are staged at rows
  /// [stage_row0, +16 * kMT) of the staging tile at `smem` (TileQ: kStageCols columns of T; O's kDT * 8 columns go
  /// through it in kDT * 8 / kStageCols passes). scale_log2: the softmax's scale (params.hpp; the FP8 kernels fold
  /// the q/k descales into it); out = O * out_scale / l (the FP8 kernels' v descale).
  template <class Softmax>
  __device__ __forceinline__ static Flagged store_rows(const FwdParams& p, const FwdBlock& blk, char* smem,
                                                    int stage_row0, Frag<kMT, kDT> o, const Softmax& softmax,
                                                    int row0, float scale_log2, float out_scale) {
    constexpr int kPasses = kDT * 8 / kStageCols;
    static_assert(kPasses * kStageCols == kDT * 8 && kStageCols % 8 == 0, "whole staging passes of 8 columns");
    static_assert(TileQ::kChunks == kStageCols / 8, "the staging tile holds one pass");
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int m0 = blk.m0;
    T* og = blk.out<T>(p);
    Flagged fl;
    fl.any = false;
    constexpr int kChunks = kStageCols / 8;
    // Columns [pass * kStageCols, +kStageCols) of the rows (mt, hh) -> the staging rows. An empty row has inv = 0, so
    // a finite O (which is 0 there: every P of it is exp2(-inf) = 0) stores 0; a non-finite one (0 * inf of a masked
    // key) is flagged below and rewritten by the rare path. No per-element select.
    auto stage = [&](int pass, int mt, int hh, float inv) {
      const int r = stage_row0 + mt * 16 + g + 8 * hh;
#pragma unroll
      for (int dt = pass * kChunks; dt < (pass + 1) * kChunks; ++dt) {
        const float a = o(mt, dt, hh, 0) * inv, c = o(mt, dt, hh, 1) * inv;
        *reinterpret_cast<uint32_t*>(smem + TileQ::offset_elem(r, (dt - pass * kChunks) * 8 + 2 * t)) =
            pack2<T>(a, c);
      }
    };
    // The staged rows -> out, 16-byte stores.
    auto copy_out = [&](int pass) {
      __syncwarp();
      for (int idx = lane; idx < 16 * kMT * kChunks; idx += 32) {
        const int rr = idx / kChunks, c = idx % kChunks, r = row0 + rr;
        const int col = pass * kStageCols + c * 8;
        if (m0 + r < blk.si.seqlen_q && col < p.head_dim) {
          const uint4 val = *reinterpret_cast<const uint4*>(smem + TileQ::offset(stage_row0 + rr, c));
          *reinterpret_cast<uint4*>(og + r * p.out_s.row + col) = val;
        }
      }
    };
    // A row without a visible key has l = 0, and so has a row whose visible scores are all -inf (which stays NaN): the
    // mask rule tells them apart, evaluated only in a warp that holds a row with l = 0 (rare).
    float l[kMT][2];
    bool maybe_empty = false;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        l[mt][hh] = softmax.total(mt, hh);
        maybe_empty |= !(l[mt][hh] > 0.f);
      }
    bool empty[kMT][2] = {};
    if (__any_sync(0xffffffffu, maybe_empty)) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          empty[mt][hh] = !(l[mt][hh] > 0.f) && blk.row_empty(m0 + row0 + mt * 16 + g + 8 * hh);
        }
    }
    float inv_keep[kPasses > 1 ? kMT : 1][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        // m0 + (block row), here and in copy_out: written as (m0 + row0) + ..., the same sum moves 3 spill loads into
        // the 255-register sm80 hd256 128 x 128 kernel's hot loop (bench/results/sm80-speed-2026-12-01.md, merge).
        const int i = m0 + (row0 + mt * 16 + g + 8 * hh);
        float inv, lse;
        softmax.finalize(mt, hh, l[mt][hh], scale_log2, empty[mt][hh], inv, lse, out_scale);  // empty: inv = 0
        // Non-finite test: one FSETP (|x| < inf, NaN compares false) per element, accumulated in a predicate.
        bool bad = false;
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt) {
          bad |= !(fabsf(o(mt, dt, hh, 0)) < INFINITY);
          bad |= !(fabsf(o(mt, dt, hh, 1)) < INFINITY);
        }
        fl.ballot[mt][hh] = __ballot_sync(0xffffffffu, bad);
        fl.any |= fl.ballot[mt][hh] != 0u;
        if constexpr (kPasses == 1) {
          stage(0, mt, hh, inv);
        } else {
          inv_keep[mt][hh] = inv;
        }
        if (p.lse != nullptr && t == 0 && i < blk.si.seqlen_q) {
          const int64_t row = (p.cu_seqlens_q != nullptr ? blk.si.q_row0 : 0) + i;
          p.lse[blk.b * p.lse_batch + blk.h * p.lse_head + row * p.lse_row] = lse;
        }
      }
    if constexpr (kPasses == 1) {
      copy_out(0);
    } else {
#pragma unroll
      for (int pass = 0; pass < kPasses; ++pass) {
        if (pass > 0) __syncwarp();  // the previous pass's reads of the staging rows are done
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) stage(pass, mt, hh, inv_keep[mt][hh]);
        copy_out(pass);
      }
    }
    return fl;
  }

  /// The rare path: the flagged rows recomputed exactly by their warp (common/nonfinite.cuh). `blk` is rebuilt by the
  /// caller after store(), so that nothing of it stays live through the mainloop for this path's sake.
  /// qk_descale / v_descale: the FP8 inputs' dequantization factors (1 for 16-bit inputs).
  __device__ __forceinline__ static void recompute_flagged(const FwdParams& p, const FwdBlock& blk, const Flagged& fl,
                                                           int warp = threadIdx.x / 32, float qk_descale = 1.f,
                                                           float v_descale = 1.f) {
    const int lane = threadIdx.x % 32;
    const int warp_row0 = warp * 16 * kMT;
    __syncwarp();  // the fast stores come first
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
        for (int gg = 0; gg < 8; ++gg) {
          if (fl.ballot[mt][hh] & (0xFu << (4 * gg))) {
            recompute_row_exact<TIn, kDT * 8, T>(p, blk, warp_row0 + mt * 16 + gg + 8 * hh, lane, qk_descale,
                                                 v_descale);
          }
        }
  }
};

}  // namespace flashkv::cuda::attn
