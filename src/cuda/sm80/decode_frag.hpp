// Register-direct MMA fragments of packed KV codes for the quantized split-KV decode (sm80/decode_kernel.cuh with a
// KvQuantSource whose kRegDirect is set): the staged code bytes go straight from shared memory into the m16n8k16 B
// fragments — one ldmatrix.x4 (K) or ldmatrix.x4.trans (V) of the RAW codes per two 16-byte chunks of a warp's 16
// keys, then a few PRMT / LOP3 / paired-half operations per two codes in registers — instead of writing exact 16-bit
// images to a shared tile and reading them back (bench/results/sass-decode-regs-2026-12-02.md).
//
// Fragment layouts (PTX ISA, mma.m16n8k16; lane = 4g + t): A a0 = (row g, k 2t..2t+1), a2 = (g, k 2t+8..2t+9)
// (a1 / a3: row g + 8); B b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g); C c0, c1 = (g, n 2t..2t+1).
//
// K (scores = Q · Kᵀ; B[k = channel][n = key]). ldmatrix (b16 elements) of 8 key rows × one 16-byte code chunk gives
// lane (g, t) bytes 4t .. 4t + 3 of key g's chunk. The channels of every 16-channel slice are PERMUTED, in K and in Q
// alike: mma k index j of a slice is its channel k_channel(j) = 4t + 2e + h for j = 2t + e + 8h, so bytes 0, 2 of the
// word are j = 2t, 2t + 1 (b0) and bytes 1, 3 are j = 2t + 8, 2t + 9 (b1). The Q tile is permuted the same way once
// per CTA (permute_q_words); a permutation inside a slice keeps every channel group (>= 16 channels, slice-aligned)
// whole, so the folded per-group scales, zero points and Σq are unchanged. 4-bit planar codes (byte i: channel i low
// nibble, channel head_dim/2 + i high nibble): one word holds slice c (low nibbles) and slice c + head_dim/32 (high).
// V (out = P · V; B[k = key][n = channel]). ldmatrix.trans of 8 key rows × one chunk gives lane (g, t) the b16
// elements g of keys 2t and 2t + 1: code bytes 2g, 2g + 1 of both keys; bytes 0, 2 are channel 2g of keys 2t, 2t + 1
// (a b0 / b1 pair), bytes 1, 3 channel 2g + 1. So the n8 tile 2s + π of 16-channel slice s holds channel
// 16s + 2n + π in column n, and accumulator o[dt][e] is channel v_channel(dt, e, t) (the epilogue writes it there).
// Keys keep their natural order (P's A operand from the scores as before); V channel groups stay whole per slice.
// Both read 8 rows × one logical chunk per matrix: the staged code rows are XOR-swizzled in 16-byte chunks
// (swizzled_chunk) so those 8 rows fall in 8 different bank groups (no conflicts), for rows of 2..16 chunks.
//
// The images are Code16's (sm80/decode_code16.cuh) bit for bit: v16 = (code − kOff) · kMul, exact; the host emulates
// every step here (tests/kvcache/test_kv_decode_frag.cpp: conversions for all codes, and one warp's fragments through
// an emulated ldmatrix + mma against the direct products).
#pragma once

#include <cstdint>

#include "core/float16.hpp"
#include "core/host_device.hpp"
#include "kvcache/format/traits.hpp"

