// Which split-KV decode kernel a packed-page launch runs (sm80/decode_launch.cuh), in one place for the launcher and
// the plan's occupancy query (decode_cuda.cpp), so that the num_splits heuristic sees the kernel that runs.
#pragma once

#include "core/host_device.hpp"
#include "cuda/decode_params.hpp"
#include "kvcache/format/traits.hpp"

namespace flashkv::cuda {

/// Whether a packed-page launch goes to the keys-as-M kernel (sm80/decode_launch.cuh, KvQuantSource's kKeysMOnly: 4
/// CTAs per SM where they fit, registers capped to 128): the keys-as-M loop on (keys_m), every CTA with <= 8 query rows,
/// and the affine halves' channel groups the whole head — at 32-channel groups the capped kernel spilled in its loop
/// and measured slower than the 3-CTA kernel (H200 run13 call 2: int4_g32 batch 64 x 32k 1090 vs 1021 us), so other
/// groups take the kernel with both loops, whose keys-as-M path they run at 3 CTAs. The plan's occupancy query
/// (decode_cuda.cpp) asks the same kernel.
FLASHKV_HD constexpr bool keys_m_kernel(const DecodeParams& p) {
  auto whole = [&](const kv::KVHalfFormat& f) {
    return f.scaling != kv::KVScaling::token_affine || f.group == p.head_dim;
  };
  return p.keys_m && p.rows_per_kv_head <= 8 && whole(p.k_format) && whole(p.v_format);
}

}  // namespace flashkv::cuda
