// Where the split-KV decode's K / V tiles come from (sm80/decode_kernel.cuh is templated on it): the one page layout
// of kvcache/page_layout.hpp in the format of kvcache/format/traits.hpp, delivered per 64-token block as two
// kBlockN x kHeadDim 16-bit shared-memory tiles (SmemTile, swizzled) that the mainloop's ldmatrix / mma read.
//
//   Kv16Source     16-bit pages of the query dtype (bf16 / fp16 caches, flash-attn tensors): cp.async straight into
//                  the stage's tiles (no conversion).
//   KvQuantSource  packed pages of any token-granular format (fp8 static / per-token scale, int8 / int4 with
//                  [scale, min] per token and channel group — KVCode x KVScaling fixed at compile time, group size and
//                  metadata bytes at run time): the stage holds the block's raw codes and metadata (cp.async, so the
//                  HBM stream stays pipelined 3 deep). The scales are FOLDED out of the per-element path: each warp
//                  turns only its own 16 keys' codes into exact 16-bit images (Code16, sm80/decode_code16.cuh: a few
//                  PRMT / LOP3 / paired-half operations per two codes; v16 = (code − kOff) · kMul) in one 16-bit tile —
//                  K first, then V into the same rows once its K fragments are loaded (__syncwarp, no CTA barrier) —
//                  and the mainloop applies the per-key factors in float32: K's scale on the score after the QK MMA
//                  (affine K: one accumulator per channel group plus min' · Σ q over the group), V's scale folded
//                  into P before the P·V MMA (affine V: + Σ_j P_ij · min'_jg in float32; static V scale on the final
//                  output). Where kRegDirect (head dims 64 / 128, V images that are the codes'), the codes are
//                  not imaged at all: the staged rows are swizzled and each warp's ldmatrix of the raw codes feeds
//                  the MMA fragments through a conversion in registers (sm80/decode_frag.hpp). KIVI keys
//                  (channel_affine, G tokens per unit) are not token-granular and are not instantiated (the host
//                  names them in an UnsupportedError). dequant8 below is the element-wise x̂
//                  of the same formats (KVHalfFormat::dequant bit for bit; tested), kept as the conversion reference.
// Both: key slots past the sequence's length are never read (zero-filled by cp.async, whatever the page holds there;
// quant: their images are finite and their weight exactly 0 — masked scores, V factors 0 past the end).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/ptx.cuh"
#include "cuda/common/tile.cuh"
#include "cuda/decode_params.hpp"
#include "cuda/sm80/decode_code16.cuh"
#include "cuda/sm80/decode_frag.hpp"
#include "cuda/sm80/mma.cuh"
#include "kvcache/format/traits.hpp"

