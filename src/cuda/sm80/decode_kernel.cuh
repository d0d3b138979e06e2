// Split-KV decode (flash-decoding) over a paged 16-bit KV cache, sm_80+.
//
// Source: Dao, Haziza, Massa, Sizov, "Flash-Decoding for long-context inference" (2023) and the FlashAttention-3
// code's split-KV + combine + PackGQA (notes §4.5): the key range of each sequence is cut into num_splits chunks, one
// CTA per (split, kv head x 16-row query tile, batch); the query rows of all query heads that share one kv head are
// packed into the 16-row mma tile (PackGQA), so each K/V byte is read once per kv head. Inside a CTA the 4 warps
// split every 64-token K/V tile 4 ways (16 tokens each, own running max/sum/accumulator) and are merged at the end;
// K/V tiles stream through a cp.async ring (3 stages; the KV source's Src::kStages). Each split writes a normalized partial output and its lse
// (float32); the last split CTA of a tile to arrive merges them, or the separate decode_combine_kernel does
// (common/decode_combine.cuh). With num_splits == 1 the CTA writes the final output directly.
//
// Pages: the one page layout of kvcache/page_layout.hpp (a PagedKVCache layer, or a [num_pages, page_size, Hk, d]
// tensor pair), addressed through DecodeParams' strides. The kernel is templated on where its K / V tiles come from
// (sm80/decode_kv_source.cuh): Kv16Source (16-bit pages, cp.async into the tiles) or KvQuantSource (packed codes +
// metadata staged by cp.async, each warp converting its own keys to exact 16-bit code images; the scales / zero points
// are folded in float32 — per key on the scores, into P for the values — by the hooks of sm80/decode_fold.cuh, which
// compile to nothing for 16-bit pages; register-direct quantized sources, Src::kRegDirect, skip the image tile: the
// mainloop takes their K / V fragments from ldmatrix of the raw codes, with the Q tile's channels permuted once per
// CTA and the output's V channels placed by frag::v_channel, sm80/decode_frag.hpp); everything else — PackGQA, masking (core::MaskRule: bottom-right causal,
// window), the online softmax, the non-finite guards, the warp and split merges — is this one mainloop for every
// format. Register-direct sources with at most 8 query rows per CTA (a decode step, GQA <= 8) run the keys-as-M
// variant of this loop instead (sm80/decode_keys_m.cuh: Sᵀ = K·Qᵀ and Oᵀ = Vᵀ·Pᵀ, half the MMAs of a 16-row tile
// that holds <= 8 rows), with the same folds, masks and merges.
// Non-finite contract (include/flashkv/decode.hpp): NaN-propagating maxima (PTX max.NaN) in the softmax and in both
// merges (core/merge.hpp: only lse = −inf means "no key"); key slots past a sequence's length are zero-filled, never
// read; where causal / window masking splits a warp's 16-key block and a value there is non-finite, P·V for that
// block is summed in registers with the masked pairs selected out instead of multiplied by p = 0 (rare path, chosen by
// a warp vote). The 16-bit mainloop is compiled twice: with that guard, for CTAs whose keys masking may split, and
// without it — the loop of a decode step (one query, no window), where no block can be split. A sequence whose length
// breaks the host's precondition gets NaN (DecodeParams::seqlens).
#pragma once

#include <cmath>
#include <type_traits>

#include "core/mask.hpp"
#include "core/merge.hpp"
#include "cuda/common/decode_combine.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/tile.cuh"
#include "cuda/decode_params.hpp"
#include "cuda/sm80/decode_fold.cuh"
#include "cuda/sm80/decode_keys_m.cuh"
#include "cuda/sm80/decode_kv_source.cuh"
#include "cuda/sm80/mma.cuh"

