// FP8 (e4m3) forward mainloop for Hopper (sm_90a), kernel family sm90ws: the warp-specialized TMA pipeline of
// sm90/mainloop_fwd_tma_ws.cuh with float8_e4m3fn q/k/v, bfloat16 out, and per-(batch, kv head) dequantization
// scales. Same kernel (kernel/fwd_kernel_ws.cuh), scheduler (common/scheduler.cuh FwdLinearTiles), mbarrier rings
// (sm90/pipeline.cuh), online softmax / masks / softcap / epilogue (common/) as the 16-bit mainloop; what differs:
//
// * Both GEMMs are wgmma m64nNk32 .e4m3 (32 keys or head-dim columns per instruction, twice the 16-bit rate), whose
//   operands are K-major only: Q and K (K along head_dim) load as TMA boxes of 128 (hd 64: 64) bytes with the 128-byte
//   (64-byte) swizzle; V must be transposed for P V. The producer is a whole warpgroup (FA3 §3.3): thread 0 issues the
//   TMA copies of Q, K and V, and all 128 threads transpose each V tile into Vt [head_dim][keys] in shared memory
//   (sm90/transpose_v.cuh: ldmatrix.trans + byte permutes + stmatrix, with the key order inside every 32 keys
//   permuted to the order in which the consumers hold P, so that P goes to e4m3 in registers without shuffles).
//   Rings: K (TMA -> consumers), raw V (TMA -> transposer; reused in program order behind a warpgroup barrier) and Vt
//   (transposer -> consumers), each kStages deep.
// * P is exp2(s - m + 8), in [0, 256] (FA3's max offset 8 with conditional rescaling threshold 0, common/softmax.cuh),
//   rounded to e4m3 with cvt.rn.satfinite; the row sums stay in float32 from the unrounded P.
// * Descales: the scores are (q8 . k8) * q_descale * k_descale: the product is folded into the softmax scale (or, with
//   softcap, into the tanh's argument scale); out = (P v8) * v_descale / l in the epilogue. The descales are read per
//   work tile from FwdParams (per tensor = zero strides).
// * O is staged for the coalesced stores through the warpgroup's Q rows in kStageCols-column passes (the e4m3 Q rows
//   hold half the bytes of a bfloat16 O row).
//
// Source: Shah et al., "FlashAttention-3" (2024) §3.3 (FP8: in-kernel V transpose, register permutation of P, block
// quantization and incoherent processing); PTX ISA 8.x wgmma .e4m3, ldmatrix / stmatrix, cvt .e4m3x2.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>

#include "cuda/common/block.cuh"
#include "cuda/common/epilogue_fwd.cuh"
#include "cuda/common/frag.cuh"
#include "cuda/common/mask.cuh"
#include "cuda/common/softmax.cuh"
#include "cuda/params.hpp"
#include "cuda/sm90/mainloop_fwd_tma_ws.cuh"
#include "cuda/sm90/pipeline.cuh"
#include "cuda/sm90/transpose_v.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace flashkv::cuda::sm90 {

/// Four floats -> four e4m3 (round to nearest even, saturating to +-448; NaN stays NaN), `a` in the lowest byte.
__device__ __forceinline__ uint32_t pack4_e4m3(float a, float b, float c, float d) {
  uint32_t r;
  asm("{\n.reg .b16 lo, hi;\ncvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\ncvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
      "mov.b32 %0, {lo, hi};\n}\n"
      : "=r"(r)
      : "f"(a), "f"(b), "f"(c), "f"(d));
  return r;
}

/// The dequantization factors of one work tile (batch b, kv head hk): scale_log2 is the softmax's (the descales
/// folded in unless softcap), score_scale the softcap's tanh argument scale, qk = q_descale * k_descale, v.
struct Fp8Scales {
  float scale_log2, score_scale, qk, v;
};
__device__ __forceinline__ float descale_at(const DescaleView& d, int b, int hk) {
  return d.ptr != nullptr ? d.ptr[b * d.batch + hk * d.head] : 1.f;
}
__device__ __forceinline__ Fp8Scales fp8_scales(const FwdParams& p, int b, int hk) {
  Fp8Scales s;
  s.qk = descale_at(p.q_descale, b, hk) * descale_at(p.k_descale, b, hk);
  s.v = descale_at(p.v_descale, b, hk);
  s.scale_log2 = p.softcap ? p.softmax_scale_log2 : p.softmax_scale_log2 * s.qk;
  s.score_scale = p.score_scale * s.qk;
  return s;
}

