// The tile tables of the CUDA kernel families, one constexpr function per (kind, arch), read by the kernels'
// launchers (which turn an entry into a kernel configuration type) and by the host (workspace sizes, path reports), so
// host and device cannot disagree (FA3's tile_size.h). Plain C++ (no CUDA): host .cpp files include it.
//
// Entries were chosen from the sweeps in bench/gpu/tune (H200, bench/results/h200-tune-*.md). A head dim without an
// entry gets the default rule at the end of each function, so a new head dim is one line in
// src/cuda/generate_instantiations.py (HEAD_DIMS); a tuned entry is one more line here.
#pragma once

#include <cstdint>

namespace flashkv::cuda {

/// Forward tile: kBlockM queries x kBlockN keys, warps (sm80) / warpgroups are kBlockM / 64 (sm90).
struct FwdTile {
  int block_m, block_n, warps;
};
constexpr bool same_tile(FwdTile a, FwdTile b) {
  return a.block_m == b.block_m && a.block_n == b.block_n && a.warps == b.warps;
}
/// The sm80 forward: `main`; `causal` where square tiles win under causal masking (less waste on the diagonal);
/// `small` when the device cannot give a block main's shared memory (A100: 163 KiB, sm_86/sm_89: 99 KiB, against
/// 227 KiB on Hopper).
struct FwdTilesSm80 {
  FwdTile main, causal, small;
};
constexpr FwdTilesSm80 fwd_tiles_sm80(int head_dim) {
  switch (head_dim) {
    case 64: return {{128, 128, 4}, {128, 128, 4}, {128, 128, 4}};
    case 96: return {{128, 64, 4}, {128, 64, 4}, {128, 64, 4}};
    case 128: return {{128, 64, 4}, {128, 64, 4}, {128, 64, 4}};
    case 192: return {{128, 64, 8}, {128, 64, 8}, {128, 64, 8}};
    case 256: return {{128, 128, 8}, {64, 64, 4}, {64, 64, 4}};  // 192 KiB; causal / small 96 KiB
    default: {
      const FwdTile t = head_dim <= 128 ? FwdTile{128, 64, 4} : FwdTile{128, 64, 8};
      return {t, t, t};
    }
  }
}
/// The sm90 (wgmma) forward: one configuration; head dims without one (available = false) run sm80 everywhere.
struct FwdTileSm90 {
  bool available;
  int block_m, block_n;
};
constexpr FwdTileSm90 fwd_tile_sm90(int head_dim) {
  switch (head_dim) {
    case 64: return {true, 128, 64};
    case 128: return {true, 128, 128};
    case 256: return {true, 128, 64};
    default: return {head_dim % 64 == 0 && head_dim <= 256, 128, 64};
  }
}
/// The TMA warp-specialized sm90 forward (family sm90ws, sm90/mainloop_fwd_tma_ws.cuh): kBlockM = 128 (two consumer
/// warpgroups of 64 rows), kBlockN keys per K/V stage, kStages-deep K and V rings; one producer warpgroup. Chosen from
/// the kBlockN sweep on the H200 (bench/results/h200-v3-2026-12-01.md): hd64 N192 (113 KiB), hd128 N176 (209 KiB),
/// hd256 N80 (225 KiB); 3 stages measured no better. `block_n_softcap`: the softcap kernels (tanh per score) spill
/// in the K/V loop at those widths (ptxas: 152-236 bytes at 240 registers), so they take the widest tile that does
/// not (hd64 N160, hd128 N144, hd256 N64; not yet timed). P V is one wgmma of N = head_dim and the tiles are
/// 64-column panels, so head dims must be multiples of 64 up to 256 (96 runs padded on 128, 192 has no tile yet).
struct FwdTileSm90Ws {
  bool available;
  int block_m, block_n, block_n_softcap, stages;
};
constexpr FwdTileSm90Ws fwd_tile_sm90ws(int head_dim) {
  switch (head_dim) {
    case 64: return {true, 128, 192, 160, 2};
    case 128: return {true, 128, 176, 144, 2};
    case 256: return {true, 128, 80, 64, 2};
    default: return {false, 128, 64, 64, 2};
  }
}
/// The FP8 (e4m3) sm90ws forward (sm90/mainloop_fwd_tma_ws_fp8.cuh): kBlockM = 128, kBlockN keys (multiples of 32:
/// the k32 wgmma of P V), kStages-deep K, raw V and transposed V rings. The widest tiles whose K/V loop keeps the
/// unmasked path free of local memory at 240 registers (SASS; FA3's hd128 N224 and hd256 N128 spill in the loop
/// here): hd64 N192 (81 KiB), hd128 N192 (161 KiB), hd256 N96 (177 KiB); softcap (a tanh per score) N160 / N160 / N64.
/// Not yet tuned on the H200.
constexpr FwdTileSm90Ws fwd_tile_sm90ws_fp8(int head_dim) {
  switch (head_dim) {
    case 64: return {true, 128, 192, 160, 2};
    case 128: return {true, 128, 192, 160, 2};
    case 256: return {true, 128, 96, 64, 2};
    default: return {false, 128, 64, 64, 2};
  }
}
/// The FA1-loop-order forward (progression benchmark): fixed 64 x 64, 4 warps.
constexpr FwdTile fwd_v1_tile() { return {64, 64, 4}; }

/// sm80 backward: kBlockM, kBlockN, warps, the warp grids (phase 1 key-row warps, phase 2 key-row warps, phase 3
/// query-row warps) and the dQ column passes (sm80/mainloop_bwd.cuh, BwdConfig).
struct BwdTile {
  int block_m, block_n, warps, nw1, nw2, mw3, dq_chunks;
};
/// `small`: when the device cannot give a block main's shared memory (hd64: 162 KiB -> 97 KiB, the first release's
/// tiles, so sm_86/sm_89 keep working; the other head dims need >= 160 KiB either way: A100-class or Hopper).
struct BwdTilesSm80 {
  BwdTile main, small;
};
constexpr BwdTilesSm80 bwd_tiles_sm80(int head_dim) {
  switch (head_dim) {
    case 64: return {{128, 128, 8, 4, 4, 4, 1}, {64, 128, 8, 4, 4, 2, 1}};
    case 96: return {{64, 128, 8, 4, 4, 4, 1}, {64, 128, 8, 4, 4, 4, 1}};
    case 128: return {{64, 128, 8, 4, 4, 2, 1}, {64, 128, 8, 4, 4, 2, 1}};
    case 192: return {{64, 64, 8, 2, 2, 4, 1}, {64, 64, 8, 2, 2, 4, 1}};
    case 256: return {{64, 64, 8, 2, 2, 2, 1}, {64, 64, 8, 2, 2, 2, 1}};
    default: {
      const BwdTile t = head_dim <= 128 ? BwdTile{64, 128, 8, 4, 4, 2, 1} : BwdTile{64, 64, 8, 2, 2, 2, 1};
      return {t, t};
    }
  }
}
/// sm90 backward: kBlockM x kBlockN, two warpgroups (sm90/mainloop_bwd.cuh, BwdConfig).
struct BwdTileSm90 {
  bool available;
  int block_m, block_n;
};
constexpr BwdTileSm90 bwd_tile_sm90(int head_dim) {
  switch (head_dim) {
    case 64: return {true, 128, 128};
    case 128: return {true, 64, 128};
    case 256: return {true, 64, 64};
    default: return {head_dim % 64 == 0 && head_dim <= 256, 64, 64};
  }
}

/// Smallest backward kBlockM any configuration of (arch, head_dim) may take: sizes the deterministic mode's
/// per-(batch, head, query block) turn counters.
constexpr int bwd_min_block_m(bool sm90, int head_dim) {
  const BwdTilesSm80 t = bwd_tiles_sm80(head_dim);
  if (sm90) return bwd_tile_sm90(head_dim).block_m;
  return t.main.block_m < t.small.block_m ? t.main.block_m : t.small.block_m;
}

}  // namespace flashkv::cuda
