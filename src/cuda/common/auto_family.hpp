// The shape rule of kernel_family = auto between the two Hopper forwards (sm90 and sm90ws), from H200 measurements.
// Kept out of tile_size.hpp, which every kernel instantiation includes, so that a retune recompiles one file.
#pragma once
#include <cstdint>

namespace flashkv::cuda {

/// The automatic family's choice between the two Hopper forwards (kernels.cpp, select_kernel): sm90ws where the H200
/// measured it ahead of the sm90 (cp.async wgmma) kernel, sm90 elsewhere. Measured (same run, 16k tokens, hidden 2048,
/// fixed-length bf16 without softcap, bench/results/h200-attention-2026-12-01.md, column sm90ws/sm90):
///   hd256: 1.03-1.23x at every seqlen 512-16384, causal or not -> always sm90ws;
///   hd128: non-causal 1.10-1.26x everywhere; causal 0.92x at 512, 1.01x at 1024, 1.09-1.22x from 2048 -> sm90ws
///          unless masked below seqlen_k 2048;
///   hd64:  0.86-0.99x (causal 0.73-0.92x) up to 2048, 1.02x / 0.99x (causal) at 4096, 1.05-1.10x from 8192 ->
///          sm90ws from seqlen_k 8192 only (short K/V loops pay the warp-specialized pipeline's fill and drain).
/// Varlen and softcap calls were not measured on sm90ws (softcap runs narrower tiles, block_n_softcap), so `auto`
/// keeps them on sm90 until a benchmark shows otherwise; kernel_family = sm90ws runs them.
constexpr bool sm90ws_preferred(int head_dim, int64_t seqlen_k, bool masked, bool varlen, bool softcap) {
  if (varlen || softcap) return false;
  if (head_dim >= 256) return true;
  if (head_dim >= 128) return !masked || seqlen_k >= 2048;
  return seqlen_k >= 8192;
}

}  // namespace flashkv::cuda