namespace flashkv::cuda::sm80 {

/// Shared memory: Q tile | kStages stages of Src::kStageBytes | Src::kConvBytes (quantized sources' conversion tile);
/// the warp merge reuses everything after Q.
template <int kHeadDim_, class Src_ = Kv16Source<__nv_bfloat16, kHeadDim_>>
struct DecodeConfig {
  using Src = Src_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kDecodeBlockN;  // tokens per pipeline stage (16 per warp)
  static constexpr int kNWarps = 4;
  static constexpr int kThreads = kNWarps * 32;
  static_assert(kThreads == kDecodeThreads, "the KV sources assume 128 threads");
  static constexpr int kStages = Src::kStages;  ///< K/V ring depth (the source's: packed stages are small)
  using TileQ = SmemTile<16, kHeadDim>;
  using TileKV = SmemTile<kBlockN, kHeadDim>;
  static constexpr int kStageBytes = Src::kStageBytes;
  static constexpr int kConvOffset = kStages * kStageBytes;  ///< from the end of the Q tile
  static constexpr int kCombineBytes = kNWarps * 16 * (kHeadDim + 2) * 4;
  static constexpr int kLoopBytes = kStages * kStageBytes + Src::kConvBytes;
  static constexpr int kSmemBytes = TileQ::kBytes + (kLoopBytes > kCombineBytes ? kLoopBytes : kCombineBytes);
  static_assert(smem_estimate_ok<Src, kSmemBytes>(), "the KV source's shared-memory estimate (its CTA cap)");
};

__device__ __forceinline__ float quad_max_nan(float x) {
  x = max_nan(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return max_nan(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ uint32_t ld_shared_b32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v));
}

/// True when some element of v (16-bit T bits) is ±inf or NaN.
template <class T>
__device__ __forceinline__ bool nonfinite2(uint32_t v) {
  constexpr uint32_t kExp = sizeof(T) == 2 && std::is_same_v<T, __half> ? 0x7c007c00u : 0x7f807f80u;
  const uint32_t lo = v & (kExp & 0xffffu), hi = v & (kExp & 0xffff0000u);
  return lo == (kExp & 0xffffu) || hi == (kExp & 0xffff0000u);
}

/// The Q tile's 16-channel slices in place into the register-direct K fragments' channel order
/// (frag::permute_q_words; every row of the tile, padding rows included).
template <class TileQ, int kHeadDim>
__device__ __forceinline__ void permute_q_tile(uint32_t sQ) {
  constexpr int kSlices = kHeadDim / 16;
  for (int i = threadIdx.x; i < 16 * kSlices; i += kDecodeThreads) {
    const int r = i / kSlices, sl = i % kSlices;
    const uint32_t a0 = sQ + TileQ::offset(r, 2 * sl), a1 = sQ + TileQ::offset(r, 2 * sl + 1);
    uint32_t w[8], n[8];
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "r"(a0));
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(w[4]), "=r"(w[5]), "=r"(w[6]), "=r"(w[7]) : "r"(a1));
    frag::permute_q_words(w, n);
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(a0), "r"(n[0]), "r"(n[1]), "r"(n[2]), "r"(n[3]));
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(a1), "r"(n[4]), "r"(n[5]), "r"(n[6]), "r"(n[7]));
  }
}