/// Compile-time switches of the FP8 mainloop (the A/B variants of bench/gpu/v3; the library uses the defaults):
/// pingpong between the two consumer warpgroups (FA3 turns its scheduler barrier off for FP8 below hd128); how many
/// independent 32-key x 16-column units the V transpose keeps in flight (ldmatrix ... ldmatrix, permutes, stmatrix ...
/// stmatrix: the shared-memory accesses are volatile asm, so the compiler keeps their source order; 2 makes the
/// 24-register producer spill its loop state, so 1 is the default);
/// exp2_emu_eighths: the share of each row's 8-column groups whose exp2 runs on the FMA pipe (common/softmax.cuh);
/// row_max_tree: the softmax's row maxima as interleaved partial maxima instead of one dependent chain per row;
/// hoist_mask_test: which K/V tiles need element masks is decided once per work tile (the fully visible tiles are one
/// contiguous range: core/mask.hpp tile_fully_visible is "k0 >= a and k1 - 1 <= b" and the seqlen_k bound is "k1 <=
/// seqlen_k"), leaving two integer compares per K/V tile instead of FwdBlock::needs_mask's 64-bit bound arithmetic;
/// on by default: although at hd128 / hd256 the two extra live registers make ptxas spill more in the K/V loop (SASS,
/// bench/results/fp8-speed-2026-12-01.md), at hd64 it saves ~60 instructions per loop, and on the H200 it measured
/// faster at every head dim from seqlen 2048 on (run7 call 2, bench/results/h200-2026-12-01-run7: 16k tokens, non-causal,
/// hd64 539 vs 500, hd128 779 vs 693 TFLOP/s; variant "mask_per_tile" of bench/gpu/v3 is the old default).
struct Fp8WsOptions {
  bool pingpong = true;
  int transpose_ilp = 1;
  int exp2_emu_eighths = 0;
  bool row_max_tree = true;
  bool hoist_mask_test = true;
};
/// Options are passed as a class with a `static constexpr Fp8WsOptions value`.
struct DefaultFp8WsOptions {
  static constexpr Fp8WsOptions value{};
};

