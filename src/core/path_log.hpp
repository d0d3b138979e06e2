// Kernel-path reporting (which kernel family / code path a call took), so that a slow fallback can be seen.
//
// Every dispatch point (CPU attention, CUDA attention, KV-cache decode, CUDA paged decode) calls record_path() once
// per call with a short, stable description, e.g. "attention_forward cpu tiled float32 hdim64" or
// "attention_forward cuda sm90 fwd hdim128 bfloat16 causal". The description is kept per thread (last_path()) and,
// when the environment variable FLASHKV_LOG is set to anything but "" or "0" (read once, at the first call), also
// written to stderr as one line "flashkv: <description>".
// Public surface: flashkv::last_kernel_path() (flashkv/flashkv.hpp), flashkv_last_kernel_path() (C ABI),
// flashkv.last_kernel_path() (Python).
#pragma once

#include <string>

namespace flashkv::core {

/// True when FLASHKV_LOG asks for one stderr line per call (read once per process).
bool path_log_enabled();

/// Records `description` as this thread's last kernel path; prints it when path_log_enabled().
void record_path(std::string description);

/// This thread's last recorded kernel path ("" before the first call).
const std::string& last_path();

}  // namespace flashkv::core