template <class Cfg, class T>
__device__ __forceinline__ void decode_body(const DecodeParams& p) {
  using Src = typename Cfg::Src;
  constexpr int kHeadDim = Cfg::kHeadDim, kBlockN = Cfg::kBlockN, kThreads = Cfg::kThreads;
  constexpr int kStages = Cfg::kStages, kDT = kHeadDim / 8;
  constexpr float kLn2 = 0.69314718055994531f;
  using TileQ = typename Cfg::TileQ;
  using TileKV = typename Cfg::TileKV;
  extern __shared__ __align__(128) char smem[];

  if (p.combine_pdl) grid_dependency_trigger();  // the separate combine's launch overlaps this kernel
  const int split = blockIdx.x;
  const int row_tiles = (p.rows_per_kv_head + 15) / 16;
  const int hk = blockIdx.y / row_tiles, rt = blockIdx.y % row_tiles;
  const int b = blockIdx.z;
  const int group = p.num_heads / p.num_heads_kv;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const DecodeSeq sq = decode_seq(p, b);
  const int row0 = rt * 16;
  const int rows_b = sq.seqlen_q * group;
  if (row0 >= rows_b) return;  // varlen: no query rows of sequence b in this tile (the combine skips them too)
  const int rows = min(16, rows_b - row0);
  const int seqlen_k = sq.seqlen_k;
  const core::MaskRule rule = decode_rule(p, sq);
  // the CTA's visible keys, in key blocks
  int64_t k_first = 0, k_last = 0;
  rule.block_key_range(row0 / group, (row0 + rows - 1) / group + 1, &k_first, &k_last);
  const int nb_lo = static_cast<int>(k_first / kBlockN);
  const int nb_hi = k_last > k_first ? static_cast<int>((k_last + kBlockN - 1) / kBlockN) : nb_lo;
  const int per_split = (nb_hi - nb_lo + p.num_splits - 1) / p.num_splits;
  const int nb_begin = nb_lo + split * per_split;
  const int nb_end = sq.broken ? nb_begin : min(nb_hi, nb_begin + per_split);
  // visible keys [jlo, jhi) of this thread's two rows (g, g + 8)
  int jlo[2], jhi[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int qi = min(row0 + g + 8 * hh, rows_b - 1) / group;
    jlo[hh] = static_cast<int>(rule.row_first(qi));
    jhi[hh] = static_cast<int>(rule.row_last(qi));
  }

  const uint32_t sQ = smem_addr(smem);
  const uint32_t sKV = sQ + TileQ::kBytes;
  const T* qbase = static_cast<const T*>(p.q) + b * p.q_batch + sq.q_row0 * p.q_row;
  load_tile_async<TileQ, kThreads>(
      sQ,
      [&](int r) {
        const int pr = row0 + r, qi = pr / group, h = hk * group + pr % group;
        return qbase + qi * p.q_row + h * p.q_head;
      },
      rows, p.head_dim, qbase);
  cp_async_commit();

  const Src src(p, hk);
  const int page_mask = (1 << p.page_size_log2) - 1;
  const int32_t* pt = p.page_table != nullptr ? p.page_table + b * p.page_table_batch : nullptr;
  auto locate = [&](int j, int64_t& page, int& slot) {  // contiguous caches: the sequence is page b
    if (pt == nullptr) {
      page = b, slot = j;
    } else {
      page = pt[j >> p.page_size_log2], slot = j & page_mask;
    }
  };
  auto load_stage = [&](int nb, int stage) {
    src.load(p, sKV + stage * Cfg::kStageBytes, nb * kBlockN, seqlen_k, locate);
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (nb_begin + s < nb_end) load_stage(nb_begin + s, s);
    cp_async_commit();
  }

  cp_async_wait<kStages - 1>();  // Q landed (the oldest group)
  __syncthreads();
  if constexpr (Src::kRegDirect) {  // register-direct K fragments: Q's channels permuted like theirs (decode_frag.hpp)
    permute_q_tile<TileQ, kHeadDim>(sQ);
    __syncthreads();
  }
  uint32_t qa[kHeadDim / 16][4];
  {
    const LdsmAddr<TileQ> q_addr(sQ, lane % 16, lane / 16);
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) ldmatrix_x4(qa[kk], q_addr(0, kk * 2));
  }
  using Fold = DecodeFold<Src, T, kHeadDim>;  // the folded scales of packed pages (decode_fold.cuh)
  using TV = typename Fold::TV;
  constexpr bool kFolded = Fold::kFolded, kKAffine = Fold::kKAffine, kVAffine = Fold::kVAffine;
  constexpr bool kVNormalize = Fold::kVNormalize;
  typename Fold::QSum qsum;
  typename Fold::PMin pmin;
  Fold::init(qa, qsum, pmin);
  float vscale = 1.f;  // kVNormalize: o holds the output divided by vscale
  const LdsmAddr<TileKV> k_addr(sKV, (lane % 8) + (lane / 16) * 8, (lane / 8) % 2);
  const LdsmAddr<TileKV> v_addr(sKV + TileKV::kBytes, (lane % 8) + ((lane / 8) % 2) * 8, lane / 16);

  float o[kDT][4];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
  const float scale_log2 = p.softmax_scale_log2;
  const int q_lo = row0 / group, q_hi = (row0 + rows - 1) / group + 1;

  // One step of the K/V ring: waits for block `it` of the split, refills the stage the previous block used, returns
  // block `it`'s stage.
  auto ring = [&](int it) {
    const int nb = nb_begin + it;
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage `it` landed; every warp is done with the stage refilled below
    if (nb + kStages - 1 < nb_end) load_stage(nb + kStages - 1, (it + kStages - 1) % kStages);
    cp_async_commit();
    return sKV + (it % kStages) * Cfg::kStageBytes;
  };
  // packed pages: the block l2_prefetch_blocks past the ring's newest into L2 (at a block's end: the page-table read
  // it waits for does not delay the block's work)
  auto prefetch = [&](int nb) {
    if constexpr (kFolded) {
      const int nbp = nb + kStages - 1 + p.l2_prefetch_blocks;
      if (p.l2_prefetch_blocks > 0 && nbp < nb_end) src.prefetch_l2(nbp * kBlockN, seqlen_k, locate);
    }
  };
  // The 16-bit mainloop carries the non-finite guard below only where masking may split a warp's 16-key block
  // somewhere in this CTA's keys (seqlen_q > 1 on the causal diagonal, a window's edge). A decode step with one query
  // and no window runs the loop without it: neither the per-block visibility test nor the guard's rare path (which
  // rewrites the V tile, so the V fragments could not be loaded before it) is in that loop.
  // Affine packed pages (head_dim <= 128) are compiled twice more, for channel groups of the whole head (the formats'
  // default: int8 / int4 without _gN) and of 32 channels (_g32): the folds at compile time instead of a uniform branch
  // and run-time group arithmetic per 16-channel slice (other groups: the run-time loop).
  // Folded sources whose CTA has at most 8 query rows (decode with GQA groups <= 8) skip the softmax and fold work of
  // the mma tile's empty rows 8..15 (this thread's row g + 8): kHalves = 1; their P operand is 0.
  auto mainloop = [&](auto guarded, auto groups, auto halves) {
    constexpr bool kGuard = !kFolded && decltype(guarded)::value;
    constexpr int kGroup = decltype(groups)::value;  // affine halves' channels per group at compile time; 0: run time
    constexpr int kHalves = decltype(halves)::value;
    static_assert(kHalves == 2 || kFolded, "one row half: folded sources only");
    for (int it = 0; nb_begin + it < nb_end; ++it) {
      const int nb = nb_begin + it;
      const uint32_t stage_addr = ring(it);
      // the block's 16-bit K tile (V at + TileKV::kBytes), as an offset from sKV: the stage itself, or the conversion
      // tiles a quantized source just dequantized it into (after a __syncthreads)
      uint32_t soff = 0;
      if constexpr (!Src::kRegDirect)
        soff = src.tiles(stage_addr, sKV + Cfg::kConvOffset, nb * kBlockN, seqlen_k) - sKV;
      const int jw0 = nb * kBlockN + warp * 16;  // this warp's 16 keys

      float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
      if constexpr (Src::kReloadQ) {  // capped affine sources: Q fragments reloaded per block (the Q tile stays)
        const LdsmAddr<TileQ> q_addr(sQ, lane % 16, lane / 16);
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; ++kk) ldmatrix_x4(qa[kk], q_addr(0, kk * 2));
      }
      // block rows of this thread's keys: rk, rk + 1, rk + 8, rk + 9
      const int rk = warp * 16 + 2 * t;
      {
        // affine keys: the MMAs accumulate one channel group at a time (acc), the fold's hook adds it to s
        float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}}, qacc[2] = {0.f, 0.f};
        float(&qk)[2][4] = kKAffine ? acc : s;
        const int kgroup = kGroup > 0 ? kGroup : Fold::group(src, 0);
        [[maybe_unused]] uint32_t kw[Src::kLdsmK][4];  // register-direct: the warp's raw K code words
        if constexpr (Src::kRegDirect) src.k_words(stage_addr, kw);
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; ++kk) {
          uint32_t bk[4];
          if constexpr (Src::kRegDirect) {
            src.k_frag(kw, kk, bk);
          } else {
            ldmatrix_x4(bk, k_addr(warp * 16, kk * 2) + soff);
          }
          mma_16816<T>(qk[0], qa[kk], bk[0], bk[1]);
          mma_16816<T>(qk[1], qa[kk], bk[2], bk[3]);
          Fold::k_slice(src, kk, kgroup, stage_addr, rk, qsum, acc, qacc, s, halves);
        }
        Fold::k_factors(src, stage_addr, rk, s, halves);
      }
      uint32_t soff_v = soff;  // the V tile is at v_addr(...) + soff_v
      [[maybe_unused]] uint32_t vw[Src::kLdsmV][4];  // register-direct: the warp's transposed raw V code words
      if constexpr (Src::kRegDirect) {
        src.v_words(stage_addr, vw);
      } else if constexpr (kFolded) {  // V images into the rows the K images held (the QK MMAs overlap the conversion)
        src.tiles_v(stage_addr, sKV + Cfg::kConvOffset, nb * kBlockN, seqlen_k);
        soff_v = soff - TileKV::kBytes;
      }
      float vf[2][2] = {{0.f, 0.f}, {0.f, 0.f}};  // token-scaled values: each key's factor
      float vratio = 1.f;                         // kVNormalize: o's extra rescale for this block
      Fold::v_factors(src, kGroup > 0 ? kGroup : Fold::group(src, 1), stage_addr, rk, nb * kBlockN, seqlen_k, vf, vscale,
                      vratio);
      if constexpr (kFolded) {
        // the per-key selects only where this thread's rows may not see all of the warp's 16 keys (the last block of
        // a decode step, masked rows): the same scores, without 16 compare-selects per block elsewhere
        if (p.softcap) {
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 2 * kHalves; ++e) s[nt][e] = tanh_approx(s[nt][e] * p.score_scale);
        }
        if (jw0 < max(jlo[0], jlo[1]) || jw0 + 16 > min(jhi[0], jhi[1])) {
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 2 * kHalves; ++e) {
              const int j = jw0 + nt * 8 + 2 * t + (e & 1);
              const int hh = e >> 1;
              if (j < jlo[hh] || j >= jhi[hh]) s[nt][e] = -INFINITY;  // a select: masked keys are exactly absent
            }
        }
      } else {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float x = s[nt][e];
            if (p.softcap) x = tanh_approx(x * p.score_scale);
            const int j = jw0 + nt * 8 + 2 * t + (e & 1);
            const int hh = e >> 1;
            if (j < jlo[hh] || j >= jhi[hh]) x = -INFINITY;  // a select: masked keys are exactly absent
            s[nt][e] = x;
          }
      }