template <int kHeadDim_, int kBlockN_, int kStages_, bool kSoftcap, class Options = DefaultFp8WsOptions>
struct FwdMainloopTmaWsFp8 {
  using T = __nv_fp8_e4m3;       ///< q, k, v
  using TOut = __nv_bfloat16;    ///< out
  using Params = TmaWsParams;
  static constexpr int kHeadDim = kHeadDim_, kBlockN = kBlockN_, kStages = kStages_;
  static constexpr int kBlockM = 128, kConsumerWGs = 2, kDT = kHeadDim / 8;
  static constexpr bool kCompiled = kSm90aDevice;
  static constexpr bool kExactNonFiniteRows = true;
  static constexpr Fp8WsOptions kOpt = Options::value;
  static constexpr bool kWS = true, kPingpong = kOpt.pingpong;
  static constexpr int kProducerThreads = 128;
  static constexpr int kThreads = kProducerThreads + 128 * kConsumerWGs;
  // The transposing producer keeps all four warps (24 registers, as FA3's); see mainloop_fwd_tma_ws.cuh for the rule.
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  static_assert(128 * (168 - kProducerRegs) >= 256 * (kConsumerRegs - 168), "setmaxnreg would wait forever");
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "one m64nDk32 wgmma for P V");
  static_assert(kBlockN % 32 == 0 && kBlockN <= 256, "P V steps 32 keys; one wgmma for S");
  static_assert(kStages >= 2, "a ring needs two stages");

  static constexpr int kWQ = kHeadDim >= 128 ? 128 : 64;  ///< Q/K/V rows: swizzle width = TMA box bytes
  static constexpr int kWT = 32;  ///< Vt: one 32-byte-swizzled panel per 32 keys (sm90/transpose_v.cuh)
  using TileQh = SwizzledTile8<64, kHeadDim, kWQ>;  ///< one consumer warpgroup's 64 Q rows
  using TileKV = SwizzledTile8<kBlockN, kHeadDim, kWQ>;
  using TileVt = SwizzledTile8<kHeadDim, kBlockN, kWT>;
  /// The epilogue stages O through the warpgroup's own Q rows, the Q half tile read as bfloat16: kHeadDim / 2 columns
  /// per pass, two passes; each warp's staging rows are exactly its Q rows' bytes.
  struct TileStage {
    static constexpr int kCols = kHeadDim / 2, kChunks = kCols / 8;
    __device__ __forceinline__ static uint32_t offset(int row, int chunk) { return TileQh::offset(row, chunk); }
    __device__ __forceinline__ static uint32_t offset_elem(int row, int col) {
      return TileQh::offset(row, col >> 3) + static_cast<uint32_t>((col & 7) * 2);
    }
  };
  static constexpr int kStageCols = TileStage::kCols;
  static constexpr int kQHalfStride = TileQh::kBytes;
  static constexpr int kMaxOffset = 8;
  using Softmax = OnlineSoftmax<1, true, kOpt.exp2_emu_eighths, kMaxOffset, 0, kOpt.row_max_tree>;
  using MmaS = WgmmaTag<kBlockN, T>;
  using MmaO = WgmmaTag<kHeadDim, T>;

  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + 2 * kQHalfStride;
  static constexpr int kOffV = kOffK + kStages * TileKV::kBytes;   // raw V (TMA)
  static constexpr int kOffVt = kOffV + kStages * TileKV::kBytes;  // transposed V (the P V operand)
  static constexpr int kOffBar = kOffVt + kStages * TileVt::kBytes;
  // q_full[2], q_empty[2], k_full[], k_empty[], vt_full[], vt_empty[], v_full[] (raw V landed)
  static constexpr int kNumBars = 4 + 5 * kStages;
  static constexpr int kSmemBytes = kOffBar + kNumBars * 8 + 1024;  // + base alignment
  static constexpr int kEmptyArrivals = 4 * kConsumerWGs;           // lane 0 of every consumer warp
  static constexpr int kBarPingpong = 1;                            // named barriers 1, 2 (0 is __syncthreads)
  static constexpr int kBarTranspose = 3;                           // the producer warpgroup
  static_assert(kSmemBytes <= 227 * 1024, "tile configuration exceeds Hopper's shared memory per block");
  static_assert(kQHalfStride % 1024 == 0 && TileKV::kBytes % 1024 == 0 && TileVt::kBytes % 1024 == 0,
                "every tile starts on a swizzle-atom boundary");

  /// The epilogue: bfloat16 out through the warpgroup's Q rows, descales applied (kernel/fwd_kernel_ws.cuh contract).
  struct Epilogue {
    using Base = EpilogueFwd<TileStage, 1, kDT, TOut, T, kStageCols>;
    using Flagged = typename Base::Flagged;
    template <class Sm>
    __device__ __forceinline__ static Flagged store_warp(const FwdParams& p, const FwdBlock& blk, char* smem,
                                                      Frag<1, kDT> o, const Sm& softmax, int warp) {
      const Fp8Scales sc = fp8_scales(p, blk.b, blk.hk);
      return Base::store_rows(p, blk, smem + (warp / 4) * kQHalfStride, 16 * (warp % 4), o, softmax, 16 * warp,
                              sc.scale_log2, sc.v);
    }
    __device__ __forceinline__ static void recompute_flagged(const FwdParams& p, const FwdBlock& blk,
                                                             const Flagged& fl, int warp) {
      const Fp8Scales sc = fp8_scales(p, blk.b, blk.hk);
      Base::recompute_flagged(p, blk, fl, warp, sc.qk, sc.v);
    }
  };

  struct Accum {
    float o_[kHeadDim / 2];
    Softmax softmax;
    __device__ __forceinline__ Frag<1, kDT> o() { return frag(o_); }
  };

  uint32_t base;
  __device__ __forceinline__ explicit FwdMainloopTmaWsFp8(uint32_t smem_base) : base(smem_base) {}
  __device__ __forceinline__ static char* shared_memory() {
    extern __shared__ __align__(1024) char smem_raw[];
    const uint32_t raw = smem_addr(smem_raw);
    return smem_raw + (((raw + 1023u) & ~1023u) - raw);
  }
  __device__ __forceinline__ static void producer_enter() { setmaxnreg_dec<kProducerRegs>(); }
  __device__ __forceinline__ static void consumer_enter() { setmaxnreg_inc<kConsumerRegs>(); }
  /// Every producer thread stays: the warpgroup transposes V (thread 0 alone issues the TMA copies).
  __device__ __forceinline__ static bool producer_issues() { return true; }

  __device__ __forceinline__ uint32_t sQ(int w) const { return base + kOffQ + w * kQHalfStride; }
  __device__ __forceinline__ uint32_t sK(int st) const { return base + kOffK + st * TileKV::kBytes; }
  __device__ __forceinline__ uint32_t sV(int st) const { return base + kOffV + st * TileKV::kBytes; }
  __device__ __forceinline__ uint32_t sVt(int st) const { return base + kOffVt + st * TileVt::kBytes; }
  __device__ __forceinline__ uint32_t bar(int i) const { return base + kOffBar + 8 * i; }
  __device__ __forceinline__ uint32_t bar_q_full(int w) const { return bar(w); }
  __device__ __forceinline__ uint32_t bar_q_empty(int w) const { return bar(2 + w); }
  __device__ __forceinline__ uint32_t bar_k_full(int st) const { return bar(4 + st); }
  __device__ __forceinline__ uint32_t bar_k_empty(int st) const { return bar(4 + kStages + st); }
  __device__ __forceinline__ uint32_t bar_vt_full(int st) const { return bar(4 + 2 * kStages + st); }
  __device__ __forceinline__ uint32_t bar_vt_empty(int st) const { return bar(4 + 3 * kStages + st); }
  __device__ __forceinline__ uint32_t bar_v_full(int st) const { return bar(4 + 4 * kStages + st); }

  __device__ __forceinline__ void init(const Params& mp) const {
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      mbar_init(bar_q_full(w), 1);
      mbar_init(bar_q_empty(w), 4);
    }
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      mbar_init(bar_k_full(st), 1);
      mbar_init(bar_v_full(st), 1);
      mbar_init(bar_vt_full(st), 1);
      mbar_init(bar_k_empty(st), kEmptyArrivals);
      mbar_init(bar_vt_empty(st), kEmptyArrivals);
    }
    fence_barrier_init();
    prefetch_tensormap(&mp.tma_q);
    if (mp.p.total_k > 0) {
      prefetch_tensormap(&mp.tma_k);
      prefetch_tensormap(&mp.tma_v);
    }
  }

  /// Consumer ring positions (K, Vt, Q), carried across work tiles.
  struct Pipes {
    PipeState<kStages> ks{}, vs{};
    uint32_t q_phase = 0;
  };

  // ---- producer (all 128 threads; thread 0 issues the copies) --------------------------------------------------
  // Per work tile with T visible K/V tiles: K_0, Q, V_0; then for j = 1 .. T-1: K_j, V_j and the transpose of
  // V_{j-1}; then the transpose of V_{T-1}. The consumers need K_j before Vt_{j-1} (S_j is issued first).
  struct Producer {
    const FwdMainloopTmaWsFp8& ml;
    const Params& mp;
    // Ring positions as counts of K/V tiles (stage = count % kStages, parity = count / kStages & 1), kept small for
    // the 24-register producer: tiles issued (K and raw V in lockstep, thread 0) and tiles transposed (all threads).
    uint32_t issued = 0, transposed = 0, q_phase = 0;

    __device__ __forceinline__ Producer(const FwdMainloopTmaWsFp8& m, const Params& p) : ml(m), mp(p) {}

    __device__ __forceinline__ static int stage(uint32_t n) { return static_cast<int>(n % kStages); }
    __device__ __forceinline__ static uint32_t parity(uint32_t n) { return (n / kStages) & 1u; }
    __device__ __forceinline__ void tile_tma(const CUtensorMap* map, uint32_t dst, uint32_t bar, uint32_t bytes,
                                             int row, int head, int bc, uint32_t panel_bytes, int panels) const {
      mbar_arrive_expect_tx(bar, bytes);
      for (int pnl = 0; pnl < panels; ++pnl) tma_load_4d(dst + pnl * panel_bytes, map, bar, pnl * kWQ, row, head, bc);
    }
    /// Thread 0: K and raw V of the tile at key row `row` (raw V's stage is free in program order: the warpgroup
    /// barrier after the transpose kStages - 1 tiles ago).
    __device__ __forceinline__ void load_kv(int row, int hk, int bc) {
      const int st = stage(issued);
      mbar_wait(ml.bar_k_empty(st), parity(issued) ^ 1u);
      tile_tma(&mp.tma_k, ml.sK(st), ml.bar_k_full(st), TileKV::kBytes, row, hk, bc, TileKV::kPanelBytes,
               TileKV::kPanels);
      tile_tma(&mp.tma_v, ml.sV(st), ml.bar_v_full(st), TileKV::kBytes, row, hk, bc, TileKV::kPanelBytes,
               TileKV::kPanels);
      ++issued;
    }
    /// All 128 threads: raw V of the next tile in order -> its Vt stage, then published to the consumers.
    __device__ __forceinline__ void transpose() {
      const int st = stage(transposed);
      mbar_wait(ml.bar_v_full(st), parity(transposed));
      mbar_wait(ml.bar_vt_empty(st), parity(transposed) ^ 1u);
      __syncwarp();  // ldmatrix / stmatrix are .aligned: the lanes leave their waits together
      transpose_v_tile<TileKV, TileVt, kOpt.transpose_ilp>(ml.sV(st), ml.sVt(st));
      fence_proxy_async();  // the generic-proxy stores become visible to the consumers' wgmma (async proxy)
      named_bar_sync(kBarTranspose, 128);
      if (threadIdx.x == 0) mbar_arrive(ml.bar_vt_full(st));
      ++transposed;
    }
    __device__ __forceinline__ void run(const FwdBlock& b) {
      const int num_kv = b.n_max - b.n_min;
      const int bc = mp.p.cu_seqlens_q != nullptr ? 0 : b.b;
      const int hk = b.hk;
      const int k_last = static_cast<int>(b.si.k_row0) + (b.n_max - 1) * kBlockN;  // key row of tile 0
      if (threadIdx.x == 0) {
        if (num_kv > 0) {  // K_0, Q, V_0 (the K tile first, as the 16-bit mainloop)
          const int st = stage(issued);
          mbar_wait(ml.bar_k_empty(st), parity(issued) ^ 1u);
          tile_tma(&mp.tma_k, ml.sK(st), ml.bar_k_full(st), TileKV::kBytes, k_last, hk, bc, TileKV::kPanelBytes,
                   TileKV::kPanels);
        }
        const int q_row = static_cast<int>(b.si.q_row0) + b.m0;
#pragma unroll
        for (int w = 0; w < 2; ++w) {
          mbar_wait(ml.bar_q_empty(w), q_phase ^ 1u);
          tile_tma(&mp.tma_q, ml.sQ(w), ml.bar_q_full(w), TileQh::kBytes, q_row + 64 * w, b.h, bc,
                   TileQh::kPanelBytes, TileQh::kPanels);
        }
        if (num_kv > 0) {
          const int st = stage(issued);
          tile_tma(&mp.tma_v, ml.sV(st), ml.bar_v_full(st), TileKV::kBytes, k_last, hk, bc, TileKV::kPanelBytes,
                   TileKV::kPanels);
          ++issued;
        }
      }
      q_phase ^= 1u;
      if (num_kv > 0) issued = transposed + 1;  // every thread's copy (thread 0's is already this)
      __syncwarp();
      for (int j = 1; j < num_kv; ++j) {
        if (threadIdx.x == 0) load_kv(k_last - j * kBlockN, hk, bc);
        __syncwarp();
        transpose();
      }
      if (num_kv > 0) transpose();
      issued = transposed;
    }
  };

  __device__ __forceinline__ void produce(Producer& pr, const FwdBlock& blk) const { pr.run(blk); }

  // ---- consumers ----------------------------------------------------------------------------------------------
  __device__ __forceinline__ static void consumers_begin(int ctid) {
    if constexpr (kPingpong) {
      if (ctid >= 128) named_bar_arrive(kBarPingpong + 0, 256);  // warpgroup 0 issues first
    }
  }
  __device__ __forceinline__ static void consumers_end(int ctid) {
    if constexpr (kPingpong) {
      if (ctid < 128) named_bar_sync(kBarPingpong + 0, 256);
    }
  }
  __device__ __forceinline__ static char* q_tile(char* smem) { return smem + kOffQ; }
  __device__ __forceinline__ void release_q(Pipes& pipes, int ctid) const {
    fence_proxy_async();
    if (ctid % 32 == 0) mbar_arrive(bar_q_empty(ctid / 128));
    pipes.q_phase ^= 1u;
  }

  /// Consumer thread ctid in [0, 256) over the visible K/V tiles of one work tile (the 16-bit mainloop's
  /// intra-warpgroup overlap and pingpong schedule); leaves the unnormalized O and the row state in `acc`.
  __device__ __forceinline__ void mma(const Params& mp, const FwdBlock& blk, int ctid, Accum& acc, Pipes& pipes,
                                      Producer&) const {
    const FwdParams& p = mp.p;
    const int wg = ctid / 128, warp = (ctid / 32) % 4, lane = ctid % 32;
    const int g = lane / 4, t = lane % 4;
    const int m_row = blk.m0 + 64 * wg + 16 * warp;
    const int num_tiles = blk.n_max - blk.n_min;
    const Fp8Scales sc = fp8_scales(p, blk.b, blk.hk);
    zero(acc.o());
    acc.softmax.init();
    mbar_wait(bar_q_full(wg), pipes.q_phase);
    if (num_tiles <= 0) return;

    const uint64_t dQ = desc_kmajor_sw<kWQ>(sQ(wg));
    const uint64_t dK0 = desc_kmajor_sw<kWQ>(sK(0));
    const uint64_t dVt0 = desc_kmajor_sw<kWT>(sVt(0));
    constexpr uint64_t kStageDescK = TileKV::kBytes >> 4, kStageDescVt = TileVt::kBytes >> 4;

    float s[kBlockN / 2];
    uint32_t pa[kBlockN / 32][4];
    PipeState<kStages>& ks = pipes.ks;
    PipeState<kStages>& vs = pipes.vs;

    auto issue_s = [&](int st) {
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 32; ++kk) {
        wgmma_ss_fp8(MmaS{}, s, dQ + (TileQh::k_offset(32 * kk) >> 4),
                     dK0 + st * kStageDescK + (TileKV::k_offset(32 * kk) >> 4), kk > 0 ? 1 : 0);
      }
      wgmma_commit();
    };
    auto issue_pv = [&](int st) {
      fence_operands(acc.o_);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockN / 32; ++kk) {
        wgmma_rs_fp8(MmaO{}, acc.o_, pa[kk], dVt0 + st * kStageDescVt + (TileVt::k_offset(32 * kk) >> 4), 1);
      }
      wgmma_commit();
    };
    auto pp_sync = [&] {
      if constexpr (kPingpong) named_bar_sync(kBarPingpong + wg, 256);
    };
    auto pp_arrive = [&] {
      if constexpr (kPingpong) named_bar_arrive(kBarPingpong + (wg ^ 1), 256);
    };
    auto release = [&](uint32_t b) {
      if (lane == 0) mbar_arrive(b);
    };
    // Fully visible K/V tiles: [unmasked_lo, unmasked_hi] (empty when lo > hi), found from both ends of the range.
    int unmasked_hi = blk.n_max - 1, unmasked_lo = blk.n_min;
    if constexpr (kOpt.hoist_mask_test) {
      while (unmasked_hi >= blk.n_min && blk.needs_mask<kBlockN>(unmasked_hi)) --unmasked_hi;
      while (unmasked_lo <= unmasked_hi && blk.needs_mask<kBlockN>(unmasked_lo)) ++unmasked_lo;
    }
    auto needs_mask = [&](int n) {
      if constexpr (kOpt.hoist_mask_test) {
        return n > unmasked_hi || n < unmasked_lo;
      } else {
        return blk.needs_mask<kBlockN>(n);
      }
    };
    auto softmax = [&](int n, float (&corr)[1][2]) {
      if constexpr (kSoftcap) apply_softcap(frag(s), sc.score_scale);
      if (needs_mask(n)) {
        apply_mask(frag(s), blk.rule, m_row, n * kBlockN, g, t);
        return acc.softmax.update(frag(s), sc.scale_log2, corr);
      }
      return acc.softmax.update(frag(s), sc.scale_log2, corr);
    };
    // P (accumulator order: keys 8n + 2t + e of rows g, g + 8) -> the k32 A fragment in Vt's permuted key order
    // (sm90/transpose_v.cuh): register r of group kk holds row g + 8 (r & 1), keys 32kk + 16 (r >> 1) + {2t, 2t + 1,
    // 8 + 2t, 9 + 2t}.
    auto convert_p = [&] {
#pragma unroll
      for (int kk = 0; kk < kBlockN / 32; ++kk) {
        const float* d = s + 16 * kk;
        pa[kk][0] = pack4_e4m3(d[0], d[1], d[4], d[5]);
        pa[kk][1] = pack4_e4m3(d[2], d[3], d[6], d[7]);
        pa[kk][2] = pack4_e4m3(d[8], d[9], d[12], d[13]);
        pa[kk][3] = pack4_e4m3(d[10], d[11], d[14], d[15]);
      }
    };
    auto fence_pa = [&] {
#pragma unroll
      for (int kk = 0; kk < kBlockN / 32; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(pa[kk][r])::"memory");
    };
    auto wait_s = [&] {
      fence_operands(s);
      release(bar_k_empty(ks.index));
      ks.advance();
    };
    auto wait_pv = [&] {
      fence_operands(acc.o_);
      fence_pa();
      release(bar_vt_empty(vs.index));
      vs.advance();
    };

    float corr[1][2];
    // Tile 0: S only (O is zero: no rescale).
    mbar_wait(bar_k_full(ks.index), ks.phase);
    pp_sync();
    issue_s(ks.index);
    pp_arrive();
    wgmma_wait<0>();
    wait_s();
    softmax(blk.n_max - 1, corr);
    convert_p();
    bool rescale = false;  // O is zero: nothing to rescale before the first P V
    for (int i = 1; i < num_tiles; ++i) {
      const int n = blk.n_max - 1 - i;
      mbar_wait(bar_k_full(ks.index), ks.phase);
      mbar_wait(bar_vt_full(vs.index), vs.phase);
      pp_sync();
      issue_s(ks.index);
      acc.softmax.rescale(acc.o(), corr, rescale);  // under the S GEMM: O moves to the scale of P_{i-1}
      issue_pv(vs.index);
      pp_arrive();
      wgmma_wait<1>();  // S_i landed; P_{i-1} V_{i-1} may still run
      wait_s();
      rescale = softmax(n, corr);
      wgmma_wait<0>();
      wait_pv();
      convert_p();
    }
    mbar_wait(bar_vt_full(vs.index), vs.phase);
    pp_sync();
    acc.softmax.rescale(acc.o(), corr, rescale);
    issue_pv(vs.index);
    pp_arrive();
    wgmma_wait<0>();
    wait_pv();
  }
};

}  // namespace flashkv::cuda::sm90
