// Device-backend hook table. The public entry points (src/cpu/attention_api.cpp) validate the arguments into an
// AttentionProblem and then dispatch on problem.device:
//   Device::cpu  -> the CPU kernels in src/cpu/ (always built);
//   Device::cuda -> the DeviceBackend registered for Device::cuda, or UnsupportedError
//                   ("flashkv was built without the CUDA backend") when none is registered. Never a silent fallback.
// The CUDA layer (src/cuda/) registers its table from a static initializer, e.g.
//   static const flashkv::core::DeviceBackend kCuda{&cuda_forward, &cuda_backward, &cuda_available, "cuda"};
//   static const bool kRegistered = (flashkv::core::register_device_backend(flashkv::Device::cuda, &kCuda), true);
// (the CLI / shared library link layers whole-archive so such initializers are kept).
#pragma once

#include <cstddef>
#include <memory>

#include "core/problem.hpp"
#include "flashkv/types.hpp"

namespace flashkv::core {

struct DecodeProblem;
class DecodeWork;

struct DeviceBackend {
  /// Runs a validated forward problem (problem.is_backward == false). `stream` == problem.stream.
  void (*forward)(const AttentionProblem& problem, void* stream) = nullptr;
  /// Runs a validated backward problem (problem.is_backward == true).
  void (*backward)(const AttentionProblem& problem, void* stream) = nullptr;
  /// Optional: false when the backend is compiled in but no device is present (dispatch then throws
  /// UnsupportedError("no CUDA device")). nullptr = always available.
  bool (*available)() = nullptr;
  const char* name = "";
};

/// Registers (or, with nullptr, unregisters) the backend for `device`. Thread-safe; the table must outlive the process
/// (use a static object). Registering Device::cpu is rejected with flashkv::Error: the CPU path is built in.
void register_device_backend(Device device, const DeviceBackend* backend);

/// The registered backend for `device`, or nullptr.
const DeviceBackend* device_backend(Device device);
/// The backend for `device` or UnsupportedError ("flashkv was built without the CUDA backend" / "no CUDA device").
const DeviceBackend& require_device_backend(Device device);

/// Device side of the KV cache and of decode attention over it (src/core/decode_problem.hpp). Registered like
/// DeviceBackend (the CUDA layer: src/cuda/decode_cuda.cpp); the KV cache layer (src/kvcache/) reaches device memory and
/// device decode only through it, so a cache can live on the device with the same page layout as on the host.
struct DecodeBackend {
  /// Plans a validated decode problem on this device (work partition, workspaces, device copies of the host tables);
  /// the returned work runs it (and later problems of the same shape). Throws UnsupportedError for what the device
  /// cannot run (naming it), CapacityError for lengths past the capacity.
  std::unique_ptr<DecodeWork> (*plan)(const DecodeProblem& problem) = nullptr;
  /// Appends rows to a device cache's pages: rows = problem.k_new / v_new [batch, seqlen_new, Hk, d] at positions
  /// seqlens[b] + i of the problem's page table (16-bit formats without windows or rotation), asynchronously on
  /// problem.stream.
  void (*append)(const DecodeProblem& problem) = nullptr;
  /// The append of an engine step (kvcache/api/cache_step.hpp): rows as `append`, any token-granular format (16-bit
  /// copy or quantize on write), asynchronous on problem.stream and capturable in a CUDA graph (no allocation, copy or
  /// synchronization; the static fp8 scales come from kv.device_head_scales). The values are checked inside the write:
  /// per half the smallest flat (b, i, h, c) index of a value the half cannot store (non-finite, or |x| > 65504 where
  /// it stores fp16) is atomicMin'ed into bad[0] (K) / bad[1] (V) (device memory the caller set to UINT64_MAX); such a
  /// row is not encoded (its slot keeps the 0xFF fill: NaN) in packed pages, copied as is in 16-bit pages.
  void (*append_step)(const DecodeProblem& problem, unsigned long long* bad) = nullptr;
  /// The split count plan() would choose for `problem` (the same heuristic, without building the plan).
  int32_t (*num_splits)(const DecodeProblem& problem) = nullptr;
  /// Device memory for caches: allocate (nullptr when out of memory), free, synchronous copies (kind 0: host to
  /// device, 1: device to host, 2: device to device) and fill.
  void* (*alloc)(std::size_t bytes, int32_t device_index) = nullptr;
  void (*free)(void* p, int32_t device_index) = nullptr;
  void (*copy)(void* dst, const void* src, std::size_t bytes, int kind, int32_t device_index) = nullptr;
  void (*fill)(void* p, int value, std::size_t bytes, int32_t device_index) = nullptr;
  bool (*available)() = nullptr;
  const char* name = "";
};

/// Registers (nullptr: unregisters) the decode backend for `device` (not Device::cpu: the CPU path is built in).
void register_decode_backend(Device device, const DecodeBackend* backend);
/// The registered decode backend for `device`, or nullptr.
const DecodeBackend* decode_backend(Device device);
/// The decode backend for `device` or UnsupportedError ("flashkv was built without the CUDA backend" / "no CUDA
/// device").
const DecodeBackend& require_decode_backend(Device device);

}  // namespace flashkv::core
