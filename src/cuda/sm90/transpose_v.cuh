// In-shared-memory transpose of an FP8 V tile for the P V GEMM of the FP8 forward (sm90/mainloop_fwd_tma_ws_fp8.cuh),
// run by the producer warpgroup after the TMA load (FA3 §3.3 / hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp do the same
// with LDSM.T + STSM; this is our own formulation).
//
// Why: wgmma with 8-bit operands reads both operands K-major from shared memory (PTX ISA: no transpose for .e4m3), and
// for O += P V the contraction runs over the keys, so B = V^T must have the keys contiguous, while V arrives as
// [keys][head_dim] rows. The tile is rewritten as Vt [head_dim][keys] (SwizzledTile8<kHeadDim, kBlockN, kWT>).
//
// The key order inside every 32-key group is permuted, Vt[d][32c + k] = V[32c + perm(k)][d] with
//   perm(16h + 4t + e) = 16h + 8 * (e >> 1) + 2t + (e & 1)        (h < 2, t < 4, e < 4),
// which is exactly the order in which a thread of the S = Q K^T accumulator already holds P: lane 4g + t owns keys
// 8n + 2t, 8n + 2t + 1 of row g (and g + 8), and the wgmma k32 8-bit A fragment wants k = 4t .. 4t + 3 (+16) there.
// Permuting the keys of P and of V alike leaves P V unchanged, so the consumers convert P to e4m3 in registers with
// no shuffles (FA3 shuffles P instead, permute_Aregs_fp8).
//
// One unit = 32 keys x 16 head-dim columns (512 bytes) per warp and instruction triple: ldmatrix.x4.trans (b16) loads
// four 8 x 8 b16 matrices (keys 32c + 8j .. +7, columns 16 delta .. +15), so lane 4g + t holds, per matrix j, the bytes
// V[n][2g], V[n][2g+1], V[n+1][2g], V[n+1][2g+1] with n = 32c + 8j + 2t; two byte permutes per matrix pair give the
// 4-byte rows Vt[2g][32c + 16h + 4t ..] and Vt[2g+1][..] of the permuted order; stmatrix.x4 writes them.
#pragma once

#include <cstdint>

#include "cuda/sm90/wgmma.cuh"

namespace flashkv::cuda::sm90 {

__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void stsm_x4(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}

/// Position of Vt column k (0 <= k < 32 within its group) in V: perm(k) above.
__host__ __device__ constexpr int vt_key_of(int k) {
  return (k / 16) * 16 + 8 * ((k % 4) / 2) + 2 * ((k % 16) / 4) + (k % 2);
}

/// Transposes the V tile at shared address `src` (SrcTile: SwizzledTile8<kBlockN keys, kHeadDim bytes, 128 or 64>)
/// into `dst` (DstTile: SwizzledTile8<kHeadDim, kBlockN, 32>: one 32-byte-swizzled panel per 32 keys) in the permuted
/// key order. Called by all 128 threads of a warpgroup; warp w takes the 16-column chunks w, w + 4, ...; no barrier
/// inside. The lane's addresses are affine in the unit (c, q) except for the source chunk's swizzle bit of q, so
/// they are two source offsets and one destination offset per thread plus immediates; they are rebuilt from %tid
/// on every call (volatile) so that the 24-register producer does not keep them live between tiles. kIlp units are
/// loaded before the first of them is stored (with 1, every stmatrix waits for the ldmatrix just before it).
template <class SrcTile, class DstTile, int kIlp = 1>
__device__ __forceinline__ void transpose_v_tile(uint32_t src, uint32_t dst) {
  static_assert(kIlp >= 1 && kIlp <= 4, "1 to 4 units in flight (the producer has 24 registers)");
  constexpr int kKeys = SrcTile::kRows, kDim = SrcTile::kCols, kW = SrcTile::kW;
  static_assert(DstTile::kRows == kDim && DstTile::kCols == kKeys && DstTile::kW == 32, "Vt: V's transpose, SW32");
  static_assert(kKeys % 32 == 0 && kDim % 64 == 0, "units of 32 keys x 16 columns, four warps over the columns");
  static_assert(kW == 128 || kW == 64, "source rows of 128 or 64 bytes");
  uint32_t tid;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tid));
  const uint32_t warp = (tid / 32) % 4, lane = tid % 32;
  const uint32_t j = lane / 8, r8 = lane % 8;  // this lane's ldmatrix / stmatrix row address: matrix j, row r8
  // Source: key n = 32c + 8j + r8 of 16-byte chunk delta = warp + 4q, i.e. SrcTile::offset(n, delta); the swizzle
  // of n is r8's (128 B: r8; 64 B: (r8 >> 1) & 3).
  const uint32_t src_row = (8 * j + r8) * kW;
  uint32_t src_x[2];
  if constexpr (kW == 128) {  // chunk (warp + 4 (q & 1)) ^ r8 of panel q / 2
    src_x[0] = src + src_row + (((warp ^ r8) & 7) << 4);
    src_x[1] = src + src_row + ((((warp + 4) ^ r8) & 7) << 4);
  } else {  // chunk warp ^ ((r8 >> 1) & 3) of panel q
    src_x[0] = src_x[1] = src + src_row + ((warp ^ ((r8 >> 1) & 3)) << 4);
  }
  // Destination: Vt row d = 16 delta + 2 r8 + (j & 1), chunk (j >> 1) of the panel of keys 32c .. 32c + 31; the
  // 32-byte swizzle of d is (d >> 2) & 1 = (r8 >> 1) & 1.
  const uint32_t dst_x = dst + 512 * warp + 32 * (2 * r8 + (j & 1)) + ((((j >> 1) ^ (r8 >> 1)) & 1) << 4);
  // The units (q, c), flattened as u = q * kUnitsC + c, in groups of kIlp: the group's ldmatrix first, then the
  // permutes and stmatrix, so that kIlp loads are in flight at once (the asm is volatile: source order is kept).
  constexpr int kUnitsC = kKeys / 32, kUnits = (kDim / 64) * kUnitsC;
  auto src_of = [&](int u) {
    const int q = u / kUnitsC, c = u % kUnitsC;
    return src_x[q & 1] + (kW == 128 ? (q / 2) * SrcTile::kPanelBytes : q * SrcTile::kPanelBytes) + 32 * c * kW;
  };
  auto dst_of = [&](int u) {
    const int q = u / kUnitsC, c = u % kUnitsC;
    return dst_x + 512 * 4 * q + c * DstTile::kPanelBytes;
  };
#pragma unroll
  for (int u0 = 0; u0 < kUnits; u0 += kIlp) {
    uint32_t v[kIlp][4];
#pragma unroll
    for (int i = 0; i < kIlp; ++i)
      if (u0 + i < kUnits) ldsm_x4_trans(src_of(u0 + i), v[i]);
#pragma unroll
    for (int i = 0; i < kIlp; ++i) {
      if (u0 + i < kUnits) {
        uint32_t w[4];
        w[0] = __byte_perm(v[i][0], v[i][1], 0x6420);  // Vt row 16 delta + 2g,     keys 32c + 4t .. (h = 0)
        w[1] = __byte_perm(v[i][0], v[i][1], 0x7531);  // Vt row 16 delta + 2g + 1, (h = 0)
        w[2] = __byte_perm(v[i][2], v[i][3], 0x6420);  // (h = 1)
        w[3] = __byte_perm(v[i][2], v[i][3], 0x7531);
        stsm_x4(dst_of(u0 + i), w);
      }
    }
  }
}

}  // namespace flashkv::cuda::sm90
