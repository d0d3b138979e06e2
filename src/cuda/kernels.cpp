// Lookup in the generated instantiation table and the family dispatch (see kernels.hpp).
#include "cuda/kernels.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "cuda/check.hpp"
#include "cuda/common/auto_family.hpp"
#include "cuda/common/tile_size.hpp"
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

const char* kernel_arch_name(KernelArch a) {
  switch (a) {
    case KernelArch::sm80: return "sm80";
    case KernelArch::sm90: return "sm90";
    case KernelArch::sm90ws: return "sm90ws";
  }
  return "?";
}

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
      << "; rebuild with -DFLASHKV_CUDA_ALL_INSTANTIATIONS=ON or add the head dim to "
      << (dtype == DType::float8_e4m3fn ? "FLASHKV_CUDA_FP8_HEADDIMS)" : "FLASHKV_CUDA_HEADDIMS)");
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

namespace {

/// The compiled entry of exactly (kind, arch, head_dim, dtype) if the device's shared memory holds it.
const KernelEntry* fitting(KernelKind kind, KernelArch arch, int64_t head_dim, DType dtype) {
  const KernelEntry* e = lookup(kind, arch, head_dim, dtype, true);
  return e != nullptr && e->smem_bytes() <= max_smem_per_block() ? e : nullptr;
}

/// An explicit Hopper family (sm90 / sm90ws): its smallest compiled head dim >= head_dim, or UnsupportedError.
const KernelEntry& select_hopper(KernelKind kind, KernelArch arch, int64_t head_dim, DType dtype) {
  const std::string fam = kernel_arch_name(arch);
  const bool has_kind = kind == KernelKind::fwd || (kind == KernelKind::bwd && arch == KernelArch::sm90);
  if (!has_kind) {
    throw UnsupportedError("flashkv: kernel_family '" + fam + "' has no " + kernel_kind_name(kind) + " kernel (" +
                           (arch == KernelArch::sm90ws ? std::string("it is a forward-only family; use 'auto', "
                                                                     "'sm90' or 'sm80' for this call")
                                                       : std::string("it exists as sm80 only; use kernel_family "
                                                                     "'auto' or 'sm80'")) +
                           ")");
  }
  if (!sm90_kernels_compiled()) {
    throw UnsupportedError("flashkv: kernel_family '" + fam +
                           "' is not available: this build carries no sm_90a code (configure with "
                           "CMAKE_CUDA_ARCHITECTURES containing 90a and no plain 90, as the cuda preset does)");
  }
  const int dev = current_device();
  if (!device_runs_sm90()) {
    throw UnsupportedError("flashkv: kernel_family '" + fam +
                           "' needs a Hopper GPU (compute capability 9.0) running this build's sm_90a code; " +
                           device_name_cc(dev));
  }
  const KernelEntry* e = lookup(kind, arch, head_dim, dtype, false);
  if (e == nullptr) not_compiled(kind, (fam + " ").c_str(), head_dim, dtype);
  if (e->smem_bytes() > max_smem_per_block()) {
    throw UnsupportedError("flashkv: kernel_family '" + fam + "' " + std::string(kernel_kind_name(kind)) +
                           " kernel for head_dim " + std::to_string(e->head_dim) + " needs " +
                           std::to_string(e->smem_bytes()) + " bytes of shared memory per block; " +
                           device_name_cc(dev) + " allows " + std::to_string(max_smem_per_block()));
  }
  return *e;
}

}  // namespace

const KernelEntry& select_kernel(KernelKind kind, KernelFamily family, int64_t head_dim, DType dtype,
                                 const CallShape& shape) {
  if (dtype == DType::float8_e4m3fn) {  // FP8: the sm90ws forward only, for every family request
    if (family == KernelFamily::sm80 || family == KernelFamily::sm90) {
      throw UnsupportedError(std::string("flashkv: kernel_family '") + kernel_family_name(family) +
                             "' has no float8_e4m3fn kernels (FP8 attention runs on kernel_family 'sm90ws' or "
                             "'auto', a Hopper GPU)");
    }
    if (kind != KernelKind::fwd) {
      throw UnsupportedError(std::string("flashkv: float8_e4m3fn attention has no ") + kernel_kind_name(kind) +
                             " kernel (FP8 runs the tiled forward of kernel_family 'sm90ws' only)");
    }
    if (sm90_kernels_compiled() && !device_runs_sm90()) {
      throw UnsupportedError("flashkv: float8_e4m3fn attention (kernel_family 'sm90ws', wgmma e4m3) needs a Hopper "
                             "GPU (compute capability 9.0); " + device_name_cc(current_device()));
    }
    return select_hopper(kind, KernelArch::sm90ws, head_dim, dtype);
  }
  switch (family) {
    case KernelFamily::sm80: return find_kernel(kind, head_dim, dtype);
    case KernelFamily::sm90: return select_hopper(kind, KernelArch::sm90, head_dim, dtype);
    case KernelFamily::sm90ws: return select_hopper(kind, KernelArch::sm90ws, head_dim, dtype);
    case KernelFamily::automatic: break;
  }
  const KernelEntry& base = find_kernel(kind, head_dim, dtype);
  if ((kind != KernelKind::fwd && kind != KernelKind::bwd) || sm80_only_default() || !device_runs_sm90()) return base;
  if (kind == KernelKind::fwd && sm90ws_preferred(base.head_dim, shape.seqlen_k, shape.masked, shape.varlen, shape.softcap)) {
    if (const KernelEntry* e = fitting(kind, KernelArch::sm90ws, base.head_dim, dtype)) return *e;
  }
  if (const KernelEntry* e = fitting(kind, KernelArch::sm90, base.head_dim, dtype)) return *e;
  return base;
}

std::string compiled_kernels() {
  std::ostringstream out;
  bool first_kind = true;
  for (KernelKind k : {KernelKind::fwd, KernelKind::bwd, KernelKind::decode, KernelKind::fwd_v1}) {
    std::set<int> dims, dims90, dims90ws;
    std::set<std::string> types;
    for (int i = 0; i < kKernelTableSize; ++i) {
      const KernelEntry& e = kKernelTable[i];
      if (e.kind != k) continue;
      (e.arch == KernelArch::sm90 ? dims90 : e.arch == KernelArch::sm90ws ? dims90ws : dims).insert(e.head_dim);
      types.insert(dtype_name(e.dtype));
    }
    if (dims.empty()) continue;
    out << (first_kind ? "" : "; ") << kernel_kind_name(k) << " head_dim ";
    first_kind = false;
    bool first = true;
    for (int d : dims) out << (first ? "" : "/") << d, first = false;
    out << " x ";
    first = true;
    for (const auto& t : types) out << (first ? "" : "/") << t, first = false;
    if (!dims90.empty() || !dims90ws.empty()) {
      out << " (sm80";
      for (const auto& [name, ds] : {std::pair<const char*, const std::set<int>*>{"sm90", &dims90},
                                     std::pair<const char*, const std::set<int>*>{"sm90ws", &dims90ws}}) {
        if (ds->empty()) continue;
        out << "; " << name << " ";
        first = true;
        for (int d : *ds) out << (first ? "" : "/") << d, first = false;
      }
      out << ")";
    }
  }
  return first_kind ? std::string("none") : out.str();
}

}  // namespace flashkv::cuda
