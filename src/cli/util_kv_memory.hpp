// One formula and one wording for "how much smaller than bf16" in every command that reports KV-cache memory
// (`flashkv kv-mem`, `flashkv generate`; issue 10 item 9).
//   formula: ratio = bf16_bytes / bytes, where bf16_bytes = kv_memory_estimate() of a bf16 cache with the same
//            layers, KV heads, head_dim, page size, sequences and tokens (pages and page slack counted on both sides,
//            no residual/sink buffers: the plain bf16 cache), and bytes = the format's bytes counted the same way.
//   wording: "1.60x smaller than bf16" (ratio > 1), "1.25x larger than bf16" (ratio < 1), "the same as bf16".
#pragma once

#include <cstdint>
#include <string>

namespace flashkv::cli {

/// Total bytes of the bf16 reference cache (see above).
int64_t bf16_reference_bytes(int32_t layers, int32_t kv_heads, int32_t head_dim, int32_t page_size, int64_t batch,
                             int64_t tokens);

/// "1.60x smaller than bf16" | "1.25x larger than bf16" | "the same as bf16" (two decimals).
std::string vs_bf16_text(double bf16_bytes, double bytes);

}  // namespace flashkv::cli
