#include "core/backend.hpp"

#include <atomic>

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

}  // namespace flashkv::core
