// Lookup in the generated instantiation table (see kernels.hpp).
#include "cuda/kernels.hpp"

#include <set>
#include <sstream>

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

const KernelEntry& find_kernel(KernelKind kind, int64_t head_dim, DType dtype) {
  const KernelEntry* best = nullptr;
  for (int i = 0; i < kKernelTableSize; ++i) {
    const KernelEntry& e = kKernelTable[i];
    if (e.kind == kind && e.dtype == dtype && e.head_dim >= head_dim && (!best || e.head_dim < best->head_dim)) {
      best = &e;
    }
  }
  if (best == nullptr) {
    std::ostringstream msg;
    msg << "flashkv: CUDA " << kernel_kind_name(kind) << " kernel for head_dim " << head_dim << ", dtype "
        << dtype_name(dtype) << " is not compiled in this build (compiled: " << compiled_kernels()
        << "; rebuild with -DFLASHKV_CUDA_ALL_INSTANTIATIONS=ON or add the head dim to FLASHKV_CUDA_HEADDIMS)";
    throw UnsupportedError(msg.str());
  }
  return *best;
}

std::string compiled_kernels() {
  std::ostringstream out;
  bool first_kind = true;
  for (KernelKind k : {KernelKind::fwd, KernelKind::bwd, KernelKind::decode, KernelKind::fwd_v1}) {
    std::set<int> dims;
    std::set<std::string> types;
    for (int i = 0; i < kKernelTableSize; ++i) {
      if (kKernelTable[i].kind != k) continue;
      dims.insert(kKernelTable[i].head_dim);
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
  }
  return first_kind ? std::string("none") : out.str();
}

}  // namespace flashkv::cuda