namespace flashkv::cuda::sm80 {

inline constexpr int kDecodeBlockN = 64;    ///< tokens per pipeline stage (16 per warp)
inline constexpr int kLog2BlockN = 6;       ///< log2(kDecodeBlockN)
inline constexpr int kDecodeThreads = 128;  ///< 4 warps

/// Byte offset of row (page, slot) of one half for its page / slot strides in bytes (page, slot >= 0: two 32 x 64-bit
/// widening products, no sign extension).
__device__ __forceinline__ int64_t page_slot_offset(int64_t page, int slot, int64_t page_stride, int64_t slot_stride) {
  return static_cast<int64_t>(static_cast<uint64_t>(static_cast<uint32_t>(page)) * static_cast<uint64_t>(page_stride) +
                              static_cast<uint64_t>(static_cast<uint32_t>(slot)) * static_cast<uint64_t>(slot_stride));
}

template <class T, int kHeadDim>
struct Kv16Source {
  using TileKV = attn::SmemTile<kDecodeBlockN, kHeadDim>;
  using TV = T;  ///< element type of the V tile and of P in the P·V MMA
  static constexpr int kStageBytes = 2 * TileKV::kBytes;
  static constexpr int kStages = 3;  ///< cp.async ring depth (2 CTAs per SM at head_dim 128: 4 blocks of 32 KB in flight)
  static constexpr int kConvBytes = 0;
  static constexpr bool kFolded = false;  ///< the tiles hold the values themselves
  static constexpr int kMinCtasPerSm = 1;   ///< no register cap (decode_kernel, not decode_kernel_capped)
  static constexpr bool kKeysMOnly = false;  ///< not the keys-as-M kernel (KvQuantSource)
  static constexpr bool kReloadQ = false;    ///< Q fragments held in registers for the whole CTA
  static constexpr bool kRegDirect = false;  ///< fragments by ldmatrix from the 16-bit tiles
  static constexpr int kLdsmK = 1, kLdsmV = 1;
  const T* kc;
  const T* vc;
  int head_dim;
  __device__ __forceinline__ Kv16Source(const DecodeParams& p, int hk)
      : kc(static_cast<const T*>(p.k_cache) + hk * p.k_head),
        vc(static_cast<const T*>(p.v_cache) + hk * p.v_head),
        head_dim(p.head_dim) {}
  /// Issues the cp.async copies of keys [j0, j0 + kBlockN) into the stage at `dst`; locate(j, &page, &slot).
  /// Where every thread keeps one chunk column (head dims 64, 128, 256) the copies are branch-free, with one page
  /// lookup per row for K and V together: a slot past seqlen_k is zero-filled and not read, its lookup clamped to the
  /// last key (j0 < seqlen_k for every block the kernel visits), so no row needs a branch around its page-table load.
  template <class Locate>
  __device__ __forceinline__ void load(const DecodeParams& p, uint32_t dst, int j0, int seqlen_k, Locate&& locate) const {
    constexpr int kChunks = TileKV::kChunks;
    if constexpr (kDecodeThreads % kChunks == 0 && (kDecodeBlockN * kChunks) % kDecodeThreads == 0) {
      constexpr int kStep = kDecodeThreads / kChunks;
      const int c = static_cast<int>(threadIdx.x) % kChunks, r0 = static_cast<int>(threadIdx.x) / kChunks;
      const bool col_ok = c * 8 < head_dim;
      // bytes; a zero-filled chunk (head_dim padding) points at its row's start
      const char* kb = reinterpret_cast<const char*>(kc) + (col_ok ? c * 16 : 0);
      const char* vb = reinterpret_cast<const char*>(vc) + (col_ok ? c * 16 : 0);
#pragma unroll
      for (int k = 0; k < kDecodeBlockN / kStep; ++k) {
        const int r = r0 + k * kStep, j = j0 + r;
        const bool ok = col_ok && j < seqlen_k;
        int64_t page;
        int slot;
        locate(min(j, seqlen_k - 1), page, slot);
        // kStep a multiple of 8 keeps (row & 7), hence the swizzle, of every row of this thread
        const uint32_t d = kStep % 8 == 0 ? dst + TileKV::offset(r0, c) + k * kStep * TileKV::kRowBytes
                                          : dst + TileKV::offset(r, c);
        attn::cp_async_16(d, kb + page_slot_offset(page, slot, p.k_page * 2, p.k_row * 2), ok);
        attn::cp_async_16(d + TileKV::kBytes, vb + page_slot_offset(page, slot, p.v_page * 2, p.v_row * 2), ok);
      }
    } else {  // head dims 96, 192: the chunk columns do not divide the threads (a branch per row)
      auto row = [&](const T* base, int64_t page_stride, int64_t row_stride, int j) {
        int64_t page;
        int slot;
        locate(j, page, slot);
        return base + page * page_stride + slot * row_stride;
      };
      attn::load_tile_async<TileKV, kDecodeThreads>(
          dst, [&](int r) { return row(kc, p.k_page, p.k_row, j0 + r); }, seqlen_k - j0, head_dim, kc);
      attn::load_tile_async<TileKV, kDecodeThreads>(
          dst + TileKV::kBytes, [&](int r) { return row(vc, p.v_page, p.v_row, j0 + r); }, seqlen_k - j0, head_dim,
          vc);
    }
  }
  /// Shared-memory address of the block's K tile (V tile at + TileKV::kBytes) once the stage has landed.
  __device__ __forceinline__ uint32_t tiles(uint32_t stage, uint32_t, int, int) const { return stage; }
};

__host__ __device__ constexpr int round16(int x) { return (x + 15) / 16 * 16; }

/// Converts codes c0..c0+7 (c0 a multiple of 8) of row r of a staged block — codes [kBlockN][code_bytes], metadata
/// [kBlockN][meta_bytes_per_unit], the page-head layout of format/traits.hpp — to x̂ (KVHalfFormat::dequant's value).
template <kv::KVCode C, kv::KVScaling S, int kHeadDim>
__device__ __forceinline__ void dequant8(const kv::KVHalfFormat& f, const uint8_t* codes, const uint8_t* meta, int r,
                                         int c0, float head_scale, float x[8]) {
  static_assert(kv::is_integer_code(C) || kv::is_fp8_code(C), "KvQuantSource converts integer and fp8 codes");
  constexpr int kCodeBytes = kHeadDim * kv::code_bits(C) / 8;
  const uint8_t* row = codes + r * kCodeBytes;
  int base = c0, shift = 0;  // planar packing: the 8 codes are bits [shift, shift + bits) of 8 consecutive bytes
  if constexpr (C == kv::KVCode::u4) {
    if (c0 >= kHeadDim / 2) base = c0 - kHeadDim / 2, shift = 4;
  } else if constexpr (C == kv::KVCode::u2) {
    const int plane = c0 / (kHeadDim / 4);
    base = c0 - plane * (kHeadDim / 4), shift = 2 * plane;
  }
  const uint2 w = *reinterpret_cast<const uint2*>(row + base);
  float v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t byte = ((i < 4 ? w.x : w.y) >> (8 * (i & 3))) & 0xFFu;
    if constexpr (kv::is_integer_code(C)) {
      constexpr uint32_t kMask = (1u << kv::code_bits(C)) - 1u;
      v[i] = static_cast<float>((byte >> shift) & kMask);
    } else if constexpr (C == kv::KVCode::e5m2) {
      // e5m2 = the top byte of fp16; the trait reads the inf / NaN codes (> 0x7B) as NaN
      const float f = __half2float(__ushort_as_half(static_cast<unsigned short>(byte << 8)));
      v[i] = (byte & 0x7Fu) > 0x7Bu ? __int_as_float(0x7fc00000) : f;
    } else {  // e4m3: magnitude bits under the fp16 exponent field, times 2^(15 - 7); the NaN code stays NaN
      const unsigned short h = static_cast<unsigned short>(((byte & 0x80u) << 8) | ((byte & 0x7Fu) << 7));
      v[i] = (byte & 0x7Fu) == 0x7Fu ? __int_as_float(0x7fc00000) : __half2float(__ushort_as_half(h)) * 256.0f;
    }
  }
  if constexpr (S == kv::KVScaling::none) {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = v[i];
  } else if constexpr (S == kv::KVScaling::head_static || S == kv::KVScaling::token_f32) {
    float s = head_scale;
    if constexpr (S == kv::KVScaling::token_f32) s = *reinterpret_cast<const float*>(meta + r * 4);
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = __fmul_rn(v[i], s);
  } else {
    static_assert(S == kv::KVScaling::token_affine, "token-granular scalings only");
    const uint32_t sm = *reinterpret_cast<const uint32_t*>(meta + r * f.meta_bytes_per_unit + 4 * (c0 / f.group));
    const float sc = __half2float(__ushort_as_half(static_cast<unsigned short>(sm & 0xFFFFu)));
    const float mn = __half2float(__ushort_as_half(static_cast<unsigned short>(sm >> 16)));
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = __fadd_rn(mn, __fmul_rn(sc, v[i]));  // the trait's order (no contraction)
  }
}

