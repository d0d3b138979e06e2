// FlashAttention forward mainloop for Hopper (sm_90a): TMA loads + wgmma, warp-specialized (FlashAttention-3).
//
// Source: Shah et al., "FlashAttention-3: Fast and Accurate Attention with Asynchrony and Low-precision", 2024:
//   §3.1 producer/consumer warp specialization: one producer warp issues TMA copies of Q (once) and of K/V tiles
//        into a kStages-deep circular buffer guarded by full/empty mbarriers; two consumer warpgroups (64 query rows
//        each, 128 rows per CTA) run wgmma; `setmaxnreg` moves registers from the producer (24) to them (240);
//        "pingpong": named barriers order the two consumer warpgroups' GEMM issue so that one's softmax runs while
//        the other's GEMMs occupy the tensor cores;
//   §3.2 intra-warpgroup overlap: S_j = Q K_j^T is issued together with O += P_{j-1} V_{j-1}, and the softmax of S_j
//        runs while the P V GEMM executes; O is rescaled after that GEMM completes;
// on the FlashAttention-2 algorithm (online softmax, one final division) with FlashAttention-4's conditional rescaling
// and partial software exp2 (softmax_ws.cuh). P stays in registers as the A operand of P V (no shared memory trip).
//
// Every optimization is a compile-time switch in TmaWsOptions, so the ablation of FA3 §4.2 (each one off in turn)
// runs the same code: tma=false loads with cp.async from a 128-thread producer warpgroup; warp_specialized=false
// drops the producer warpgroup (a consumer thread issues the TMA copies one tile ahead, 256 threads, no setmaxnreg,
// no pingpong); pingpong=false lets the warpgroups issue freely; intra_overlap=false runs S, softmax, P V in order.
//
// Shared memory (from a 1024-byte aligned base): Q [128 x D] | K stages [kStages x kBlockN x D] | V stages | mbarriers.
// Tiles are sm90::PanelTile panels (64 columns x rows, 128-byte swizzle): one TMA box per panel, the layout the
// wgmma descriptors read (K-major Q and K, MN-major V).
#pragma once

#include <cuda.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/mask.hpp"
#include "cuda/params.hpp"
#include "cuda/sm90/pipeline.cuh"
#include "cuda/sm90/softmax_ws.cuh"
#include "cuda/sm90/wgmma.cuh"
#include "cuda/sm90/wgmma_ws_ops.cuh"

