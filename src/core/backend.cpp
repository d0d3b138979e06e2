#include "core/backend.hpp"

#include <atomic>
#include <string>

#include "flashkv/error.hpp"

namespace flashkv::core {
namespace {
// One slot per Device enumerator; atomics make registration from static initializers and lookups from any thread safe.
std::atomic<const DeviceBackend*> g_backends[2] = {nullptr, nullptr};

int slot(Device device) {
  const int d = static_cast<int>(device);
  if (d < 0 || d > 1) throw Error("device", "cpu or cuda", "enum value " + std::to_string(d));
  return d;
}
}  // namespace

void register_device_backend(Device device, const DeviceBackend* backend) {
  if (device == Device::cpu) throw Error("device", "a non-CPU device (the CPU backend is built in)", "cpu");
  if (backend != nullptr && (backend->forward == nullptr || backend->backward == nullptr)) {
    throw Error("backend", "forward and backward hooks set", "a null hook");
  }
  g_backends[slot(device)].store(backend, std::memory_order_release);
}

const DeviceBackend* device_backend(Device device) { return g_backends[slot(device)].load(std::memory_order_acquire); }

namespace {
std::atomic<const DecodeBackend*> g_decode_backends[2] = {nullptr, nullptr};
}  // namespace

void register_decode_backend(Device device, const DecodeBackend* backend) {
  if (device == Device::cpu) throw Error("device", "a non-CPU device (the CPU decode is built in)", "cpu");
  if (backend != nullptr && (backend->plan == nullptr || backend->alloc == nullptr || backend->free == nullptr ||
                             backend->copy == nullptr || backend->fill == nullptr)) {
    throw Error("backend", "plan and memory hooks set", "a null hook");
  }
  g_decode_backends[slot(device)].store(backend, std::memory_order_release);
}

const DecodeBackend* decode_backend(Device device) {
  return g_decode_backends[slot(device)].load(std::memory_order_acquire);
}

namespace {
/// `be` or UnsupportedError: not compiled in, or compiled in without a device present.
template <class Backend>
const Backend& require(const Backend* be, Device device) {
  if (be == nullptr) {
    if (device == Device::cuda) throw UnsupportedError("flashkv was built without the CUDA backend");
    throw UnsupportedError(std::string("flashkv: no backend for device ") + device_name(device));
  }
  if (be->available != nullptr && !be->available()) {
    throw UnsupportedError(device == Device::cuda ? "flashkv: no CUDA device"
                                                  : std::string("flashkv: no ") + device_name(device) + " device");
  }
  return *be;
}
}  // namespace

const DeviceBackend& require_device_backend(Device device) { return require(device_backend(device), device); }

const DecodeBackend& require_decode_backend(Device device) { return require(decode_backend(device), device); }

}  // namespace flashkv::core