/// Shared memory of a quantized decode CTA (sm80::DecodeConfig's layout): Q tile | stages x stage | conversion tile,
/// or the warp merge's scratch where larger.
__host__ __device__ constexpr int quant_smem_bytes(int head_dim, int stage_bytes, int conv_bytes, int stages) {
  return 16 * ((head_dim / 8 + 7) / 8 * 8) * 16 /* the Q tile: SmemTile<16, head_dim>::kBytes */ + (stages * stage_bytes + conv_bytes > 4 * 16 * (head_dim + 2) * 4
                                  ? stages * stage_bytes + conv_bytes
                                  : 4 * 16 * (head_dim + 2) * 4);
}
/// n such CTAs fit an H100 / H200 SM's 228 KB (1 KB reserved per CTA).
__host__ __device__ constexpr bool quant_fits(int n, int head_dim, int stage_bytes, int conv_bytes, int stages) {
  return n * (quant_smem_bytes(head_dim, stage_bytes, conv_bytes, stages) + 1024) <= 228 * 1024;
}
/// The deepest ring (3 .. max_stages) with which n CTAs fit.
__host__ __device__ constexpr int quant_deepest(int n, int head_dim, int stage_bytes, int conv_bytes, int max_stages) {
  int s = 3;
  while (s < max_stages && quant_fits(n, head_dim, stage_bytes, conv_bytes, s + 1)) ++s;
  return s;
}