namespace flashkv::cuda::sm90 {

/// Compile-time switches of the TMA warp-specialized forward (defaults = the full kernel).
struct TmaWsOptions {
  bool tma = true;               ///< TMA copies (else cp.async by a producer warpgroup)
  bool warp_specialized = true;  ///< producer warpgroup + setmaxnreg (else consumers issue the copies)
  bool pingpong = true;          ///< named-barrier ordering of the two consumer warpgroups' GEMMs
  bool intra_overlap = true;     ///< S_{j} GEMM and P_{j-1} V GEMM in flight during softmax(S_j)
  int exp2_emu_eighths = 0;      ///< share of exponentials on the FMA pipe, in eighths (0 = all on MUFU)
  bool cond_rescale = true;      ///< FA4 conditional rescaling (else O is rescaled every tile)
  bool defer_rescale = true;     ///< rescale O after issuing the next S GEMM, under it (FA3), not before
  bool smem_epilogue = true;     ///< stage O through the Q tile for 16-byte stores (the Q reload waits for it);
                                 ///< false: 4-byte stores from registers (measured 2-6% slower on the H200)
};

/// Kernel parameters: the forward parameter block, the tensor maps of Q, K, V (passed as __grid_constant__), and the
/// tile space the CTAs stride over (query blocks fastest, last block first; a CTA takes blockIdx.x + i * gridDim.x).
struct TmaWsParams {
  FwdParams p;
  CUtensorMap tma_q;
  CUtensorMap tma_k;
  CUtensorMap tma_v;
  int num_m_blocks = 0;
  int num_tiles = 0;
};

/// The (query block, head, batch) of one work tile and the K/V tiles [n_min, n_max) its rows can see.
struct WsBlock {
  int m_block, h, b, hk, m0;
  int n_min, n_max;
  core::MaskRule rule;
  __device__ __forceinline__ int num_kv() const { return n_max - n_min; }
};

template <int kHeadDim_, int kBlockN_, int kStages_, class T_, TmaWsOptions kOpt_>
struct MainloopFwdTmaWs {
  using T = T_;
  static constexpr TmaWsOptions kOpt = kOpt_;
  static constexpr int kHeadDim = kHeadDim_, kBlockN = kBlockN_, kStages = kStages_;
  static constexpr int kBlockM = 128, kConsumerWGs = 2;
  static constexpr bool kWS = kOpt.warp_specialized;
  static constexpr bool kPingpong = kOpt.pingpong && kWS;
  static constexpr int kProducerThreads = kWS ? 128 : 0;
  static constexpr int kThreads = kProducerThreads + 128 * kConsumerWGs;
  // setmaxnreg moves registers inside the 168/thread the launch allocates (65536 / 384, rounded down to 8): the
  // consumers' increase must be covered by the producer's decrease, 128 * (168 - P) >= 256 * (C - 168).
  static constexpr int kProducerRegs = kOpt.tma ? 24 : 40;
  static constexpr int kConsumerRegs = kOpt.tma ? 240 : 232;
  static_assert(128 * (168 - kProducerRegs) >= 256 * (kConsumerRegs - 168), "setmaxnreg would wait forever");
  static_assert(kOpt.tma || kWS, "the cp.async producer is a warpgroup of its own");
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "one m64nDk16 wgmma for P V");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "P V steps 16 keys; one wgmma for S");
  static_assert(kStages >= 2, "a ring needs two stages");

  using TileQ = PanelTile<kBlockM, kHeadDim>;
  using TileKV = PanelTile<kBlockN, kHeadDim>;
  using Softmax = OnlineSoftmaxWs<kBlockN, kOpt.cond_rescale, kOpt.exp2_emu_eighths>;
  static constexpr int kPanels = kHeadDim / 64;
  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + TileQ::kBytes;
  static constexpr int kOffV = kOffK + kStages * TileKV::kBytes;
  static constexpr int kOffBar = kOffV + kStages * TileKV::kBytes;
  static constexpr int kNumBars = 4 + 4 * kStages;  // q_full[2], q_empty[2], k_full[], k_empty[], v_full[], v_empty[]
  static constexpr int kSmemBytes = kOffBar + kNumBars * 8 + 1024;  // + base alignment
  static constexpr int kFullArrivals = kOpt.tma ? 1 : 128;          // TMA: the expect_tx arrival; cp.async: every thread
  static constexpr int kEmptyArrivals = 4 * kConsumerWGs;           // lane 0 of every consumer warp
  static constexpr int kQHalfBytes = TileQ::kBytes / 2;             // one consumer warpgroup's 64 rows
  static constexpr int kBarPingpong = 1;                            // named barriers 1, 2 (0 is __syncthreads)
  static_assert(kSmemBytes <= 227 * 1024, "tile configuration exceeds Hopper's shared memory per block");

  // ---- shared-memory addresses --------------------------------------------------------------------------------
  uint32_t base;
  __device__ __forceinline__ explicit MainloopFwdTmaWs(uint32_t smem_base) : base(smem_base) {}
  __device__ __forceinline__ uint32_t sQ() const { return base + kOffQ; }
  __device__ __forceinline__ uint32_t sK(int st) const { return base + kOffK + st * TileKV::kBytes; }
  __device__ __forceinline__ uint32_t sV(int st) const { return base + kOffV + st * TileKV::kBytes; }
  __device__ __forceinline__ uint32_t bar(int i) const { return base + kOffBar + 8 * i; }
  /// Q is two halves, one per consumer warpgroup (rows 64w .. 64w + 63 of every panel), each with its own
  /// full/empty pair, so a warpgroup's next Q loads as soon as its own last S GEMM of the tile is done.
  __device__ __forceinline__ uint32_t bar_q_full(int w) const { return bar(w); }
  __device__ __forceinline__ uint32_t bar_q_empty(int w) const { return bar(2 + w); }
  __device__ __forceinline__ uint32_t bar_k_full(int st) const { return bar(4 + st); }
  __device__ __forceinline__ uint32_t bar_k_empty(int st) const { return bar(4 + kStages + st); }
  __device__ __forceinline__ uint32_t bar_v_full(int st) const { return bar(4 + 2 * kStages + st); }
  __device__ __forceinline__ uint32_t bar_v_empty(int st) const { return bar(4 + 3 * kStages + st); }

  /// One thread, before the CTA barrier that precedes any use.
  __device__ __forceinline__ void init_barriers(const TmaWsParams& tp) const {
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      mbar_init(bar_q_full(w), kFullArrivals);
      mbar_init(bar_q_empty(w), 4);  // the warpgroup's four warps
    }
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      mbar_init(bar_k_full(st), kFullArrivals);
      mbar_init(bar_v_full(st), kFullArrivals);
      mbar_init(bar_k_empty(st), kEmptyArrivals);
      mbar_init(bar_v_empty(st), kEmptyArrivals);
    }
    fence_barrier_init();
    if constexpr (kOpt.tma) {
      prefetch_tensormap(&tp.tma_q);
      prefetch_tensormap(&tp.tma_k);
      prefetch_tensormap(&tp.tma_v);
    }
  }

  /// Ring positions (K ring, V ring, Q buffer); the producer and every consumer thread keep their own copy, carried
  /// from one work tile to the next.
  struct Pipes {
    PipeState<kStages> ks{}, vs{};
    uint32_t q_phase = 0;
  };

  // ---- producer -----------------------------------------------------------------------------------------------
  // Load order (items) of a work tile: K_0, Q (two halves), then K_j, V_{j-1} for j = 1 .. T-1, then V_{T-1}: the consumers need
  // K_j before V_{j-1} (intra-warpgroup overlap issues S_j first). K and V have separate rings so a K stage is
  // released as soon as its S GEMM completes; Q is reloaded once the consumers released the previous tile's.
  struct Producer {
    const MainloopFwdTmaWs& ml;
    const TmaWsParams& tp;
    Pipes pipes{};
    const WsBlock* blk = nullptr;
    int num_tiles = 0;
    int next = 0;
    uint32_t pending = 0;  // cp.async: full barrier of the last issued copy group, arrived once that group landed

    __device__ __forceinline__ Producer(const MainloopFwdTmaWs& m, const TmaWsParams& p) : ml(m), tp(p) {}

    __device__ __forceinline__ void tile_tma(const CUtensorMap* map, uint32_t dst, uint32_t bar, uint32_t bytes,
                                             int row, int head, uint32_t panel_bytes) const {
      mbar_arrive_expect_tx(bar, bytes);
#pragma unroll
      for (int pnl = 0; pnl < kPanels; ++pnl)
        tma_load_4d(dst + pnl * panel_bytes, map, bar, pnl * 64, row, head, blk->b);
    }
    /// Rows [row0, row0 + kRows) of a Tile-layout buffer at dst from global rows src[0 .. kRows).
    template <class Tile, int kRows>
    __device__ __forceinline__ void tile_cpasync(uint32_t dst, int row0, const T* src, int64_t row_stride,
                                                 int valid_rows, uint32_t bar) {
      constexpr int kChunksPerRow = kHeadDim / 8, kTotal = kRows * kChunksPerRow;
      const int tid = static_cast<int>(threadIdx.x);  // 0..127: the producer warpgroup
#pragma unroll 4
      for (int i = tid; i < kTotal; i += 128) {
        const int r = i / kChunksPerRow, c = i % kChunksPerRow;
        const bool ok = r < valid_rows && c * 8 < tp.p.head_dim;
        cp_async_16_zfill(dst + Tile::offset(row0 + r, c), ok ? src + r * row_stride + c * 8 : src, ok);
      }
      cp_async_commit_group();
      land_pending<1>();
      pending = bar;
    }
    /// cp.async: the group before the newest has landed; publish it to the async proxy, then arrive.
    template <int kInFlight>
    __device__ __forceinline__ void land_pending() {
      if (pending == 0) return;
      cp_async_wait_group<kInFlight>();
      fence_proxy_async();
      mbar_arrive(pending);
      pending = 0;
    }

    __device__ __forceinline__ void load_q() {
#pragma unroll
      for (int w = 0; w < 2; ++w) {
        mbar_wait(ml.bar_q_empty(w), pipes.q_phase ^ 1u);
        const uint32_t dst = ml.sQ() + w * 64 * 128;
        if constexpr (kOpt.tma) {
          tile_tma(&tp.tma_q, dst, ml.bar_q_full(w), kQHalfBytes, blk->m0 + 64 * w, blk->h, TileQ::kPanelBytes);
        } else {
          const T* q = static_cast<const T*>(tp.p.q) + blk->b * tp.p.q_s.batch +
                       int64_t(blk->m0 + 64 * w) * tp.p.q_s.row + blk->h * tp.p.q_s.head;
          tile_cpasync<TileQ, 64>(ml.sQ(), 64 * w, q, tp.p.q_s.row, tp.p.seqlen_q - blk->m0 - 64 * w,
                                  ml.bar_q_full(w));
        }
      }
      pipes.q_phase ^= 1u;
    }
    __device__ __forceinline__ void load_kv(bool is_v, int tile) {
      PipeState<kStages>& st = is_v ? pipes.vs : pipes.ks;
      const int n = blk->n_max - 1 - tile;
      mbar_wait(is_v ? ml.bar_v_empty(st.index) : ml.bar_k_empty(st.index), st.phase ^ 1u);
      const uint32_t dst = is_v ? ml.sV(st.index) : ml.sK(st.index);
      const uint32_t bar = is_v ? ml.bar_v_full(st.index) : ml.bar_k_full(st.index);
      if constexpr (kOpt.tma) {
        tile_tma(is_v ? &tp.tma_v : &tp.tma_k, dst, bar, TileKV::kBytes, n * kBlockN, blk->hk, TileKV::kPanelBytes);
      } else {
        const TensorStrides& s = is_v ? tp.p.v_s : tp.p.k_s;
        const T* g = static_cast<const T*>(is_v ? tp.p.v : tp.p.k) + blk->b * s.batch +
                     int64_t(n) * kBlockN * s.row + blk->hk * s.head;
        tile_cpasync<TileKV, kBlockN>(dst, 0, g, s.row, tp.p.seqlen_k - n * kBlockN, bar);
      }
      st.advance();
    }
    /// Item 0 is K_0 followed by Q; the rest as above.
    __device__ __forceinline__ void issue(int item) {
      if (item == 0) {
        load_kv(false, 0);
        load_q();
      } else if (item == 2 * num_tiles - 1) {
        load_kv(true, num_tiles - 1);
      } else if (item & 1) {
        load_kv(false, (item + 1) / 2);
      } else {
        load_kv(true, item / 2 - 1);
      }
    }
    __device__ __forceinline__ void begin(const WsBlock& b) {
      blk = &b;
      num_tiles = b.num_kv();
      next = 0;
    }
    /// Issues the current work tile's items up to and including `last` (clipped to the tile's sequence).
    __device__ __forceinline__ void issue_upto(int last) {
      last = last < 2 * num_tiles - 1 ? last : 2 * num_tiles - 1;
      for (; next <= last; ++next) issue(next);
      if constexpr (!kOpt.tma) {
        if (next == 2 * num_tiles) land_pending<0>();  // the tile's last group lands before the next tile starts
      }
    }
  };

  /// Warp-specialized producer, one work tile (one elected thread for TMA, the warpgroup for cp.async).
  __device__ __forceinline__ void produce(Producer& pr, const WsBlock& blk) const {
    if (blk.num_kv() <= 0) return;
    pr.begin(blk);
    pr.issue_upto(2 * blk.num_kv() - 1);
  }

  // ---- consumers ----------------------------------------------------------------------------------------------
  /// Pingpong start / end, once per CTA (the chain of named-barrier turns runs across work tiles).
  __device__ __forceinline__ static void pingpong_begin(int ctid) {
    if constexpr (kPingpong) {
      if (ctid >= 128) named_bar_arrive(kBarPingpong + 0, 256);  // warpgroup 0 issues first
    }
  }
  __device__ __forceinline__ static void pingpong_end(int ctid) {
    if constexpr (kPingpong) {
      if (ctid < 128) named_bar_sync(kBarPingpong + 0, 256);  // consume warpgroup 1's last arrival
    }
  }
  /// A consumer warp releases its warpgroup's Q half of the current work tile (its reads of it are done).
  __device__ __forceinline__ void release_q(Pipes& pipes, int ctid) const {
    if (ctid % 32 == 0) mbar_arrive(bar_q_empty(ctid / 128));
    pipes.q_phase ^= 1u;
  }

  /// Runs consumer thread ctid in [0, 256) (warpgroup ctid / 128) over the visible K/V tiles of one work tile;
  /// leaves the unnormalized O in `o` and the row state in `sm`. `pr` issues the copies when not warp-specialized.
  __device__ __forceinline__ void mma(const TmaWsParams& tp, const WsBlock& blk, int ctid, float (&o)[kHeadDim / 2],
                                      Softmax& sm, Pipes& pipes, Producer& pr) const {
    const FwdParams& p = tp.p;
    const int wg = ctid / 128, warp = (ctid / 32) % 4, lane = ctid % 32;
    const int g = lane / 4, t = lane % 4;
    const int row_in_block = 64 * wg + 16 * warp + g;  // + 8*hh
    const int num_tiles = blk.num_kv();
    const float scale_log2 = p.softmax_scale_log2;
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) o[i] = 0.f;
    if (num_tiles <= 0) return;

    // No warp specialization: thread 0 issues the copies, kStages - 1 tiles ahead.
    auto produce_ahead = [&](int tile) {
      if constexpr (!kWS) {
        if (ctid == 0) {
          if (tile == 0) pr.begin(blk);
          pr.issue_upto(2 * (tile + kStages - 1));
        }
        __syncwarp();
      }
    };

    const uint64_t dQ = desc_kmajor(sQ() + 64 * wg * 128);
    const uint64_t dK0 = desc_kmajor(sK(0));
    const uint64_t dV0 = desc_mnmajor(sV(0), TileKV::kPanelBytes);
    constexpr uint64_t kStageDesc = TileKV::kBytes >> 4;

    float s[kBlockN / 2];
    uint32_t pa[kBlockN / 16][4];
    PipeState<kStages>& ks = pipes.ks;
    PipeState<kStages>& vs = pipes.vs;

    auto issue_s = [&](int st) {
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        const uint64_t qo = ((kk / 4) * TileQ::kPanelBytes + (kk % 4) * 32) >> 4;
        const uint64_t ko = ((kk / 4) * TileKV::kPanelBytes + (kk % 4) * 32) >> 4;
        Wgmma<kBlockN, T>::ss(s, dQ + qo, dK0 + st * kStageDesc + ko, kk > 0 ? 1 : 0);
      }
      wgmma_commit();
    };
    auto issue_pv = [&](int st) {
      fence_operands(o);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        const uint64_t vo = (kk * 16 * 128) >> 4;  // 16 key rows of every panel
        Wgmma<kHeadDim, T>::rs(o, pa[kk], dV0 + st * kStageDesc + vo, 1);
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
    auto apply_mask = [&](int n) {
      const int n0 = n * kBlockN;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int64_t i = blk.m0 + row_in_block + 8 * hh;
        const int lo = static_cast<int>(blk.rule.row_first(i)) - n0 - 2 * t;
        const int hi = static_cast<int>(blk.rule.row_last(i)) - n0 - 2 * t;
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (j * 8 + e < lo || j * 8 + e >= hi) s[j * 4 + 2 * hh + e] = -INFINITY;
      }
    };
    auto needs_mask = [&](int n) {
      const int n0 = n * kBlockN;
      return n0 + kBlockN > p.seqlen_k ||
             !blk.rule.tile_fully_visible(blk.m0, blk.m0 + kBlockM, n0, n0 + kBlockN);
    };
    // Softmax of the tile in s; returns whether O must be rescaled by corr (warp-uniform).
    auto softmax = [&](int n, auto first_tag, float (&corr)[2]) {
      constexpr bool kFirst = decltype(first_tag)::value;
      bool moved;
      if (needs_mask(n)) {
        apply_mask(n);
        moved = sm.template update<kFirst>(s, scale_log2, corr);
      } else {
        moved = sm.template update<kFirst>(s, scale_log2, corr);
      }
      if constexpr (kOpt.cond_rescale) {
        return __any_sync(0xffffffffu, moved) != 0;
      } else {
        return true;
      }
    };
    auto rescale_o = [&](const float (&corr)[2]) {
#pragma unroll
      for (int i = 0; i < kHeadDim / 2; ++i) o[i] *= corr[(i / 2) % 2];
    };
    auto convert_p = [&] {
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        pa[kk][0] = pack_x2<T>(s[(2 * kk) * 4 + 0], s[(2 * kk) * 4 + 1]);
        pa[kk][1] = pack_x2<T>(s[(2 * kk) * 4 + 2], s[(2 * kk) * 4 + 3]);
        pa[kk][2] = pack_x2<T>(s[(2 * kk + 1) * 4 + 0], s[(2 * kk + 1) * 4 + 1]);
        pa[kk][3] = pack_x2<T>(s[(2 * kk + 1) * 4 + 2], s[(2 * kk + 1) * 4 + 3]);
      }
    };
    auto fence_pa = [&] {
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(pa[kk][r])::"memory");
    };

    produce_ahead(0);
    mbar_wait(bar_q_full(wg), pipes.q_phase);
    // The warpgroup's last S GEMM of the tile has completed: its Q half may be reloaded for the next tile.
    auto release_q_early = [&] {
      if constexpr (!kOpt.smem_epilogue) release_q(pipes, ctid);
    };
    float corr[2];
    if constexpr (kOpt.intra_overlap) {
      // Tile 0: S only.
      mbar_wait(bar_k_full(ks.index), ks.phase);
      pp_sync();
      issue_s(ks.index);
      pp_arrive();
      wgmma_wait<0>();
      fence_operands(s);
      release(bar_k_empty(ks.index));
      ks.advance();
      if (num_tiles == 1) release_q_early();
      softmax(blk.n_max - 1, std::true_type{}, corr);
      convert_p();
      bool rescale = false;  // deferred: corr of the last softmax, applied before the next P V
      for (int i = 1; i < num_tiles; ++i) {
        const int n = blk.n_max - 1 - i;
        produce_ahead(i);
        mbar_wait(bar_k_full(ks.index), ks.phase);
        mbar_wait(bar_v_full(vs.index), vs.phase);
        pp_sync();
        issue_s(ks.index);
        if constexpr (kOpt.defer_rescale) {
          if (rescale) rescale_o(corr);  // under the S GEMM; O is in the scale of P_{i-1} from here on
        }
        issue_pv(vs.index);
        pp_arrive();
        wgmma_wait<1>();  // S_i landed; P_{i-1} V_{i-1} may still run
        fence_operands(s);
        release(bar_k_empty(ks.index));
        ks.advance();
        if (i == num_tiles - 1) release_q_early();
        rescale = softmax(n, std::false_type{}, corr);
        wgmma_wait<0>();
        fence_operands(o);
        fence_pa();
        release(bar_v_empty(vs.index));
        vs.advance();
        if constexpr (!kOpt.defer_rescale) {
          if (rescale) rescale_o(corr);
        }
        convert_p();
      }
      mbar_wait(bar_v_full(vs.index), vs.phase);
      pp_sync();
      if constexpr (kOpt.defer_rescale) {
        if (rescale) rescale_o(corr);
      }
      issue_pv(vs.index);
      pp_arrive();
      wgmma_wait<0>();
      fence_operands(o);
      fence_pa();
      release(bar_v_empty(vs.index));
      vs.advance();
    } else {
      for (int i = 0; i < num_tiles; ++i) {
        const int n = blk.n_max - 1 - i;
        if (i > 0) produce_ahead(i);
        mbar_wait(bar_k_full(ks.index), ks.phase);
        pp_sync();
        issue_s(ks.index);
        pp_arrive();
        wgmma_wait<0>();
        fence_operands(s);
        release(bar_k_empty(ks.index));
        ks.advance();
        if (i == num_tiles - 1) release_q_early();
        bool rescale = false;
        if (i == 0) {
          softmax(n, std::true_type{}, corr);
        } else {
          rescale = softmax(n, std::false_type{}, corr);
        }
        if (rescale) rescale_o(corr);
        convert_p();
        mbar_wait(bar_v_full(vs.index), vs.phase);
        pp_sync();
        issue_pv(vs.index);
        pp_arrive();
        wgmma_wait<0>();
        fence_operands(o);
        fence_pa();
        release(bar_v_empty(vs.index));
        vs.advance();
      }
    }
  }
};

}  // namespace flashkv::cuda::sm90
