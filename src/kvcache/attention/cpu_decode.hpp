// CPU decode attention over a validated core::DecodeProblem (a PagedKVCache's pages or 16-bit cache tensors): plan
// (plan.cpp: the work partition of one batch shape) and run (run.cpp: q prepared once per (sequence, kv head), the
// tile walk of every task, the lse merge of its splits). Reached through flashkv::plan_decode / run_decode /
// paged_decode (src/kvcache/api/decode.cpp).
//
// Work decomposition (flash-decoding; Dao, Haziza, Massa, Sizov 2023): one task per (sequence, kv head, split of the
// visible key range). A task holds the g = num_heads / num_heads_kv query heads × n_q query tokens that share the kv
// head (GQA packing), walks its key range in tiles (a page of the quantized stream, or a run of sink / residual
// slots) and updates an online softmax (FlashAttention, Dao et al. 2022, Alg. 1) with each tile (kv::tile_update,
// decode_tile.cpp). A tile's K and V are read in place from the packed page by the fused AVX-512 kernels
// (decode_fused.hpp) — every format, head_dim 64 / 128 / 256 — else decoded by the codec into a small factored float
// tile (the generic path). Splits merge with core/merge.hpp.
#pragma once

#include <memory>

#include "core/decode_problem.hpp"

namespace flashkv::kv {

/// Plans `p` on the CPU (p.kv.host_seqlens_k and, for varlen, p.host_cu_seqlens_q must be set).
std::unique_ptr<core::DecodeWork> plan_cpu_decode(const core::DecodeProblem& p);

}  // namespace flashkv::kv