/// kKeysMOnly: the source of the keys-as-M kernel (decode_launch.cuh: launched where every CTA has <= 8 query rows;
/// its own occupancy: 4 CTAs per SM where 4 fit with a 3-stage ring, registers capped to match).
template <class T, int kHeadDim, kv::KVCode KC, kv::KVScaling KS, kv::KVCode VC, kv::KVScaling VS, bool kKeysMOnly_ = false>
struct KvQuantSource {
  using TileKV = attn::SmemTile<kDecodeBlockN, kHeadDim>;
  /// Element type of the V images and of P in the P·V MMA: fp16 when V carries per-token scales (token_f32 /
  /// token_affine), whatever the query dtype — P · scale rounded to fp16 (11 significant bits, kept in range by the
  /// mainloop's per-block power of two) adds less than rounding x̂ to bf16 does, where rounding it to bf16 doubled
  /// the naive computation's error on peaked rows (H200, CudaQuantKVCache.*); exact either way for the codes.
  using TV = std::conditional_t<VS == kv::KVScaling::token_f32 || VS == kv::KVScaling::token_affine, __half, T>;
  static constexpr int kCodeBytesK = kHeadDim * kv::code_bits(KC) / 8, kCodeBytesV = kHeadDim * kv::code_bits(VC) / 8;
  static constexpr int kCodeBlockK = round16(kDecodeBlockN * kCodeBytesK), kCodeBlockV = round16(kDecodeBlockN * kCodeBytesV);
  static constexpr int kHalfBytesK = kCodeBlockK + round16(kDecodeBlockN * quant_meta_max(KS, kHeadDim));
  static constexpr int kHalfBytesV = kCodeBlockV + round16(kDecodeBlockN * quant_meta_max(VS, kHeadDim));
  static constexpr int kStageBytes = kHalfBytesK + kHalfBytesV;
  static_assert(kCodeBytesK % 16 == 0 && kCodeBytesV % 16 == 0, "code rows are whole 16-byte chunks");
  static constexpr int kChunksK = kCodeBytesK / 16, kChunksV = kCodeBytesV / 16;
  static constexpr bool kBf16K = std::is_same_v<T, __nv_bfloat16>, kBf16V = std::is_same_v<TV, __nv_bfloat16>;
  static_assert(KS == kv::KVScaling::head_static || KS == kv::KVScaling::token_f32 || KS == kv::KVScaling::token_affine,
                "token-granular scalings only");
  static_assert(VS == kv::KVScaling::head_static || VS == kv::KVScaling::token_f32 || VS == kv::KVScaling::token_affine,
                "token-granular scalings only");
  /// The mainloop folds this source's scales: tiles() holds Code16 images of the codes, k_* / v_* give the factors.
  static constexpr bool kFolded = true;
  /// fp16 queries with per-token-scaled V (token_f32 / token_affine): there is no 16-bit type wider than the output's
  /// for P · scale, and folding the scale into P then rounds twice where the naive computation rounds once (2.3x its
  /// error on a peaked row, H200): the V images are x̂ itself instead (scale · v16 + min in float32, rounded once to
  /// fp16, the naive computation's values) and the mainloop sees unscaled V (kScalingV = none).
  static constexpr bool kVPreScaled =
      std::is_same_v<T, __half> && (VS == kv::KVScaling::token_f32 || VS == kv::KVScaling::token_affine);
  static constexpr kv::KVScaling kScalingK = KS, kScalingV = kVPreScaled ? kv::KVScaling::none : VS;
  /// Register-direct fragments (sm80/decode_frag.hpp): the staged code rows swizzled, K / V fragments by ldmatrix of
  /// the raw codes and a conversion in registers, no image tile — at head dims 64 / 128 (rows of 2..8 chunks) where the
  /// V images are the codes' (not kVPreScaled: fp16 queries with per-token-scaled V keep the image tile, where x̂ is
  /// formed per element). Head dim 256 keeps the image tile too: at 255 registers the raw words raised its spills
  /// (int4 498 -> 778 B, int8 658 -> 902 B; bench/results/sass-decode-regs-2026-12-02.md).
  static constexpr bool kRegDirect =
      !kVPreScaled && kHeadDim <= 128 && frag::shape_ok(kChunksK) && frag::shape_ok(kChunksV);
  static constexpr int kLdsmK = kChunksK / 2, kLdsmV = kChunksV / 2;  ///< ldmatrix.x4 per warp and block
  static constexpr int kConvBytes = kRegDirect ? 0 : TileKV::kBytes;  ///< else one 16-bit tile: K images, then V
  /// 4-bit K codes under bf16 queries, register-direct: uncentred images 128 + u (frag::FragCode, kOff −128), the
  /// offset absorbed by the zero point (min' = min − 128 · scale'). The scores' products are exact in float32 either
  /// way; the partial sums are ~136 / 8 times larger, so float32 rounds them at ~2^-16 of the score scale — far below
  /// bf16's 2^-9 per key element in the naive computation. (V stays centred: P · scale' is rounded to 16 bits before it
  /// multiplies the image.)
  static constexpr bool kCenteredK =
      !(kRegDirect && KC == kv::KVCode::u4 && kBf16K && KS == kv::KVScaling::token_affine);
  /// The K / V images' kMul / kOff (the fold's factors use them).
  using CodeK = std::conditional_t<kRegDirect, frag::FragCode<KC, kBf16K, kCenteredK>, Code16<KC, T>>;
  using CodeV = std::conditional_t<kRegDirect, frag::FragCode<VC, kBf16V>, Code16<VC, TV>>;
  static_assert(frag::FragCode<KC, kBf16K>::kMul == Code16<KC, T>::kMul &&
                    frag::FragCode<KC, kBf16K>::kOff == Code16<KC, T>::kOff &&
                    frag::FragCode<VC, kBf16V>::kMul == Code16<VC, TV>::kMul &&
                    frag::FragCode<VC, kBf16V>::kOff == Code16<VC, TV>::kOff,
                "the register-direct images are Code16's");
  /// Registers are capped (__launch_bounds__ minimum, 168) to the CTAs per SM the shared memory allows (below).
  /// The CTA's shared memory (sm80::DecodeConfig; checked there): 3 CTAs per SM where 3 of them fit the H100 / H200's
  /// 228 KB (with 1 KB reserved each) with a 3-stage ring: fp8, int4 and int8 at head_dim 128 (int8 with the image
  /// tile: 75776 B, its staged metadata sized for 32-channel groups; with 16-channel groups it was 81920 B, 2 CTAs,
  /// 231 uncapped registers). The ring is then as deep as those 3 CTAs allow (at most 6 stages): a packed stage is
  /// 2–4x smaller than a 16-bit one, and with 3 stages the bytes in flight per SM (3 CTAs x 2 stages ahead: int4
  /// 60 KB, fp8 96 KB) fall short of the 16-bit decode's (2 x 2 x 32 KB). At head_dim 128, register-direct (no
  /// image tile): fp8 4 stages (144 KB in flight), int4 6 (150 KB), int8 3 (its 4th misses 3 CTAs by 3 KB).
  /// The keys-as-M kernel (kKeysMOnly; register-direct sources only) at 4 CTAs per SM where 4 fit: its loop holds
  /// half the accumulators of the 16-row one, and 3 CTAs (12 warps per SM) left its int4 loop latency-bound (H200
  /// run13 call 1: 0.62 instructions issued per scheduler cycle, no warp eligible 38% of cycles, 57% of DRAM).
  static constexpr bool kKeysMOnly = kKeysMOnly_;
  static_assert(!kKeysMOnly || kRegDirect, "the keys-as-M loop reads register-direct fragments");
  static constexpr int kMinCtasPerSm =
      kKeysMOnly && quant_fits(4, kHeadDim, kStageBytes, kConvBytes, 3)
          ? 4
          : (kHeadDim <= 128 && quant_fits(3, kHeadDim, kStageBytes, kConvBytes, 3) ? 3 : 1);
  static constexpr int kStages =
      kMinCtasPerSm < 3 ? 3 : quant_deepest(kMinCtasPerSm, kHeadDim, kStageBytes, kConvBytes, 6);
  static constexpr int kSmemBytes = quant_smem_bytes(kHeadDim, kStageBytes, kConvBytes, kStages);
  /// Affine sources under the cap reload the Q fragments from shared memory per block (registers).
  static constexpr bool kReloadQ =
      (KS == kv::KVScaling::token_affine || VS == kv::KVScaling::token_affine) && kMinCtasPerSm > 1 && !kKeysMOnly;

  const uint8_t* codes[2];
  const uint8_t* meta[2];
  kv::KVHalfFormat fmt[2];
  float head_scale[2];
  int64_t page_stride[2], slot_stride[2], meta_page_stride[2];
  /// every 64-token block lies in one page: pages of >= 64 slots (blocks are 64-aligned), or a contiguous cache of a
  /// whole number of blocks
  bool one_page_blocks;
  uint32_t lane_off[2];  ///< kRegDirect: ldmatrix #0's row offset of this lane in the staged K / V code blocks