#pragma unroll
      for (int hh = 0; hh < kHalves; ++hh) {
        float mx = max_nan(row_max[hh], max_nan(max_nan(s[0][2 * hh], s[0][2 * hh + 1]),
                                                max_nan(s[1][2 * hh], s[1][2 * hh + 1])));
        mx = quad_max_nan(mx);
        const float m_scaled = mx == -INFINITY ? 0.f : mx * scale_log2;
        const float corr = exp2_approx(row_max[hh] * scale_log2 - m_scaled);
        row_max[hh] = mx;
        row_sum[hh] *= corr;
        const float ocorr = kVNormalize ? corr * vratio : corr;
        // folded sources skip the rescale where it is the identity (row max and vscale unchanged: corr is exactly 1)
        if (!kFolded || corr != 1.f || (kVNormalize && vratio != 1.f)) {
#pragma unroll
          for (int dt = 0; dt < kDT; ++dt) o[dt][2 * hh] *= ocorr, o[dt][2 * hh + 1] *= ocorr;
          Fold::rescale(pmin, hh, corr);
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pv = exp2_approx(fmaf(s[nt][2 * hh + e], scale_log2, -m_scaled));
            s[nt][2 * hh + e] = pv;
            row_sum[hh] += pv;
          }
      }
      // Where masking splits this warp's block (causal diagonal, window edge) a non-finite value must not meet p = 0
      // in the MMA (0 · NaN = NaN): check the block's values (only such blocks: seqlen_q > 1 or a window), and if
      // one is non-finite add p·v for it to the rows that see it, zero it in shared memory, and let the MMA do the
      // rest — rows that do not see it get bit-for-bit what they get without it.
      if (kGuard && jw0 < seqlen_k && !rule.tile_fully_visible(q_lo, q_hi, jw0, min(jw0 + 16, seqlen_k))) {
        const uint32_t vbase = sKV + TileKV::kBytes + soff;
        bool bad = false;
        for (int i = lane; i < 16 * (kHeadDim / 2); i += 32) {
          const int key = i / (kHeadDim / 2), c = (i % (kHeadDim / 2)) * 2;
          bad |= nonfinite2<T>(ld_shared_b32(vbase + TileKV::offset_elem(warp * 16 + key, c)));
        }
        if (__any_sync(0xffffffffu, bad)) {
#pragma unroll
          for (int k = 0; k < 16; ++k) {
            const int j = jw0 + k;
            const int src = (lane & ~3) | ((k % 8) / 2);
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
              const float pk = __shfl_sync(0xffffffffu, s[k / 8][2 * hh + (k & 1)], src);
              if (j < jlo[hh] || j >= jhi[hh]) continue;
#pragma unroll
              for (int dt = 0; dt < kDT; ++dt) {
                const float2 vv = unpack2<T>(ld_shared_b32(vbase + TileKV::offset_elem(warp * 16 + k, dt * 8 + 2 * t)));
                if (!isfinite(vv.x)) o[dt][2 * hh] += pk * vv.x;
                if (!isfinite(vv.y)) o[dt][2 * hh + 1] += pk * vv.y;
              }
            }
          }
          __syncwarp();
          for (int i = lane; i < 16 * (kHeadDim / 2); i += 32) {
            const int key = i / (kHeadDim / 2), c = (i % (kHeadDim / 2)) * 2;
            const uint32_t addr = vbase + TileKV::offset_elem(warp * 16 + key, c);
            const float2 vv = unpack2<T>(ld_shared_b32(addr));
            if (!isfinite(vv.x) || !isfinite(vv.y)) {
              st_shared_b32(addr, pack2<T>(isfinite(vv.x) ? vv.x : 0.f, isfinite(vv.y) ? vv.y : 0.f));
            }
          }
          __syncwarp();
        }
      }
      // P (the A operand) for every 16-column slice of V, or per channel group (affine V: the fold's hook)
      uint32_t a[4];
      Fold::p_operand(s, vf, a, halves);
      const int vgroup = kGroup > 0 ? kGroup : Fold::group(src, 1);
      const float vinv = kVAffine ? Fold::inv_pow2(vscale) : 1.f;  // vscale: a power of two (1 unless kVNormalize)
