// DecodePlan::Impl (flashkv/decode.hpp): what a plan over a PagedKVCache keeps — the device work, the planned problem
// and the host tables it was made from. Shared by api/decode.cpp (plan_decode / run_decode) and api/cache_step.cpp
// (the step plans over device tables). Not a public header.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/decode_problem.hpp"
#include "flashkv/decode.hpp"
#include "kvcache/cache/cache_impl.hpp"

namespace flashkv {

struct DecodePlan::Impl {
  std::unique_ptr<core::DecodeWork> work;
  core::DecodeProblem proto;  ///< the planned problem without layer / io pointers
  const PagedKVCache::Impl* cache = nullptr;
  /// A step plan (kv::plan_step_decode): lengths and page table on the device, nothing checked against the host.
  bool step = false;
  std::vector<int64_t> seq_ids, seqlens_k;
  std::vector<int32_t> cu_seqlens_q, page_table;
  std::vector<uint64_t> versions;
  std::vector<const uint16_t*> window_bases;
  std::vector<float> head_scales[2];
  std::string format_names[2];
};

namespace kv {
/// The CPU plan, or the device backend's.
std::unique_ptr<core::DecodeWork> plan_on_device(const core::DecodeProblem& p);
/// Layer-dependent parts of a cache problem: the pages of `layer`.
void bind_layer(core::DecodeProblem& p, const PagedKVCache::Impl& m, int32_t layer);
}  // namespace kv

}  // namespace flashkv
