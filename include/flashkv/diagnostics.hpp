// flashkv/diagnostics.hpp — which kernel path a call took.
#pragma once

#include <string>

namespace flashkv {

/// The kernel family / code path taken by this thread's last flashkv call that ran a kernel (attention forward or
/// backward, KV-cache attention, paged decode), as one short line, e.g.
/// "attention_forward cuda sm90 fwd hdim128 bfloat16 causal"; "" before the first such call. Setting the environment
/// variable FLASHKV_LOG=1 (read once per process) also prints each of these lines to stderr, prefixed "flashkv: ".
/// The wording is for people and logs; it is stable within a release but not a parsing contract.
std::string last_kernel_path();

}  // namespace flashkv
