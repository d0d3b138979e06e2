// CUDA side of decode attention over a paged KV cache and of device-resident KV caches: the core::DecodeBackend
// registered for Device::cuda (decode_cuda.cpp). flashkv::paged_decode / plan_decode / run_decode (include/flashkv/
// decode.hpp) validate into a core::DecodeProblem and reach it through core::require_decode_backend(Device::cuda):
//   plan    the work partition (num_splits heuristic), device copies of a PagedKVCache's page table / lengths /
//           cu_seqlens_q, the split workspace; the capacity check of tensor-API lengths held on the device (read back
//           unless options.max_seqlen_k promises a bound) — CapacityError before anything is written or launched;
//   run     the optional append (k_new / v_new) and the split-KV kernel + combine (sm80/decode_kernel.cuh) for
//           bfloat16 / float16 pages of the cache's dtype (the 16-bit instance of the page layout) or packed pages of a
//           compiled quantized format (decode_quant.hpp; KvQuantSource); windows, rotation, KIVI keys and uncompiled
//           combinations are UnsupportedError naming them;
//   memory  cudaMalloc / cudaFree / cudaMemcpy / cudaMemset for caches that live on the device, and the device append
//           of a PagedKVCache (16-bit copy, or quantize on write: decode_append_quant.cu).
#pragma once

#include <cstdint>

namespace flashkv::cuda {

/// The num_splits heuristic: decode_num_splits in cuda/decode_splits.hpp (header-only, tested on the CPU).

/// Key blocks the quantized decode prefetches into L2 ahead of its cp.async ring (DecodeParams::l2_prefetch_blocks):
/// 0 (off; it measured slower on the H200), or FLASHKV_DECODE_L2_PREFETCH=N (0..16), read once. Error naming the
/// variable for any other value.
int32_t decode_l2_prefetch_blocks();

/// How the split-KV partials are merged (common/decode_combine.cuh): `fused` — the last split CTA of each tile merges
/// them inside the split kernel (the default; on the H200 1–30 µs faster per decode call than `kernel` at batch 1,
/// more with more splits, run9 call 1); `kernel` — a separate combine kernel, launched with programmatic dependent launch where the device
/// and stream allow it (sm_90+, outside graph capture); also what merges more splits than the fused merge's shared
/// memory holds (decode_params.hpp, fused_combine_fits). FLASHKV_DECODE_COMBINE=fused|kernel, read once (a tuning
/// knob: both give the same values up to float32 summation order); Error naming the variable for any other value.
enum class DecodeCombine { fused, kernel };
DecodeCombine decode_combine_mode();

/// Whether the packed-page decode runs its keys-as-M loop (sm80/decode_keys_m.cuh) for CTAs of <= 8 query rows
/// with register-direct fragments (DecodeParams::keys_m): true, or FLASHKV_DECODE_KEYS_M=0 for the 16-row loop (an
/// A/B knob: both compute the same attention up to float32 summation order); read once, Error naming the variable for
/// any value but 0 / 1.
bool decode_keys_m();

/// Forces the registration of the CUDA decode backend (a static initializer in decode_cuda.cpp); returns true.
bool decode_backend_registered();

}  // namespace flashkv::cuda