#pragma unroll
      for (int dt2 = 0; dt2 < kDT / 2; ++dt2) {
        Fold::v_slice(src, dt2, vgroup, vinv, stage_addr, rk, nb * kBlockN, seqlen_k, s, pmin, a, halves);
        uint32_t bv[4];
        if constexpr (Src::kRegDirect) {
          src.v_frag(vw, dt2, bv);
        } else {
          ldmatrix_x4_trans(bv, v_addr(warp * 16, dt2 * 2) + soff_v);
        }
        mma_16816<TV>(o[2 * dt2], a, bv[0], bv[1]);
        mma_16816<TV>(o[2 * dt2 + 1], a, bv[2], bv[3]);
      }
      prefetch(nb);
    }
  };
  // ---- the warp-merge scratch (core/merge.hpp; it reuses the K/V ring once every warp is done with it) -----------
  float* sO = reinterpret_cast<float*>(smem + TileQ::kBytes);  // [warp][16][kHeadDim]
  float* sM = sO + Cfg::kNWarps * 16 * kHeadDim;               // [warp][16] row max (natural-log units)
  float* sL = sM + Cfg::kNWarps * 16;                          // [warp][16] row sum
  using Whole = std::integral_constant<int, kHeadDim>;
  using G32 = std::integral_constant<int, 32>;
  using RunTime = std::integral_constant<int, 0>;
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, 2>;
  // Register-direct packed pages with at most 8 query rows (a decode step, GQA <= 8): the keys-as-M loop
  // (decode_keys_m.cuh; half the MMAs). Its affine variants: compile-time groups of the whole head / 32 channels.
  // (The keys-as-M kernel, Src::kKeysMOnly, has only this loop: its launcher sends it batches of <= 8 rows per CTA.)
  bool keys_m = false;
  if constexpr (Src::kRegDirect) {
    if (Src::kKeysMOnly || (rows <= 8 && p.keys_m)) {
      keys_m = true;
      KeysMCta c{nb_begin, nb_end, seqlen_k, {0, 0}, {0, 0}, scale_log2, p.score_scale, p.softcap};
#pragma unroll
      for (int e = 0; e < 2; ++e) {  // query columns 2t, 2t + 1 (padding columns: the last row's keys)
        const int qi = min(row0 + 2 * t + e, rows_b - 1) / group;
        c.jlo[e] = static_cast<int>(rule.row_first(qi));
        c.jhi[e] = static_cast<int>(rule.row_last(qi));
      }
      auto run = [&](auto groups) {
        decode_keys_m<Src, T, kHeadDim, decltype(groups)::value>(src, c, qa, ring, prefetch, sO, sM, sL);
      };
      if constexpr (Src::kKeysMOnly) {  // keys_m_kernel (decode_kernel_choice.hpp): whole-head groups only
        run(Whole{});
      } else if constexpr (kKAffine || kVAffine) {
        if (Fold::groups_are(src, kHeadDim)) {
          run(Whole{});
        } else if (Fold::groups_are(src, 32)) {
          run(G32{});
        } else {
          run(RunTime{});
        }
      } else {
        run(RunTime{});
      }
    }
  }
  if constexpr (!Src::kKeysMOnly) {
    if (!keys_m) {
      // The 16-row loop: compile-time channel groups for affine pages (head_dim <= 128; 256: registers, one loop), and
      // the one-row-half variant for folded sources (image tiles; register-direct ones under FLASHKV_DECODE_KEYS_M=0).
      if constexpr ((kKAffine || kVAffine) && kHeadDim <= 128) {
        auto by_rows = [&](auto groups) {
          if (rows <= 8) {
            mainloop(std::false_type{}, groups, One{});
          } else {
            mainloop(std::false_type{}, groups, Two{});
          }
        };
        if (Fold::groups_are(src, kHeadDim)) {
          by_rows(Whole{});
        } else if (Fold::groups_are(src, 32)) {  // the _g32 formats (int4_g32: the best 4-bit quality the device decodes)
          by_rows(G32{});
        } else {
          mainloop(std::false_type{}, RunTime{}, Two{});
        }
      } else if constexpr (kFolded && kHeadDim <= 128) {
        if (rows <= 8) {
          mainloop(std::false_type{}, RunTime{}, One{});
        } else {
          mainloop(std::false_type{}, RunTime{}, Two{});
        }
      } else if (kFolded || rule.tile_fully_visible(q_lo, q_hi, int64_t{nb_begin} * kBlockN,
                                                    min(int64_t{nb_end} * kBlockN, static_cast<int64_t>(seqlen_k)))) {
        mainloop(std::false_type{}, RunTime{}, Two{});
      } else {
        mainloop(std::true_type{}, RunTime{}, Two{});
      }
      Fold::finish(src, vscale, pmin, o);
      cp_async_wait<0>();
      __syncthreads();
  #pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = g + 8 * hh;
        const float l = quad_sum(row_sum[hh]);
        if (t == 0) {
          sM[warp * 16 + r] = row_max[hh] * (scale_log2 * kLn2);  // -inf stays -inf, NaN stays NaN
          sL[warp * 16 + r] = l;
        }
        if constexpr (Src::kRegDirect) {  // o[dt][e] is channel frag::v_channel(dt, e, t): 16s + 4t + 0..3 per slice s
  #pragma unroll
          for (int s2 = 0; s2 < kDT / 2; ++s2)
            *reinterpret_cast<float4*>(&sO[(warp * 16 + r) * kHeadDim + 16 * s2 + 4 * t]) =
                make_float4(o[2 * s2][2 * hh], o[2 * s2 + 1][2 * hh], o[2 * s2][2 * hh + 1], o[2 * s2 + 1][2 * hh + 1]);
        } else {
  #pragma unroll
          for (int dt = 0; dt < kDT; ++dt)
            *reinterpret_cast<float2*>(&sO[(warp * 16 + r) * kHeadDim + dt * 8 + 2 * t]) =
                make_float2(o[dt][2 * hh], o[dt][2 * hh + 1]);
        }
      }
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < 16 * (kHeadDim / 2); idx += kThreads) {
    const int r = idx / (kHeadDim / 2), c = (idx % (kHeadDim / 2)) * 2;
    if (r >= rows || c >= p.head_dim) continue;
    const int pr = row0 + r, qi = pr / group, h = hk * group + pr % group;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < Cfg::kNWarps; ++w) M = core::merge_max(M, sM[w * 16 + r]);
    float L = 0.f, ox = 0.f, oy = 0.f;
