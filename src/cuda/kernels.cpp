// Lookup in the generated instantiation table and the family dispatch (see kernels.hpp).
#include "cuda/kernels.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>

#include "cuda/check.hpp"
#include "cuda/util.hpp"
#include "flashkv/error.hpp"

namespace flashkv::cuda {

const char* kernel_kind_name(KernelKind k) {
  switch (k) {
    case KernelKind::fwd: return "forward";
    case KernelKind::bwd: return "backward";
    case KernelKind::decode: return "decode";
    case KernelKind::fwd_v1: return "forward (v1 order)";
  }
  return "?";
}

const char* kernel_arch_name(KernelArch a) { return a == KernelArch::sm90 ? "sm90" : "sm80"; }

namespace {

const KernelEntry* lookup(KernelKind kind, KernelArch arch, int64_t head_dim, DType dtype, bool exact) {
  const KernelEntry* best = nullptr;
  for (int i = 0; i < kKernelTableSize; ++i) {
    const KernelEntry& e = kKernelTable[i];
    if (e.kind != kind || e.arch != arch || e.dtype != dtype) continue;
    if (exact ? e.head_dim == head_dim : e.head_dim >= head_dim && (!best || e.head_dim < best->head_dim)) best = &e;
    if (exact && best) break;
  }
  return best;
}

[[noreturn]] void not_compiled(KernelKind kind, const char* family, int64_t head_dim, DType dtype) {
  std::ostringstream msg;
  msg << "flashkv: CUDA " << family << kernel_kind_name(kind) << " kernel for head_dim " << head_dim << ", dtype "
      << dtype_name(dtype) << " is not compiled in this build (compiled: " << compiled_kernels()
      << "; rebuild with -DFLASHKV_CUDA_ALL_INSTANTIATIONS=ON or add the head dim to FLASHKV_CUDA_HEADDIMS)";
  throw UnsupportedError(msg.str());
}

/// FLASHKV_CUDA_SM80_ONLY set to anything but "" or "0": `auto` means sm80 (read once per process).
bool sm80_only_default() {
  static const bool v = [] {
    const char* env = std::getenv("FLASHKV_CUDA_SM80_ONLY");
    return env != nullptr && env[0] != '\0' && std::strcmp(env, "0") != 0;
  }();
  return v;
}

int current_device() {
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  return dev;
}

std::string device_name_cc(int dev) {
  int major = 0, minor = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute(cc)");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), "cudaDeviceGetAttribute(cc)");
  return "device " + std::to_string(dev) + " is sm_" + std::to_string(major) + std::to_string(minor);
}

}  // namespace

const KernelEntry& find_kernel(KernelKind kind, int64_t head_dim, DType dtype) {
  const KernelEntry* e = lookup(kind, KernelArch::sm80, head_dim, dtype, false);
  if (e == nullptr) not_compiled(kind, "", head_dim, dtype);
  return *e;
}

bool device_runs_sm90() {
  static std::atomic<int> cached[64] = {};  // 0 unknown, 1 yes, 2 no
  const int dev = current_device();
  int c = dev < 64 ? cached[dev].load(std::memory_order_relaxed) : 0;
  if (c == 0) {
    int major = 0, minor = 0;
    check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute(cc)");
    check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), "cudaDeviceGetAttribute(cc)");
    c = (major == 9 && minor == 0 && sm90_binary_selected()) ? 1 : 2;
    if (dev < 64) cached[dev].store(c, std::memory_order_relaxed);
  }
  return c == 1;
}

const KernelEntry& select_kernel(KernelKind kind, KernelFamily family, int64_t head_dim, DType dtype) {
  if (family == KernelFamily::sm80 || (family == KernelFamily::automatic && kind != KernelKind::fwd &&
                                       kind != KernelKind::bwd)) {
    return find_kernel(kind, head_dim, dtype);
  }
  if (family == KernelFamily::automatic) {
    const KernelEntry& base = find_kernel(kind, head_dim, dtype);
    if (sm80_only_default() || !device_runs_sm90()) return base;
    const KernelEntry* e = lookup(kind, KernelArch::sm90, base.head_dim, dtype, true);
    if (e != nullptr && e->smem_bytes() <= max_smem_per_block()) return *e;
    return base;
  }
  // Explicit sm90.
  if (kind != KernelKind::fwd && kind != KernelKind::bwd) {
    throw UnsupportedError(std::string("flashkv: kernel_family 'sm90' has no ") + kernel_kind_name(kind) +
                           " kernel (it exists as sm80 only; use kernel_family 'auto' or 'sm80')");
  }
  if (!sm90_kernels_compiled()) {
    throw UnsupportedError(
        "flashkv: kernel_family 'sm90' is not available: this build carries no sm_90a code (configure with "
        "CMAKE_CUDA_ARCHITECTURES containing 90a and no plain 90, as the cuda preset does)");
  }
  const int dev = current_device();
  if (!device_runs_sm90()) {
    throw UnsupportedError("flashkv: kernel_family 'sm90' needs a Hopper GPU (compute capability 9.0) running this "
                           "build's sm_90a code; " + device_name_cc(dev));
  }
  const KernelEntry* e = lookup(kind, KernelArch::sm90, head_dim, dtype, false);
  if (e == nullptr) not_compiled(kind, "sm90 ", head_dim, dtype);
  if (e->smem_bytes() > max_smem_per_block()) {
    throw UnsupportedError("flashkv: kernel_family 'sm90' " + std::string(kernel_kind_name(kind)) +
                           " kernel for head_dim " + std::to_string(e->head_dim) + " needs " +
                           std::to_string(e->smem_bytes()) + " bytes of shared memory per block; " +
                           device_name_cc(dev) + " allows " + std::to_string(max_smem_per_block()));
  }
  return *e;
}

std::string compiled_kernels() {
  std::ostringstream out;
  bool first_kind = true;
  for (KernelKind k : {KernelKind::fwd, KernelKind::bwd, KernelKind::decode, KernelKind::fwd_v1}) {
    std::set<int> dims, dims90;
    std::set<std::string> types;
    for (int i = 0; i < kKernelTableSize; ++i) {
      if (kKernelTable[i].kind != k) continue;
      (kKernelTable[i].arch == KernelArch::sm90 ? dims90 : dims).insert(kKernelTable[i].head_dim);
      types.insert(dtype_name(kKernelTable[i].dtype));
    }
    if (dims.empty()) continue;
    out << (first_kind ? "" : "; ") << kernel_kind_name(k) << " head_dim ";
    first_kind = false;
    bool first = true;
    for (int d : dims) out << (first ? "" : "/") << d, first = false;
    out << " x ";
    first = true;
    for (const auto& t : types) out << (first ? "" : "/") << t, first = false;
    if (!dims90.empty()) {
      out << " (sm80; sm90 ";
      first = true;
      for (int d : dims90) out << (first ? "" : "/") << d, first = false;
      out << ")";
    }
  }
  return first_kind ? std::string("none") : out.str();
}

}  // namespace flashkv::cuda