  __device__ __forceinline__ KvQuantSource(const DecodeParams& p, int hk) {
    codes[0] = static_cast<const uint8_t*>(p.k_cache) + hk * p.k_head;
    codes[1] = static_cast<const uint8_t*>(p.v_cache) + hk * p.v_head;
    meta[0] = p.k_meta != nullptr ? p.k_meta + hk * p.k_meta_head : nullptr;
    meta[1] = p.v_meta != nullptr ? p.v_meta + hk * p.v_meta_head : nullptr;
    fmt[0] = p.k_format, fmt[1] = p.v_format;
    fmt[0].code = KC, fmt[0].scaling = KS, fmt[1].code = VC, fmt[1].scaling = VS;  // compile-time: switches fold
    head_scale[0] = KS == kv::KVScaling::head_static ? p.k_head_scales[hk] : 1.f;
    head_scale[1] = VS == kv::KVScaling::head_static ? p.v_head_scales[hk] : 1.f;
    page_stride[0] = p.k_page, page_stride[1] = p.v_page;
    slot_stride[0] = p.k_row, slot_stride[1] = p.v_row;
    meta_page_stride[0] = p.k_meta_page, meta_page_stride[1] = p.v_meta_page;
    one_page_blocks = p.page_table != nullptr ? p.page_size_log2 >= kLog2BlockN : p.capacity % kDecodeBlockN == 0;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    lane_off[0] = frag::ldsm_lane_offset(warp, lane, kChunksK);
    lane_off[1] = frag::ldsm_lane_offset(warp, lane, kChunksV);
  }