namespace flashkv::cuda::sm80::frag {

/// 16-byte chunks per staged code row (head_dim · bits / 8 bytes).
FLASHKV_HD constexpr int code_chunks(int head_dim, int bits) { return head_dim * bits / 8 / 16; }
/// Row shapes of the register-direct path: 2, 4, 8 or 16 chunks (head dims 64 / 128 / 256 at 4 or 8 bits; others
/// keep the image-tile path).
FLASHKV_HD constexpr bool shape_ok(int chunks) { return chunks == 2 || chunks == 4 || chunks == 8 || chunks == 16; }
/// The XOR key of block row `row` (rows of `chunks` chunks): the chunk-within-128-byte-line bits a row's chunks are
/// XORed with, so that 8 consecutive rows' same logical chunk lie in 8 different 16-byte bank groups.
FLASHKV_HD constexpr int swizzle_key(int row, int chunks) {
  return chunks >= 8 ? (row & 7) : ((row / (8 / chunks)) & (chunks - 1));
}
/// Physical chunk of logical chunk `chunk` of block row `row`.
FLASHKV_HD constexpr int swizzled_chunk(int row, int chunk, int chunks) { return chunk ^ swizzle_key(row, chunks); }

/// Channel (within its 16-channel slice) at mma k index j of the permuted K / Q slices.
FLASHKV_HD constexpr int k_channel(int j) { return 4 * ((j & 7) >> 1) + 2 * (j & 1) + (j >> 3); }
/// Channel of the P·V accumulator o[dt][e] (e: 0..3, column 2t + (e & 1)) of quad lane t.
FLASHKV_HD constexpr int v_channel(int dt, int e, int t) { return 16 * (dt >> 1) + 4 * t + 2 * (e & 1) + (dt & 1); }

/// ldmatrix.x4 number i of a warp's code fragments: lane `lane` addresses matrix m = lane / 8 = keys
/// warp·16 + 8·(m & 1) + (lane % 8), logical chunk 2i + (m >> 1); its register m is that matrix's fragment.
FLASHKV_HD constexpr int ldsm_row(int warp, int lane) { return warp * 16 + 8 * ((lane >> 3) & 1) + (lane & 7); }
FLASHKV_HD constexpr int ldsm_chunk(int i, int lane) { return 2 * i + (lane >> 4); }
/// Byte offset of ldmatrix #0's row for `lane` from the staged code block; #i's is lane_offset ^ (32 i) (the swizzle
/// XORs low chunk bits, 2i + (m >> 1) = 2i ^ (m >> 1), and a row is a power-of-two number of chunks).
FLASHKV_HD constexpr uint32_t ldsm_lane_offset(int warp, int lane, int chunks) {
  return static_cast<uint32_t>(ldsm_row(warp, lane) * chunks * 16 +
                               16 * ((lane >> 4) ^ swizzle_key(ldsm_row(warp, lane), chunks)));
}

/// PTX prmt.b32 (default mode): byte i of the result is byte sel[4i..4i+2] of {b, a} (a = bytes 0..3), or its sign
/// replicated where sel[4i + 3] is set.
FLASHKV_HD uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
#else
  const uint64_t x = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t d = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t s = (sel >> (4 * i)) & 0xfu;
    uint32_t byte = static_cast<uint32_t>(x >> (8 * (s & 7u))) & 0xffu;
    if (s & 8u) byte = (byte & 0x80u) ? 0xffu : 0u;
    d |= byte << (8 * i);
  }
  return d;
#endif
}

/// (a & mask) | magic in one LOP3 (the compiler splits it in two where both are immediates).
template <uint32_t kMask, uint32_t kMagic>
FLASHKV_HD uint32_t and_or(uint32_t a) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(d) : "r"(a), "n"(kMask), "n"(kMagic));
  return d;
#else
  return (a & kMask) | kMagic;
#endif
}

/// a · b + c on two 16-bit lanes (bf16 or fp16 bits; round to nearest; subnormals honoured). The host computes it in
/// float: exact for the conversions below (every result is a representable small integer or fp8 value).
template <bool kBf16>
FLASHKV_HD uint32_t hfma2(uint32_t a, uint32_t b, uint32_t c) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  if constexpr (kBf16) {
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  } else {
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  }
  return d;
#else
  uint32_t d = 0;
  for (int i = 0; i < 2; ++i) {
    auto f = [&](uint32_t v) {
      const auto h = static_cast<uint16_t>(v >> (16 * i));
      return kBf16 ? bf16_to_float(h) : fp16_to_float(h);
    };
    const float r = f(a) * f(b) + f(c);
    d |= static_cast<uint32_t>(kBf16 ? float_to_bf16(r) : float_to_fp16(r)) << (16 * i);
  }
  return d;
#endif
}

/// Exact 16-bit images of code bytes in fragment order: v16 = (code_value − kOff) · kMul, the values of
/// Code16<C, bf16 ? bfloat16 : float16>; with kCentered = false (4-bit codes, bf16) the uncentred 128 + u (kOff −128:
/// one LOP3 per two codes, no paired fma) for K halves whose zero point absorbs the offset.
template <kv::KVCode C, bool kBf16, bool kCentered = true>
struct FragCode {
  static_assert(C == kv::KVCode::e4m3 || C == kv::KVCode::e5m2 || C == kv::KVCode::u8 || C == kv::KVCode::u4,
                "fp8 and 8 / 4-bit integer codes");
  static_assert(kCentered || (C == kv::KVCode::u4 && kBf16), "uncentred images: 4-bit codes under bf16");
  static constexpr float kMul = (C == kv::KVCode::e4m3 && !kBf16) ? 1.0f / 256.0f : 1.0f;
  static constexpr float kOff =
      C == kv::KVCode::u8 ? 128.0f : (C == kv::KVCode::u4 ? (kCentered ? 8.0f : -128.0f) : 0.0f);
  static constexpr int kBits = kv::code_bits(C);

