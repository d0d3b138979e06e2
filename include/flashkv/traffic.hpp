// flashkv/traffic.hpp — analytic memory-traffic model of the forward-pass variants (Algorithm::naive, v1_order,
// tiled), derived from each loop structure as the CPU kernels implement it. Used by `flashkv bench attention` and
// `flashkv explain tiles`; formulas are documented in docs/attention-cpu.md ("Memory traffic").
//
// Model. "Slow memory" is DRAM/HBM (the tensors and any buffer of size O(seqlen)); "fast memory" is the per-worker
// tile working set (L1/L2 on the CPU, SRAM/registers on a GPU). A byte is counted each time a loop moves it between
// the two. Per (batch, head), with e = dtype bytes, N = seqlen_q, M = seqlen_k, Br = block_m, Bc = block_n,
// Tr = ceil(N / Br), Tc = ceil(M / Bc), and K_vis / Q_vis the keys / queries a block actually visits:
//
//   tiled (FA2):  Q read once (N·d·e); for every Q block, the visible K and V tiles (Σ_i K_vis(i)·(d + dv)·e);
//                 O written once (N·dv·e); lse written once (N·4). S, P, O, m, l never leave fast memory.
//   v1_order:     K, V read once (Σ_j (d + dv)·e·keys_j); for every (K/V block j, visible Q block i): Q_i re-read
//                 (Σ_j Q_vis(j)·d·e), O_i, m_i, l_i read and written back in float32 (2·Σ_j Q_vis(j)·(dv + 2)·4);
//                 finally O read (N·dv·4) and written in the dtype (N·dv·e) with lse (N·4).
//   naive:        S = Q·Kᵀ tiled like the FA2 loop but without skipping (N·d·e + Tr·M·d·e), S written in full
//                 (N·M·4), softmax reads S and writes P (2·N·M·4), P·V reads P (N·M·4) and V per Q block
//                 (Tr·M·dv·e), O written (N·dv·e), lse (N·4). Masked entries are computed, then masked.
//
// Causal / windowed problems count only the tiles each loop visits (the same block-skipping rule as the kernels,
// src/core/mask.hpp). The model counts tensor bytes only (no cache-line rounding, no prefetch effects).
#pragma once

#include <cstdint>
#include <string>

#include "flashkv/attention.hpp"
#include "flashkv/types.hpp"

namespace flashkv {

/// The problem the model describes (fixed-length forward).
struct TrafficShape {
  int64_t batch = 1;
  int64_t num_heads = 1;
  int64_t seqlen_q = 1;
  int64_t seqlen_k = 1;
  int64_t head_dim = 64;
  int64_t head_dim_v = 0;              ///< 0 = head_dim
  DType dtype = DType::float32;        ///< q/k/v/out element type (float32 | float16 | bfloat16)
  bool causal = false;                 ///< bottom-right aligned (as the kernels)
  int32_t window_size_left = -1;       ///< −1 = unbounded
  int32_t window_size_right = -1;      ///< −1 = unbounded (causal forces 0)
  int64_t block_m = 128;               ///< Br, query rows per tile (the CPU forward kernels use 128)
  int64_t block_n = 64;                ///< Bc, keys per tile (the CPU kernels use 64)
  int32_t num_workers = 1;             ///< concurrent workers (threads / CTAs), for peak extra memory
};

/// Bytes moved between slow and fast memory by one forward call, by component (all in bytes).
struct TrafficEstimate {
  Algorithm algorithm = Algorithm::tiled;
  double q_read = 0;          ///< Q tiles loaded (re-reads included)
  double k_read = 0;          ///< K tiles loaded
  double v_read = 0;          ///< V tiles loaded (naive: V rows re-read per Q block)
  double out_write = 0;       ///< final output written (dtype)
  double lse_write = 0;       ///< lse written (float32)
  double o_acc_read = 0;      ///< v1: float32 O accumulator re-read from slow memory
  double o_acc_write = 0;     ///< v1: float32 O accumulator written back
  double stats_read = 0;      ///< v1: m, l re-read
  double stats_write = 0;     ///< v1: m, l written back
  double s_write = 0;         ///< naive: S written in full
  double s_read = 0;          ///< naive: S read by the softmax
  double p_write = 0;         ///< naive: P written
  double p_read = 0;          ///< naive: P read by P·V
  double bytes_read = 0;      ///< sum of the reads
  double bytes_written = 0;   ///< sum of the writes
  double bytes_total = 0;     ///< bytes_read + bytes_written
  int64_t tiles_visited = 0;  ///< (Q block, K/V block) pairs computed, all (batch, head)
  int64_t tiles_total = 0;    ///< Tr·Tc·batch·num_heads (tiles_total − tiles_visited were skipped)
  double fast_memory_bytes = 0;   ///< per-worker tile working set (float32 tiles)
  double extra_memory_bytes = 0;  ///< peak memory beyond inputs/outputs, all workers (tiles + slow buffers)
  double flops = 0;               ///< conventional forward FLOPs (attention_forward_flops)
  double arithmetic_intensity = 0;  ///< flops / bytes_total
};

/// Conventional forward FLOPs: 2·batch·num_heads·seqlen_q·seqlen_k·(head_dim + head_dim_v), halved when causal
/// (= 4·B·H·Sq·Sk·d for head_dim_v = d; FlashAttention-3 §4.1 convention). Backward is 2.5× this.
double attention_forward_flops(const TrafficShape& shape);

/// The model for one variant. Throws flashkv::Error for non-positive sizes/blocks or a non-attention dtype.
TrafficEstimate estimate_traffic(Algorithm algorithm, const TrafficShape& shape);

/// One-line formula of the variant's total traffic, e.g. "tiled: N·d·e + Σ_i K_vis(i)·(d+dv)·e + N·dv·e + 4N".
std::string traffic_formula(Algorithm algorithm);

}  // namespace flashkv