  /// Byte offset of (page, slot) in half `half`.
  __device__ __forceinline__ int64_t row_offset(int half, int64_t page, int slot) const {
    return page_slot_offset(page, slot, page_stride[half], slot_stride[half]);
  }
  /// Issues the cp.async copies of keys [j0, j0 + kBlockN) — codes of both halves, then their metadata — into the
  /// stage at `dst`. Code slots past seqlen_k are zero-filled, never read (j0 < seqlen_k for every block the kernel
  /// visits, so their page lookup is clamped to the last key): their images are finite constants whose weight is
  /// exactly 0 (masked scores; V factors 0 past the end; static-scale V: P = 0). Their metadata is zero-filled
  /// (one page lookup per row serves its codes and metadata, K and V).
  template <class Locate>
  __device__ __forceinline__ void load(const DecodeParams& p, uint32_t dst, int j0, int seqlen_k,
                                       Locate&& locate) const {
    const int tid = threadIdx.x;
    auto copy_row = [&](int half, uint32_t hdst, int cb, int r, int ch) {
      const int j = j0 + r;
      const bool ok = j < seqlen_k;
      int64_t page;
      int slot;
      locate(ok ? j : seqlen_k - 1, page, slot);
      attn::cp_async_16(hdst + r * cb + staged_chunk(r, ch, cb / 16) * 16, codes[half] + row_offset(half, page, slot) + ch * 16,
                        ok);
    };
    if constexpr (kChunksK == kChunksV && kDecodeThreads % kChunksK == 0) {
      // every thread keeps one 16-byte chunk column and rows tid / chunks + k · step: one page lookup per row, K and V
      constexpr int kStep = kDecodeThreads / kChunksK;
      const int ch = tid % kChunksK, rt = tid / kChunksK;
      static_assert(kDecodeBlockN % kStep == 0, "whole rows per pass");
      // the staged chunk of this thread's rows: kStep a multiple of 8 keeps the swizzle key of rows rt + k · kStep
      static_assert(!kRegDirect || kStep % 8 == 0, "one swizzled chunk per thread");
      const int sch = staged_chunk(rt, ch, kChunksK);
      // the metadata words of the same rows with the same page lookup: thread ch copies words ch, ch + kChunksK, ..
      // of each of its rows (words per token: 1 for token_f32, head_dim / group for token_affine, at most kWords*)
      const int mb_k = fmt[0].meta_bytes_per_unit, mb_v = fmt[1].meta_bytes_per_unit;
      const uint32_t mdst_k = dst + kCodeBlockK, mdst_v = dst + kHalfBytesK + kCodeBlockV;
      if (one_page_blocks) {
        // the block's 64 slots lie in one page (pages of >= 64 slots and 64-aligned blocks; or a contiguous cache of a
        // whole number of blocks): one page lookup for the block, the rows at constant strides from it. Every row's
        // address is inside that page (or the sequence's rows); a row past the end copies nothing (zero-fill).
        int64_t page;
        int slot0;
        locate(j0, page, slot0);
        const uint8_t* kp = codes[0] + row_offset(0, page, slot0 + rt) + ch * 16;
        const uint8_t* vp = codes[1] + row_offset(1, page, slot0 + rt) + ch * 16;
        const uint8_t* mkp = meta[0] + page_slot_offset(page, slot0 + rt, meta_page_stride[0], mb_k);
        const uint8_t* mvp = meta[1] + page_slot_offset(page, slot0 + rt, meta_page_stride[1], mb_v);
        const int64_t kstep = kStep * slot_stride[0], vstep = kStep * slot_stride[1];
#pragma unroll
        for (int k = 0; k < kDecodeBlockN / kStep; ++k) {
          const int r = rt + k * kStep;
          const bool ok = j0 + r < seqlen_k;
          attn::cp_async_16(dst + r * kCodeBytesK + sch * 16, kp, ok);
          attn::cp_async_16(dst + kHalfBytesK + r * kCodeBytesV + sch * 16, vp, ok);
          meta_words<KS, kChunksK>(mdst_k + r * mb_k, mkp, mb_k / 4, ch, ok);
          meta_words<VS, kChunksK>(mdst_v + r * mb_v, mvp, mb_v / 4, ch, ok);
          kp += kstep, vp += vstep, mkp += kStep * mb_k, mvp += kStep * mb_v;
        }
        return;
      }
#pragma unroll
      for (int k = 0; k < kDecodeBlockN / kStep; ++k) {
        // branch-free: a slot past the end is zero-filled and not read (its page looked up at the last key: j0 <
        // seqlen_k for every block the kernel visits, so the lookup stays inside the sequence's pages)
        const int r = rt + k * kStep, j = j0 + r;
        const bool ok = j < seqlen_k;
        int64_t page;
        int slot;
        locate(ok ? j : seqlen_k - 1, page, slot);
        attn::cp_async_16(dst + r * kCodeBytesK + sch * 16, codes[0] + row_offset(0, page, slot) + ch * 16, ok);
        attn::cp_async_16(dst + kHalfBytesK + r * kCodeBytesV + sch * 16, codes[1] + row_offset(1, page, slot) + ch * 16, ok);
        meta_words<KS, kChunksK>(mdst_k + r * mb_k, meta[0] + page_slot_offset(page, slot, meta_page_stride[0], mb_k),
                                 mb_k / 4, ch, ok);
        meta_words<VS, kChunksK>(mdst_v + r * mb_v, meta[1] + page_slot_offset(page, slot, meta_page_stride[1], mb_v),
                                 mb_v / 4, ch, ok);
      }
    } else {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint32_t hdst = dst + (half == 0 ? 0 : kHalfBytesK);
        const int cb = half == 0 ? kCodeBytesK : kCodeBytesV, chunks = cb / 16;
        for (int i = tid; i < kDecodeBlockN * chunks; i += kDecodeThreads) copy_row(half, hdst, cb, i / chunks, i % chunks);
      }
      copy_meta<0>(dst + kCodeBlockK, j0, seqlen_k, locate);
      copy_meta<1>(dst + kHalfBytesK + kCodeBlockV, j0, seqlen_k, locate);
    }
  }
  /// L2 prefetch of keys [j0, j0 + kBlockN) (j0 < seqlen_k) where the block lies in one page: thread i < 64 the K
  /// code row i, thread 64 + i the V one (their 128-byte lines), rows past seqlen_k skipped; the metadata lines of the
  /// block by the first threads of each half. Pages of < 64 slots: nothing (a row-wise page lookup would stall the warp).
  template <class Locate>
  __device__ __forceinline__ void prefetch_l2(int j0, int seqlen_k, Locate&& locate) const {
    if (!one_page_blocks) return;
    // (halves chosen by selects, not by indexing the member arrays with a run-time index: that would put the source
    // in local memory)
    const int tid = threadIdx.x, r = tid % kDecodeBlockN;
    const bool v = tid >= kDecodeBlockN;
    int64_t page;
    int slot0;
    locate(j0, page, slot0);
    if (j0 + r < seqlen_k) {
      const uint8_t* row = (v ? codes[1] : codes[0]) +
                           page_slot_offset(page, slot0 + r, v ? page_stride[1] : page_stride[0], v ? slot_stride[1] : slot_stride[0]);
      constexpr int kRowBytes = kCodeBytesK > kCodeBytesV ? kCodeBytesK : kCodeBytesV;
#pragma unroll
      for (int c = 0; c < kRowBytes; c += 128)
        if (c < (v ? kCodeBytesV : kCodeBytesK)) attn::prefetch_l2(row + c);
    }
    constexpr bool kMetaK = KS == kv::KVScaling::token_f32 || KS == kv::KVScaling::token_affine;
    constexpr bool kMetaV = VS == kv::KVScaling::token_f32 || VS == kv::KVScaling::token_affine;
    if (v ? kMetaV : kMetaK) {
      const int mb = v ? fmt[1].meta_bytes_per_unit : fmt[0].meta_bytes_per_unit;
      const int n = min(kDecodeBlockN, seqlen_k - j0);  // tokens of the block
      if (r * 128 < n * mb)
        attn::prefetch_l2((v ? meta[1] : meta[0]) +
                          page_slot_offset(page, slot0, v ? meta_page_stride[1] : meta_page_stride[0], mb) + r * 128);
    }
  }
  /// Words w = ch, ch + kChunks, .. < words of one token's metadata row (src: its first byte; dst: its staged row),
  /// zero-filled where !ok (a slot past the end: within its own staged row). Nothing for head_static; the page
  /// format's metadata is one unit per token (tokens_per_unit 1, checked by the plan).
  template <kv::KVScaling kS, int kChunks>
  __device__ __forceinline__ static void meta_words(uint32_t dst, const uint8_t* src, int words, int ch, bool ok) {
    constexpr int kWords = quant_meta_max(kS, kHeadDim) / 4;
#pragma unroll
    for (int i = 0; i < (kWords + kChunks - 1) / kChunks; ++i) {
      const int w = ch + i * kChunks;
      if (kS == kv::KVScaling::token_f32 ? w == 0 : w < words) attn::cp_async_4(dst + 4 * w, src + 4 * w, ok);
    }
  }
  /// The metadata of keys [j0, j0 + kBlockN) of half `half` into `mdst` (rows of meta_bytes_per_unit; K's words from
  /// thread 0, V's from thread 64: one word per token each is one copy per thread).
  template <int half, class Locate>
  __device__ __forceinline__ void copy_meta(uint32_t mdst, int j0, int seqlen_k, Locate&& locate) const {
    constexpr kv::KVScaling kS = half == 0 ? KS : VS;
    const int tid = threadIdx.x;
    if constexpr (kS == kv::KVScaling::token_f32) {
      const int r = (tid + half * (kDecodeThreads / 2)) % kDecodeThreads, j = j0 + r;
      if (r < kDecodeBlockN && j < seqlen_k) {
        int64_t page;
        int slot;
        locate(j, page, slot);
        attn::cp_async_4(mdst + r * 4, meta[half] + page * meta_page_stride[half] + fmt[half].meta_offset(slot));
      }
    } else if constexpr (kS == kv::KVScaling::token_affine) {
      const int mb = fmt[half].meta_bytes_per_unit, words = mb / 4;
#pragma unroll 1
      for (int i = (tid + half * (kDecodeThreads / 2)) % kDecodeThreads; i < kDecodeBlockN * words; i += kDecodeThreads) {
        const int r = i / words, w = i % words, j = j0 + r;
        if (j >= seqlen_k) continue;
        int64_t page;
        int slot;
        locate(j, page, slot);
        attn::cp_async_4(mdst + r * mb + 4 * w, meta[half] + page * meta_page_stride[half] + fmt[half].meta_offset(slot) + 4 * w);
      }
    }
  }

  /// Where chunk `ch` of staged code row r (rows of `chunks` chunks) lies: swizzled for the register-direct
  /// fragments (frag::swizzled_chunk), else in place (the image conversion reads rows in order).
  __device__ __forceinline__ static int staged_chunk(int r, int ch, int chunks) {
    return kRegDirect ? frag::swizzled_chunk(r, ch, chunks) : ch;
  }
  /// kRegDirect: this warp's 16 keys of the landed stage as ldmatrix.x4 words of the raw K codes (k_words) / the
  /// transposed raw V codes (v_words), and the MMA B fragments of one 16-channel slice from them (frag::k_fragment /
  /// v_fragment: exact Code16 images, K channels permuted as the Q tile is, V columns as v_channel).
  __device__ __forceinline__ void k_words(uint32_t stage, uint32_t (&w)[kLdsmK][4]) const {
#pragma unroll
    for (int i = 0; i < kLdsmK; ++i) ldmatrix_x4(w[i], stage + (lane_off[0] ^ (32u * i)));
  }
  __device__ __forceinline__ void v_words(uint32_t stage, uint32_t (&w)[kLdsmV][4]) const {
#pragma unroll
    for (int i = 0; i < kLdsmV; ++i) ldmatrix_x4_trans(w[i], stage + kHalfBytesK + (lane_off[1] ^ (32u * i)));
  }
  __device__ __forceinline__ static void k_frag(const uint32_t (&w)[kLdsmK][4], int kk, uint32_t (&bk)[4]) {
    frag::k_fragment<KC, kBf16K, kChunksK, kCenteredK>(w, kk, bk);
  }
  __device__ __forceinline__ static void v_frag(const uint32_t (&w)[kLdsmV][4], int s, uint32_t (&bv)[4]) {
    frag::v_fragment<VC, kBf16V, kChunksV>(w, s, bv);
  }

  /// Generic pointer to a shared-memory address of the stage ring.
  __device__ __forceinline__ static const uint8_t* ptr(uint32_t addr) {
    extern __shared__ __align__(128) char smem[];
    return reinterpret_cast<const uint8_t*>(smem) + (addr - attn::smem_addr(smem));
  }

  /// Rows [r0, r0 + 16) of one staged code block -> Code16 images in the 16-bit tile at `dst` (one warp). A unit is 8 code bytes (8 codes, or
  /// 16 planar 4-bit codes: low nibbles to chunk c, high nibbles to chunk head_dim / 16 + c); lane l converts units
  /// l, l + 32, ...: rows advance by a constant, so the swizzled destinations are a per-lane table of kPeriod entries.
  template <kv::KVCode C, class E>
  __device__ __forceinline__ static void convert_rows(const uint8_t* sc, uint32_t dst, int r0, int lane) {
    using Code = Code16<C, E>;
    constexpr int kBits = kv::code_bits(C);
    static_assert(kBits == 8 || kBits == 4, "8- and 4-bit codes");
    constexpr int kCb = kHeadDim * kBits / 8;
    constexpr int kUnitsPerRow = kCb / 8;
    constexpr int kIters = 16 * kUnitsPerRow / 32;
    static_assert((16 * kUnitsPerRow) % 32 == 0, "whole units per lane");
    auto unit = [&](uint32_t w0, uint32_t w1, uint32_t d_lo, uint32_t d_hi) {
      if constexpr (kBits == 8) {
        uint32_t x[4];
        Code::convert4(w0, x[0], x[1]);
        Code::convert4(w1, x[2], x[3]);
        asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(d_lo), "r"(x[0]), "r"(x[1]), "r"(x[2]), "r"(x[3]));
      } else {
        uint32_t lo0[2], hi0[2], lo1[2], hi1[2];
        Code::convert8(w0, lo0, hi0);
        Code::convert8(w1, lo1, hi1);
        asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(d_lo), "r"(lo0[0]), "r"(lo0[1]), "r"(lo1[0]), "r"(lo1[1]));
        asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(d_hi), "r"(hi0[0]), "r"(hi0[1]), "r"(hi1[0]), "r"(hi1[1]));
      }
    };
    constexpr int kRowStep = 32 % kUnitsPerRow == 0 ? 32 / kUnitsPerRow : 1;  // rows between a lane's units
    constexpr int kPeriod = kRowStep >= 8 ? 1 : 8 / kRowStep;                  // of (row & 7), i.e. of the swizzle
    if constexpr (32 % kUnitsPerRow == 0 && kPeriod <= 4) {  // (head_dim 256, 8-bit: 8 offsets; computed below)
      const int c = lane % kUnitsPerRow, rb = r0 + lane / kUnitsPerRow;
      const uint8_t* src = sc + rb * kCb + 8 * c;
      uint32_t off_lo[kPeriod], off_hi[kPeriod];
#pragma unroll
      for (int i = 0; i < kPeriod; ++i) {
        off_lo[i] = dst + TileKV::offset(rb + i * kRowStep, c) - i * kRowStep * TileKV::kRowBytes;
        off_hi[i] = dst + TileKV::offset(rb + i * kRowStep, kHeadDim / 16 + c) - i * kRowStep * TileKV::kRowBytes;
      }
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        const uint2 w = *reinterpret_cast<const uint2*>(src + it * kRowStep * kCb);
        const uint32_t step = it * kRowStep * TileKV::kRowBytes;
        unit(w.x, w.y, off_lo[it % kPeriod] + step, off_hi[it % kPeriod] + step);
      }
    } else {  // head dims whose row is not a power-of-two number of units (96, 192), or 32 units (256, 8-bit)
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        const int u = lane + 32 * it, c = u % kUnitsPerRow, r = r0 + u / kUnitsPerRow;
        const uint2 w = *reinterpret_cast<const uint2*>(sc + r * kCb + 8 * c);
        unit(w.x, w.y, dst + TileKV::offset(r, c), dst + TileKV::offset(r, kHeadDim / 16 + c));
      }
    }
  }

  /// This warp's 16 keys of the landed stage, K rows 16·warp .. -> Code16 images in the conversion tile at `conv`
  /// (no CTA barrier: each warp converts exactly the rows its own ldmatrix reads). Returns `conv`.
  __device__ __forceinline__ uint32_t tiles(uint32_t stage, uint32_t conv, int, int) const {
    static_assert(!kRegDirect, "register-direct sources have no image tiles");
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r0 = warp * 16;
    __syncwarp();  // this warp's reads of the previous block's V images are done
    convert_rows<KC, T>(ptr(stage), conv, r0, lane);
    __syncwarp();
    return conv;
  }
  /// The same for V, into the same rows of the same tile once the warp's K fragments are loaded (one tile: the
  /// ring's shared memory plus one 16-bit tile fits 3 CTAs per SM at head_dim 128).
  __device__ __forceinline__ void tiles_v(uint32_t stage, uint32_t conv, int j0, int seqlen_k) const {
    static_assert(!kRegDirect, "register-direct sources have no image tiles");
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r0 = warp * 16;
    __syncwarp();  // this warp's K ldmatrix reads are done
    convert_rows<VC, TV>(ptr(stage) + kHalfBytesK, conv, r0, lane);
    if constexpr (kVPreScaled) {
      __syncwarp();
      scale_rows_v(stage, conv, r0, lane, seqlen_k - j0);
    }
    __syncwarp();
  }
  /// kVPreScaled: rows [r0, r0 + 16) of the V image tile (fp16, natural channel order) -> x̂ = scale' · v16 + min'
  /// (float32, rounded once). Slots past the sequence's end (row >= valid; their metadata is not staged) give x̂ = 0.
  __device__ __forceinline__ void scale_rows_v(uint32_t stage, uint32_t conv, int r0, int lane, int valid) const {
    constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
#pragma unroll 2
    for (int u = lane; u < 16 * kChunks; u += 32) {
      const int r = r0 + u / kChunks, c = u % kChunks;
      float sc = 0.f, mn = 0.f;
      if (r >= valid) {
      } else if constexpr (VS == kv::KVScaling::token_f32) {
        sc = *reinterpret_cast<const float*>(ptr(stage) + kHalfBytesK + kCodeBlockV + r * 4) * (1.0f / CodeV::kMul);
      } else {
        const float2 f = affine_factors<1>(stage, r, c * 8 / fmt[1].group);
        sc = f.x, mn = f.y;
      }
      const uint32_t addr = conv + TileKV::offset(r, c);
      uint32_t w[4];
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "r"(addr));
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
        const __half2 x = __floats2half2_rn(fmaf(sc, v.x, mn), fmaf(sc, v.y, mn));
        w[i] = *reinterpret_cast<const uint32_t*>(&x);
      }
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]));
    }
  }

  // ---- factors (float32; x̂ = scale · (v16 / kMul + kOff) + min) ------------------------------------------------
  /// K, head_static: the per-head score factor.
  __device__ __forceinline__ float k_head_factor() const { return head_scale[0] * (1.0f / CodeK::kMul); }
  /// V, head_static: the per-head output factor.
  __device__ __forceinline__ float v_head_factor() const { return head_scale[1] * (1.0f / CodeV::kMul); }
  /// token_f32: the factors of block rows r, r + 1 (r even) of half `half`.
  template <int half>
  __device__ __forceinline__ float2 token_factors(uint32_t stage, int r) const {
    constexpr float kInv = 1.0f / (half == 0 ? CodeK::kMul : CodeV::kMul);
    const float2 f = *reinterpret_cast<const float2*>(ptr(stage) + (half == 0 ? kCodeBlockK : kHalfBytesK + kCodeBlockV) + r * 4);
    return make_float2(f.x * kInv, f.y * kInv);
  }
  /// token_f32: the factor of block row r of half `half` (the keys-as-M loop's rows g, g + 8).
  template <int half>
  __device__ __forceinline__ float token_factor(uint32_t stage, int r) const {
    constexpr float kInv = 1.0f / (half == 0 ? CodeK::kMul : CodeV::kMul);
    return *reinterpret_cast<const float*>(ptr(stage) + (half == 0 ? kCodeBlockK : kHalfBytesK + kCodeBlockV) + r * 4) *
           kInv;
  }
  /// token_affine: (scale', min') of block row r, channel group gi of half `half`: x̂ = scale' · v16 + min'.
  template <int half>
  __device__ __forceinline__ float2 affine_factors(uint32_t stage, int r, int gi) const {
    using Code = std::conditional_t<half == 0, CodeK, CodeV>;
    const uint8_t* m = ptr(stage) + (half == 0 ? kCodeBlockK : kHalfBytesK + kCodeBlockV) +
                       r * fmt[half].meta_bytes_per_unit + 4 * gi;
    const uint32_t sm = *reinterpret_cast<const uint32_t*>(m);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&sm));  // (scale, min)
    return make_float2(f.x * (1.0f / Code::kMul), fmaf(f.x, Code::kOff, f.y));
  }
  __device__ __forceinline__ int group(int half) const { return fmt[half].group; }
};

}  // namespace flashkv::cuda::sm80