  /// 8-bit codes: bytes 0, 2 of w -> x02 (byte 0 in the low half), bytes 1, 3 -> x13.
  FLASHKV_HD static void pairs8(uint32_t w, uint32_t& x02, uint32_t& x13) {
    static_assert(kBits == 8, "pairs8 is for 8-bit codes");
    if constexpr (C == kv::KVCode::e5m2 && !kBf16) {
      x02 = prmt(w, 0u, 0x2404u), x13 = prmt(w, 0u, 0x3414u);  // [0][b0][0][b2]: the fp16 bits
    } else if constexpr (C == kv::KVCode::e4m3 || C == kv::KVCode::e5m2) {
      // lanes [sign x 8][byte] (sign replication), shifted so the magnitude sits under the exponent field; the
      // replicated sign lands on bit 15, the byte's own sign bit and the low lane's spill are masked away
      constexpr int kShift = C == kv::KVCode::e5m2 ? 5 : (kBf16 ? 4 : 7);
      constexpr uint32_t kMask = C == kv::KVCode::e5m2 ? 0x8fe08fe0u : (kBf16 ? 0x87f087f0u : 0xbf80bf80u);
      x02 = (prmt(w, 0u, 0xa280u) << kShift) & kMask;
      x13 = (prmt(w, 0u, 0xb391u) << kShift) & kMask;
      if constexpr (kBf16) {  // value · 2^-120 (e4m3) / 2^-112 (e5m2), subnormals included: times 2^120 / 2^112
        constexpr uint32_t kUp = C == kv::KVCode::e5m2 ? 0x77807780u : 0x7b807b80u;
        x02 = hfma2<true>(x02, kUp, 0x80008000u), x13 = hfma2<true>(x13, kUp, 0x80008000u);
      }
    } else if constexpr (kBf16) {  // u8: (0x43 | low 7 bits) − (0x43 | ~bit 7 << 7) = u − 128, both exact bf16
      const uint32_t lo7 = w & 0x7f7f7f7fu, hi = ~w & 0x80808080u;
      const uint32_t y02 = prmt(lo7, 0x43434343u, 0x4240u), y13 = prmt(lo7, 0x43434343u, 0x4341u);
      const uint32_t z02 = prmt(hi, 0x43434343u, 0x4240u), z13 = prmt(hi, 0x43434343u, 0x4341u);
      x02 = hfma2<true>(z02, 0xbf80bf80u, y02), x13 = hfma2<true>(z13, 0xbf80bf80u, y13);
    } else {  // u8 -> fp16: (1024 + u) − 1152
      x02 = hfma2<false>(prmt(w, 0x64646464u, 0x4240u), 0x3c003c00u, 0xe480e480u);
      x13 = hfma2<false>(prmt(w, 0x64646464u, 0x4341u), 0x3c003c00u, 0xe480e480u);
    }
  }
  /// 4-bit planar codes: x[0] = low nibbles of bytes 0, 2; x[1] = low nibbles of bytes 1, 3; x[2], x[3] the high
  /// nibbles of the same bytes (u − 8 each: (magic | u) then one paired fma).
  FLASHKV_HD static void pairs4(uint32_t w, uint32_t (&x)[4]) {
    static_assert(C == kv::KVCode::u4, "pairs4 is for 4-bit codes");
    if constexpr (!kCentered) {  // 0x4300 | u = 128 + u
      x[0] = and_or<0x000f000fu, 0x43004300u>(w), x[1] = and_or<0x000f000fu, 0x43004300u>(w >> 8);
      x[2] = and_or<0x000f000fu, 0x43004300u>(w >> 4), x[3] = and_or<0x000f000fu, 0x43004300u>(w >> 12);
    } else if constexpr (kBf16) {  // 0x4300 | u = 128 + u; · 1 − 136
      x[0] = hfma2<true>(and_or<0x000f000fu, 0x43004300u>(w), 0x3f803f80u, 0xc308c308u);
      x[1] = hfma2<true>(and_or<0x000f000fu, 0x43004300u>(w >> 8), 0x3f803f80u, 0xc308c308u);
      x[2] = hfma2<true>(and_or<0x000f000fu, 0x43004300u>(w >> 4), 0x3f803f80u, 0xc308c308u);
      x[3] = hfma2<true>(and_or<0x000f000fu, 0x43004300u>(w >> 12), 0x3f803f80u, 0xc308c308u);
    } else {  // 0x6400 | u = 1024 + u, − 1032; high nibbles in place: 0x6400 | 16u = 1024 + 16u, / 16 − 72
      const uint32_t w8 = w >> 8;
      x[0] = hfma2<false>(and_or<0x000f000fu, 0x64006400u>(w), 0x3c003c00u, 0xe408e408u);
      x[1] = hfma2<false>(and_or<0x000f000fu, 0x64006400u>(w8), 0x3c003c00u, 0xe408e408u);
      x[2] = hfma2<false>(and_or<0x00f000f0u, 0x64006400u>(w), 0x2c002c00u, 0xd480d480u);
      x[3] = hfma2<false>(and_or<0x00f000f0u, 0x64006400u>(w8), 0x2c002c00u, 0xd480d480u);
    }
  }
};

