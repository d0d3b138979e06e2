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

#include "core/problem.hpp"
#include "flashkv/types.hpp"

namespace flashkv::core {

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

}  // namespace flashkv::core
