// CUDA backend of the attention entry points (flashkv/attention.hpp): runs a validated core::AttentionProblem whose
// tensors live on a CUDA device. Registered for Device::cuda in the core::DeviceBackend table at static-init time, so
// flashkv::attention_forward(...) with CUDA tensors lands here.
//
// Supported: dtype bfloat16 / float16 (float32 -> UnsupportedError), head_dim == head_dim_v <= 256 (a head_dim that is
// not compiled runs on the next larger compiled instantiation, zero-padded; head_dim not a multiple of 8 or unaligned
// strides/pointers go through a padded contiguous copy), causal / sliding window / softcap / GQA / MQA / varlen,
// Algorithm::tiled (FA2 kernel) and Algorithm::v1_order (FA1-order kernel, forward only; backward always uses the FA2
// backward). Algorithm::naive is not implemented on CUDA (UnsupportedError).
// Backward: FA2 (Dao 2023, §3.1.2, Alg. 2); options.deterministic = true gives bit-identical dq/dk/dv run to run (dq
// partial sums are added in a fixed K/V-block order), false uses float32 atomics for dq.
#pragma once

#include "core/problem.hpp"

namespace flashkv::cuda {

/// Forward on the problem's CUDA device and stream. Throws UnsupportedError / Error(Status::internal) on CUDA errors.
void attention_forward_cuda(const core::AttentionProblem& problem, void* stream);
/// Backward on the problem's CUDA device and stream.
void attention_backward_cuda(const core::AttentionProblem& problem, void* stream);
/// True when the CUDA runtime sees at least one device.
bool cuda_device_available();

}  // namespace flashkv::cuda
