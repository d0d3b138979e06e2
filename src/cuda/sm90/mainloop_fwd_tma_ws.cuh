// FlashAttention forward mainloop for Hopper (sm_90a): TMA loads + wgmma, warp-specialized (kernel family sm90ws).
// Composed into a kernel by kernel/fwd_kernel_ws.cuh with common/epilogue_fwd.cuh and common/scheduler.cuh; the
// softmax (common/softmax.cuh), softcap and masks (common/mask.cuh) are the shared collectives of every family.
//
// Source: Shah et al., "FlashAttention-3: Fast and Accurate Attention with Asynchrony and Low-precision", 2024:
//   §3.1 producer/consumer warp specialization: one producer warp issues TMA copies of Q and of K/V tiles into
//        kStages-deep circular buffers guarded by full/empty mbarriers; two consumer warpgroups (64 query rows each,
//        128 rows per CTA) run wgmma; `setmaxnreg` moves registers from the producer (24) to them (240);
//        "pingpong": named barriers order the two consumer warpgroups' GEMM issue so that one's softmax runs while
//        the other's GEMMs occupy the tensor cores;
//   §3.2 intra-warpgroup overlap: S_j = Q K_j^T is issued together with O += P_{j-1} V_{j-1}, and the softmax of S_j
//        runs while the P V GEMM executes; the O rescale is deferred to the next turn, under the next S GEMM;
// on the FlashAttention-2 algorithm (online softmax, one final division) with FlashAttention-4's conditional rescaling
// and optional partial software exp2 (common/softmax.cuh). P stays in registers as the A operand of P V.
//
// Every optimization is a compile-time switch in TmaWsOptions, so the ablation of FA3 §4.2 (each one off in turn,
// bench/gpu/v3) runs the same code: tma=false loads with cp.async from a 128-thread producer warpgroup;
// warp_specialized=false drops the producer warpgroup (a consumer thread issues the TMA copies kStages - 1 tiles
// ahead, 256 threads, no setmaxnreg, no pingpong); pingpong=false lets the warpgroups issue freely;
// intra_overlap=false runs S, softmax, P V in order. The library instantiates the defaults.
//
// Shared memory (from a 1024-byte aligned base): Q [128 x D] | K stages [kStages x kBlockN x D] | V stages | mbarriers.
// Tiles are sm90::PanelTile panels (64 columns x rows, 128-byte swizzle): one TMA box per panel, the layout the
// wgmma descriptors read (K-major Q and K, MN-major V). TMA zero-fills rows and columns outside the tensor; varlen
// tensors are mapped as their packed rows, so a tile may read the next sequence's rows: they are masked in S (keys)
// or not stored (queries), and a non-finite value among them that reaches O through 0 * inf is caught by the
// epilogue's exact rare path (common/nonfinite.cuh), as on the diagonal of a causal mask.
#pragma once

#include <cuda.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/common/block.cuh"
#include "cuda/common/epilogue_fwd.cuh"
#include "cuda/common/frag.cuh"
#include "cuda/common/mask.cuh"
#include "cuda/common/softmax.cuh"
#include "cuda/params.hpp"
#include "cuda/sm90/pipeline.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace flashkv::cuda::sm90 {

/// Compile-time switches of the TMA warp-specialized forward (defaults = the library's kernel).
struct TmaWsOptions {
  bool tma = true;               ///< TMA copies (else cp.async by a producer warpgroup)
  bool warp_specialized = true;  ///< producer warpgroup + setmaxnreg (else consumers issue the copies)
  bool pingpong = true;          ///< named-barrier ordering of the two consumer warpgroups' GEMMs
  bool intra_overlap = true;     ///< S_{j} GEMM and P_{j-1} V GEMM in flight during softmax(S_j)
  int exp2_emu_eighths = 0;      ///< share of exponentials on the FMA pipe, in eighths (0 = all on MUFU)
  bool cond_rescale = true;      ///< FA4 conditional rescaling (else O is rescaled every tile)
  bool defer_rescale = true;     ///< rescale O after issuing the next S GEMM, under it (FA3), not before
};