/// K fragments of 16-channel slice kk (bk[0], bk[1]: keys 0..7 of the warp, b0 / b1; bk[2], bk[3]: keys 8..15) from
/// the warp's ldmatrix.x4 words w (rows of kChunks code chunks).
template <kv::KVCode C, bool kBf16, int kChunks, bool kCentered = true>
FLASHKV_HD void k_fragment(const uint32_t (&w)[kChunks / 2][4], int kk, uint32_t (&bk)[4]) {
  using Code = FragCode<C, kBf16, kCentered>;
  for (int nt = 0; nt < 2; ++nt) {
    if constexpr (Code::kBits == 8) {
      Code::pairs8(w[kk / 2][2 * (kk & 1) + nt], bk[2 * nt], bk[2 * nt + 1]);
    } else {
      const int c = kk % kChunks, plane = kk / kChunks;
      uint32_t x[4];
      Code::pairs4(w[c / 2][2 * (c & 1) + nt], x);
      bk[2 * nt] = x[2 * plane], bk[2 * nt + 1] = x[2 * plane + 1];
    }
  }
}
/// V fragments of 16-channel slice s from the warp's ldmatrix.x4.trans words w: bv[0], bv[1] = b0, b1 of n8 tile 2s
/// (channels 16s + 2n), bv[2], bv[3] of tile 2s + 1 (16s + 2n + 1).
template <kv::KVCode C, bool kBf16, int kChunks>
FLASHKV_HD void v_fragment(const uint32_t (&w)[kChunks / 2][4], int s, uint32_t (&bv)[4]) {
  using Code = FragCode<C, kBf16>;
  if constexpr (Code::kBits == 8) {
    Code::pairs8(w[s / 2][2 * (s & 1)], bv[0], bv[2]);      // keys 0..7 of the warp
    Code::pairs8(w[s / 2][2 * (s & 1) + 1], bv[1], bv[3]);  // keys 8..15
  } else {
    const int c = s % kChunks, plane = s / kChunks;
    uint32_t x0[4], x1[4];
    Code::pairs4(w[c / 2][2 * (c & 1)], x0);
    Code::pairs4(w[c / 2][2 * (c & 1) + 1], x1);
    bv[0] = x0[2 * plane], bv[1] = x1[2 * plane], bv[2] = x0[2 * plane + 1], bv[3] = x1[2 * plane + 1];
  }
}

/// Keys-as-M (sm80/decode_keys_m.cuh: Sᵀ = K·Qᵀ, Oᵀ = Vᵀ·Pᵀ). The A operand of one 16-key × 16-channel tile from the
/// B fragments of its two n8 halves (k_fragment's bk / v_fragment's bv: b0, b1 of keys 0..7 — V: of n8 tile 2s — then
/// of keys 8..15 / tile 2s + 1): A rows g and g + 8 are those halves' column g, so a = {b[0], b[2], b[1], b[3]}.
FLASHKV_HD void keys_m_operand(const uint32_t (&b)[4], uint32_t (&a)[4]) {
  a[0] = b[0], a[1] = b[2], a[2] = b[1], a[3] = b[3];
}
/// Qᵀ's B operand of slice kk from the Q tile's A fragment (rows 0..7: the CTA's <= 8 query rows): {a0, a2}.
FLASHKV_HD void keys_m_q_operand(const uint32_t (&qa)[4], uint32_t (&b)[2]) { b[0] = qa[0], b[1] = qa[2]; }
/// Channel of row `row` (0..15) of the Oᵀ accumulator of 16-channel slice s: the V A operand's row g is column g of n8
/// tile 2s (channel 16s + 2g), row g + 8 column g of tile 2s + 1 (16s + 2g + 1).
FLASHKV_HD constexpr int keys_m_channel(int s, int row) { return 16 * s + 2 * (row % 8) + row / 8; }

/// One row's 16-channel Q slice, natural order (w[i]: channels 2i, 2i + 1) -> the permuted order the K fragments
/// expect (n[i]: mma k indices 2i, 2i + 1, i.e. channels k_channel(2i), k_channel(2i + 1)).
FLASHKV_HD void permute_q_words(const uint32_t (&w)[8], uint32_t (&n)[8]) {
  for (int t = 0; t < 4; ++t) {
    n[t] = prmt(w[2 * t], w[2 * t + 1], 0x5410u);      // channels 4t, 4t + 2
    n[4 + t] = prmt(w[2 * t], w[2 * t + 1], 0x7632u);  // channels 4t + 1, 4t + 3
  }
}

}  // namespace flashkv::cuda::sm80::frag