#pragma unroll
    for (int w = 0; w < Cfg::kNWarps; ++w) {
      const float wt = core::merge_weight(sM[w * 16 + r], M);
      L = core::merge_accumulate(L, wt, sL[w * 16 + r]);
      const float2 v = *reinterpret_cast<const float2*>(&sO[(w * 16 + r) * kHeadDim + c]);
      ox = core::merge_accumulate(ox, wt, v.x), oy = core::merge_accumulate(oy, wt, v.y);
    }
    // one split: the row's own verdict (visible keys all −inf: NaN); a partial: "no key here" is −inf / 0
    const bool has_keys = p.num_splits == 1 && rule.row_last(qi) > rule.row_first(qi);
    float inv = core::merged_inv_sum(L, has_keys);
    float lse = core::merged_lse(M, L, has_keys);
    if (sq.broken) inv = lse = NAN;
    if (p.num_splits == 1) {
      T* og = static_cast<T*>(p.out) + b * p.out_batch + (sq.q_row0 + qi) * p.out_row + h * p.out_head + c;
      *reinterpret_cast<uint32_t*>(og) = pack2<T>(ox * inv, oy * inv);
      if (p.lse != nullptr && c == 0) p.lse[b * p.lse_batch + h * p.lse_head + (sq.q_row0 + qi) * p.lse_row] = lse;
    } else {
      const int64_t row = ((static_cast<int64_t>(split) * p.batch + b) * p.num_heads + h) * p.seqlen_q + qi;
      *reinterpret_cast<float2*>(p.o_accum + row * kHeadDim + c) = make_float2(ox * inv, oy * inv);
      if (c == 0) p.lse_accum[row] = lse;
    }
  }
  if (p.num_splits > 1 && p.split_counters != nullptr) {  // fused combine (common/decode_combine.cuh)
    __shared__ int s_last;
    __threadfence();  // this CTA's partials are visible device-wide before its arrival is counted
    __syncthreads();
    if (threadIdx.x == 0) {
      int* count = p.split_counters + static_cast<int64_t>(b) * gridDim.y + blockIdx.y;
      s_last = atomicAdd(count, 1) == p.num_splits - 1;
      if (s_last) atomicExch(count, 0);  // every split has arrived: zero again for the next launch
    }
    __syncthreads();
    if (s_last) {
      __threadfence();
      combine_tile<kHeadDim, T, kThreads>(p, sq, rule, b, hk, row0, rows, group,
                                          reinterpret_cast<float*>(smem + TileQ::kBytes));
    }
  }
}

/// The split-KV kernel: 16-bit sources without a register cap (as it always was), capped sources
/// (Src::kMinCtasPerSm > 1) with __launch_bounds__' minimum residency.
template <class Cfg, class T>
__global__ void __launch_bounds__(Cfg::kThreads) decode_kernel(const DecodeParams p) {
  decode_body<Cfg, T>(p);
}
template <class Cfg, class T>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::Src::kMinCtasPerSm) decode_kernel_capped(const DecodeParams p) {
  decode_body<Cfg, T>(p);
}

}  // namespace flashkv::cuda::sm80