/// The options as a type (the library builds as C++17, where a class cannot be a template parameter value): any type
/// with a `static constexpr TmaWsOptions value`.
struct TmaWsDefaults {
  static constexpr TmaWsOptions value{};
};

/// Kernel parameters: the forward parameter block, the tensor maps of Q, K, V (the whole struct is a
/// __grid_constant__ kernel parameter, so the maps stay in parameter space) and the number of work tiles.
struct TmaWsParams {
  FwdParams p;
  CUtensorMap tma_q;
  CUtensorMap tma_k;
  CUtensorMap tma_v;
  int num_tiles = 0;
};

template <int kHeadDim_, int kBlockN_, int kStages_, class T_, bool kSoftcap, class Options = TmaWsDefaults>
struct FwdMainloopTmaWs {
  using T = T_;
  using Params = TmaWsParams;
  static constexpr TmaWsOptions kOpt = Options::value;
  static constexpr int kHeadDim = kHeadDim_, kBlockN = kBlockN_, kStages = kStages_;
  static constexpr int kBlockM = 128, kConsumerWGs = 2, kDT = kHeadDim / 8;
  static constexpr bool kCompiled = kSm90aDevice;
  static constexpr bool kExactNonFiniteRows = true;
  static constexpr bool kWS = kOpt.warp_specialized;
  static constexpr bool kPingpong = kOpt.pingpong && kWS;
  static constexpr int kProducerThreads = kWS ? 128 : 0;
  static constexpr int kThreads = kProducerThreads + 128 * kConsumerWGs;
  // setmaxnreg moves registers inside the 168/thread the launch allocates (65536 / 384, rounded down to 8): the
  // consumers' increase must be covered by the producer's decrease, 128 * (168 - P) >= 256 * (C - 168) (a 32/240
  // split for the cp.async producer hung in setmaxnreg.inc on the H200).
  static constexpr int kProducerRegs = kOpt.tma ? 24 : 40;
  static constexpr int kConsumerRegs = kOpt.tma ? 240 : 232;
  static_assert(128 * (168 - kProducerRegs) >= 256 * (kConsumerRegs - 168), "setmaxnreg would wait forever");
  static_assert(kOpt.tma || kWS, "the cp.async producer is a warpgroup of its own");
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "one m64nDk16 wgmma for P V, 64-column panels");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "P V steps 16 keys; one wgmma for S");
  static_assert(kStages >= 2, "a ring needs two stages");

  using TileQ = PanelTile<kBlockM, kHeadDim>;
  using TileKV = PanelTile<kBlockN, kHeadDim>;
  using Softmax = OnlineSoftmax<1, kOpt.cond_rescale, kOpt.exp2_emu_eighths>;
  using Epilogue = EpilogueFwd<TileQ, 1, kDT, T>;
  using MmaS = WgmmaTag<kBlockN, T>;
  using MmaO = WgmmaTag<kHeadDim, T>;
  static constexpr int kPanels = kHeadDim / 64;
  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + TileQ::kBytes;
  static constexpr int kOffV = kOffK + kStages * TileKV::kBytes;
  static constexpr int kOffBar = kOffV + kStages * TileKV::kBytes;
  static constexpr int kNumBars = 4 + 4 * kStages;  // q_full[2], q_empty[2], k_full[], k_empty[], v_full[], v_empty[]
  static constexpr int kSmemBytes = kOffBar + kNumBars * 8 + 1024;  // + base alignment
  static constexpr int kFullArrivals = kOpt.tma ? 1 : 128;          // TMA: the expect_tx arrival; cp.async: all
  static constexpr int kEmptyArrivals = 4 * kConsumerWGs;           // lane 0 of every consumer warp
  static constexpr int kQHalfBytes = TileQ::kBytes / 2;             // one consumer warpgroup's 64 rows
  static constexpr int kBarPingpong = 1;                            // named barriers 1, 2 (0 is __syncthreads)
  static_assert(kSmemBytes <= 227 * 1024, "tile configuration exceeds Hopper's shared memory per block");

  /// The O accumulator (wgmma m64nD fragment: common/frag.cuh's layout) and the rows' softmax state.
  struct Accum {
    float o_[kHeadDim / 2];
    Softmax softmax;
    __device__ __forceinline__ Frag<1, kDT> o() { return frag(o_); }
  };

  // ---- shared memory and the kernel's role hooks --------------------------------------------------------------
  uint32_t base;
  __device__ __forceinline__ explicit FwdMainloopTmaWs(uint32_t smem_base) : base(smem_base) {}
  /// Dynamic shared memory, aligned to 1024 bytes (the 128-byte swizzle atoms of TMA boxes and wgmma descriptors).
  __device__ __forceinline__ static char* shared_memory() {
    extern __shared__ __align__(1024) char smem_raw[];
    const uint32_t raw = smem_addr(smem_raw);
    return smem_raw + (((raw + 1023u) & ~1023u) - raw);
  }
  __device__ __forceinline__ static void producer_enter() { setmaxnreg_dec<kProducerRegs>(); }
  __device__ __forceinline__ static void consumer_enter() { setmaxnreg_inc<kConsumerRegs>(); }
  /// True for the producer threads that issue copies (TMA: one; cp.async: the warpgroup).
  __device__ __forceinline__ static bool producer_issues() { return !kOpt.tma || threadIdx.x == 0; }

  __device__ __forceinline__ uint32_t sQ() const { return base + kOffQ; }
  __device__ __forceinline__ uint32_t sK(int st) const { return base + kOffK + st * TileKV::kBytes; }
  __device__ __forceinline__ uint32_t sV(int st) const { return base + kOffV + st * TileKV::kBytes; }
  __device__ __forceinline__ uint32_t bar(int i) const { return base + kOffBar + 8 * i; }
  /// Q is two halves, one per consumer warpgroup (rows 64w .. 64w + 63 of every panel), each with its own
  /// full/empty pair: a warpgroup's next Q loads as soon as its own epilogue (which stages O in those rows) is done.
  __device__ __forceinline__ uint32_t bar_q_full(int w) const { return bar(w); }
  __device__ __forceinline__ uint32_t bar_q_empty(int w) const { return bar(2 + w); }
  __device__ __forceinline__ uint32_t bar_k_full(int st) const { return bar(4 + st); }
  __device__ __forceinline__ uint32_t bar_k_empty(int st) const { return bar(4 + kStages + st); }
  __device__ __forceinline__ uint32_t bar_v_full(int st) const { return bar(4 + 2 * kStages + st); }
  __device__ __forceinline__ uint32_t bar_v_empty(int st) const { return bar(4 + 3 * kStages + st); }

  /// One thread, before the CTA barrier that precedes any use.
  __device__ __forceinline__ void init(const Params& mp) const {
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
      prefetch_tensormap(&mp.tma_q);
      if (mp.p.total_k > 0) {  // no K/V maps were made for empty K/V
        prefetch_tensormap(&mp.tma_k);
        prefetch_tensormap(&mp.tma_v);
      }
    }
  }

  /// Ring positions (K ring, V ring, Q buffer); the producer and every consumer thread keep their own copy, carried
  /// from one work tile to the next.
  struct Pipes {
    PipeState<kStages> ks{}, vs{};
    uint32_t q_phase = 0;
  };

  // ---- producer -----------------------------------------------------------------------------------------------
  // Load order (items) of a work tile with T visible K/V tiles: K_0 and Q (two halves), then K_j, V_{j-1} for
  // j = 1 .. T-1, then V_{T-1} (the consumers need K_j before V_{j-1}: intra-warpgroup overlap issues S_j first).
  // A tile without visible keys loads Q only (its epilogue stages through Q like every other). K and V have
  // separate rings so a K stage is released as soon as its S GEMM completes.
  struct Producer {
    const FwdMainloopTmaWs& ml;
    const Params& mp;
    Pipes pipes{};
    const FwdBlock* blk = nullptr;
    int num_kv = 0, num_items = 0, next = 0;
    int q_row = 0, k_row = 0, bc = 0;  // TMA coordinates: packed rows of the sequence, batch (0 when varlen)
    uint32_t pending = 0;  // cp.async: full barrier of the last issued copy group, arrived once that group landed

    __device__ __forceinline__ Producer(const FwdMainloopTmaWs& m, const Params& p) : ml(m), mp(p) {}

    __device__ __forceinline__ void tile_tma(const CUtensorMap* map, uint32_t dst, uint32_t bar, uint32_t bytes,
                                             int row, int head, uint32_t panel_bytes) const {
      mbar_arrive_expect_tx(bar, bytes);
#pragma unroll
      for (int pnl = 0; pnl < kPanels; ++pnl) tma_load_4d(dst + pnl * panel_bytes, map, bar, pnl * 64, row, head, bc);
    }
    /// Rows [row0, row0 + kRows) of a Tile-layout buffer at dst from global rows src[0 .. kRows) (zero past
    /// valid_rows and past head_dim).
    template <class Tile, int kRows>
    __device__ __forceinline__ void tile_cpasync(uint32_t dst, int row0, const T* src, int64_t row_stride,
                                                 int valid_rows, uint32_t bar) {
      constexpr int kChunksPerRow = kHeadDim / 8, kTotal = kRows * kChunksPerRow;
      const int tid = static_cast<int>(threadIdx.x);  // 0..127: the producer warpgroup
#pragma unroll 4
      for (int i = tid; i < kTotal; i += 128) {
        const int r = i / kChunksPerRow, c = i % kChunksPerRow;
        const bool ok = r < valid_rows && c * 8 < mp.p.head_dim;
        cp_async_16(dst + Tile::offset(row0 + r, c), ok ? src + r * row_stride + c * 8 : src, ok);
      }
      cp_async_commit();
      land_pending<1>();
      pending = bar;
    }
    /// cp.async: the group before the newest has landed; publish it to the async proxy, then arrive.
    template <int kInFlight>
    __device__ __forceinline__ void land_pending() {
      if (pending == 0) return;
      cp_async_wait<kInFlight>();
      fence_proxy_async();
      mbar_arrive(pending);
      pending = 0;
    }

    __device__ __forceinline__ void load_q() {
#pragma unroll
      for (int w = 0; w < 2; ++w) {
        mbar_wait(ml.bar_q_empty(w), pipes.q_phase ^ 1u);
        if constexpr (kOpt.tma) {
          tile_tma(&mp.tma_q, ml.sQ() + w * 64 * 128, ml.bar_q_full(w), kQHalfBytes, q_row + 64 * w, blk->h,
                   TileQ::kPanelBytes);
        } else {
          tile_cpasync<TileQ, 64>(ml.sQ(), 64 * w, blk->q<T>(mp.p) + 64 * w * mp.p.q_s.row, mp.p.q_s.row,
                                  blk->rows_q - 64 * w, ml.bar_q_full(w));
        }
      }
      pipes.q_phase ^= 1u;
    }
    __device__ __forceinline__ void load_kv(bool is_v, int tile) {
      PipeState<kStages>& st = is_v ? pipes.vs : pipes.ks;
      const int n0 = (blk->n_max - 1 - tile) * kBlockN;
      mbar_wait(is_v ? ml.bar_v_empty(st.index) : ml.bar_k_empty(st.index), st.phase ^ 1u);
      const uint32_t dst = is_v ? ml.sV(st.index) : ml.sK(st.index);
      const uint32_t bar = is_v ? ml.bar_v_full(st.index) : ml.bar_k_full(st.index);
      if constexpr (kOpt.tma) {
        tile_tma(is_v ? &mp.tma_v : &mp.tma_k, dst, bar, TileKV::kBytes, k_row + n0, blk->hk, TileKV::kPanelBytes);
      } else {
        const int64_t rs = is_v ? mp.p.v_s.row : mp.p.k_s.row;
        tile_cpasync<TileKV, kBlockN>(dst, 0, (is_v ? blk->v<T>(mp.p) : blk->k<T>(mp.p)) + n0 * rs, rs,
                                      blk->si.seqlen_k - n0, bar);
      }
      st.advance();
    }
    __device__ __forceinline__ void issue(int item) {
      if (item == 0) {
        if (num_kv > 0) load_kv(false, 0);
        load_q();
      } else if (item == num_items - 1) {
        load_kv(true, num_kv - 1);
      } else if (item & 1) {
        load_kv(false, (item + 1) / 2);
      } else {
        load_kv(true, item / 2 - 1);
      }
    }
    __device__ __forceinline__ void begin(const FwdBlock& b) {
      blk = &b;
      num_kv = b.n_max - b.n_min;
      num_items = num_kv > 0 ? 2 * num_kv : 1;
      next = 0;
      q_row = static_cast<int>(b.si.q_row0) + b.m0;
      k_row = static_cast<int>(b.si.k_row0);
      bc = mp.p.cu_seqlens_q != nullptr ? 0 : b.b;
    }
    /// Issues the current work tile's items up to and including `last` (clipped to the tile's items).
    __device__ __forceinline__ void issue_upto(int last) {
      last = last < num_items - 1 ? last : num_items - 1;
      for (; next <= last; ++next) issue(next);
      if constexpr (!kOpt.tma) {
        if (next == num_items) land_pending<0>();  // the tile's last group lands before the next tile starts
      }
    }
  };

  /// Warp-specialized producer, one work tile (one elected thread for TMA, the warpgroup for cp.async).
  __device__ __forceinline__ void produce(Producer& pr, const FwdBlock& blk) const {
    pr.begin(blk);
    pr.issue_upto(pr.num_items - 1);
  }

  // ---- consumers ----------------------------------------------------------------------------------------------
  /// Pingpong start / end, once per CTA (the chain of named-barrier turns runs across work tiles).
  __device__ __forceinline__ static void consumers_begin(int ctid) {
    if constexpr (kPingpong) {
      if (ctid >= 128) named_bar_arrive(kBarPingpong + 0, 256);  // warpgroup 0 issues first
    }
  }
  __device__ __forceinline__ static void consumers_end(int ctid) {
    if constexpr (kPingpong) {
      if (ctid < 128) named_bar_sync(kBarPingpong + 0, 256);  // consume warpgroup 1's last arrival
    }
  }
  /// The Q tile in shared memory (the epilogue stages each warp's O rows through its own Q rows).
  __device__ __forceinline__ static char* q_tile(char* smem) { return smem + kOffQ; }
  /// A consumer warp releases its warpgroup's Q half of the current work tile once its epilogue has read its rows
  /// back (the caller syncs the warp first). The generic-proxy writes of the staged O are ordered before the next
  /// TMA write of those rows by the proxy fence.
  __device__ __forceinline__ void release_q(Pipes& pipes, int ctid) const {
    fence_proxy_async();
    if (ctid % 32 == 0) mbar_arrive(bar_q_empty(ctid / 128));
    pipes.q_phase ^= 1u;
  }

  /// Runs consumer thread ctid in [0, 256) (warpgroup ctid / 128) over the visible K/V tiles of one work tile (waits
  /// for its Q even when there is none); leaves the unnormalized O and the row state in `acc`. `pr` issues the
  /// copies when not warp-specialized.
  __device__ __forceinline__ void mma(const Params& mp, const FwdBlock& blk, int ctid, Accum& acc, Pipes& pipes,
                                      Producer& pr) const {
    const FwdParams& p = mp.p;
    const int wg = ctid / 128, warp = (ctid / 32) % 4, lane = ctid % 32;
    const int g = lane / 4, t = lane % 4;
    const int m_row = blk.m0 + 64 * wg + 16 * warp;  // the warp's first query row in the sequence
    const int num_tiles = blk.n_max - blk.n_min;
    const float scale_log2 = p.softmax_scale_log2;
    zero(acc.o());
    acc.softmax.init();

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
    produce_ahead(0);
    mbar_wait(bar_q_full(wg), pipes.q_phase);
    if (num_tiles <= 0) return;

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
        wgmma_ss<0, 0>(MmaS{}, s, dQ + qo, dK0 + st * kStageDesc + ko, kk > 0 ? 1 : 0);
      }
      wgmma_commit();
    };
    auto issue_pv = [&](int st) {
      fence_operands(acc.o_);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        const uint64_t vo = (kk * 16 * 128) >> 4;  // 16 key rows of every panel
        wgmma_rs<1>(MmaO{}, acc.o_, pa[kk], dV0 + st * kStageDesc + vo, 1);
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
    // Softcap, the boundary tile's element mask, the online softmax of S in place (P); returns whether some row of
    // the thread raised its max (O must then be rescaled by corr).
    auto softmax = [&](int n, float (&corr)[1][2]) {
      if constexpr (kSoftcap) apply_softcap(frag(s), p.score_scale);
      if (blk.needs_mask<kBlockN>(n)) {
        apply_mask(frag(s), blk.rule, m_row, n * kBlockN, g, t);
        return acc.softmax.update(frag(s), scale_log2, corr);
      }
      return acc.softmax.update(frag(s), scale_log2, corr);
    };
    auto convert_p = [&] {
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        pa[kk][0] = pack2<T>(s[(2 * kk) * 4 + 0], s[(2 * kk) * 4 + 1]);
        pa[kk][1] = pack2<T>(s[(2 * kk) * 4 + 2], s[(2 * kk) * 4 + 3]);
        pa[kk][2] = pack2<T>(s[(2 * kk + 1) * 4 + 0], s[(2 * kk + 1) * 4 + 1]);
        pa[kk][3] = pack2<T>(s[(2 * kk + 1) * 4 + 2], s[(2 * kk + 1) * 4 + 3]);
      }
    };
    auto fence_pa = [&] {
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk)
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
      release(bar_v_empty(vs.index));
      vs.advance();
    };

    // One pingpong turn that issues only S (completed before returning), or only P V (preceded by the rescale of O
    // by corr when `apply`, a warp-uniform flag; `rescale` is the softmax's answer), each behind its full barrier.
    auto s_turn = [&] {
      mbar_wait(bar_k_full(ks.index), ks.phase);
      pp_sync();
      issue_s(ks.index);
      pp_arrive();
      wgmma_wait<0>();
      wait_s();
    };
    float corr[1][2];
    auto pv_turn = [&](bool apply, bool rescale) {
      mbar_wait(bar_v_full(vs.index), vs.phase);
      pp_sync();
      if (apply) acc.softmax.rescale(acc.o(), corr, rescale);
      issue_pv(vs.index);
      pp_arrive();
      wgmma_wait<0>();
      wait_pv();
    };

    if constexpr (kOpt.intra_overlap) {
      // Tile 0: S only (O is zero: no rescale).
      s_turn();
      softmax(blk.n_max - 1, corr);
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
          acc.softmax.rescale(acc.o(), corr, rescale);  // under the S GEMM; O is in the scale of P_{i-1} from here on
        }
        issue_pv(vs.index);
        pp_arrive();
        wgmma_wait<1>();  // S_i landed; P_{i-1} V_{i-1} may still run
        wait_s();
        rescale = softmax(n, corr);
        wgmma_wait<0>();
        wait_pv();
        if constexpr (!kOpt.defer_rescale) acc.softmax.rescale(acc.o(), corr, rescale);
        convert_p();
      }
      pv_turn(kOpt.defer_rescale, rescale);
    } else {
      for (int i = 0; i < num_tiles; ++i) {
        if (i > 0) produce_ahead(i);
        s_turn();
        const bool rescale = softmax(blk.n_max - 1 - i, corr);
        convert_p();
        pv_turn(i > 0, rescale);
      }
    }
  }
};

}  // namespace flashkv::cuda::sm90
