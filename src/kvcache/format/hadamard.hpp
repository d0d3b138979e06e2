// The randomized Walsh–Hadamard rotation of rotation = hadamard caches (QuaRot, Ashkboos et al., arXiv 2404.00456, §4;
// include/flashkv/kvcache.hpp ROTATION): one definition for the CPU cache (append, dequantize, attention) and the CUDA
// decode / append (src/cuda/decode_rotate.cu), so that both compute the same float32 values bit for bit.
//   forward  x' = H·D·x · norm      (D = diag(signs), ±1 from the cache's rotation_seed: hadamard_signs)
//   inverse  x  = D·H·x' · norm     (H·H = n·I, so norm = 1 / sqrt(n) makes the rotation orthogonal)
// n = head_dim, a power of two. The butterfly stages run h = 1, 2, 4, … < n; stage h maps the pair (j, j + h),
// j = (t / h)·2h + t % h for t in [0, n/2), to (a + b, a − b). Every element sees the same additions in the same order
// whichever thread computes which pair, hence the lane parameterization (CPU: one lane; CUDA: a warp's 32 lanes with
// __syncwarp between stages).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.hpp"

namespace flashkv::kv {

/// 1 / sqrt(n) rounded to float32, the rotation's normalization (computed on the host and passed to the device).
inline float hadamard_norm(int32_t n) { return 1.0f / std::sqrt(static_cast<float>(n)); }

/// In-place rotation of x[0, n) by `lanes` cooperating threads (this one is `lane`); sync() orders the stages
/// (a no-op for one lane). signs: the ±1 diagonal [n]; norm: hadamard_norm(n).
template <class Sync>
FLASHKV_HD void hadamard_rotate_lanes(float* x, int32_t n, const float* signs, float norm, bool inverse, int32_t lane,
                                      int32_t lanes, Sync sync) {
  if (!inverse) {
    for (int32_t i = lane; i < n; i += lanes) x[i] *= signs[i];
    sync();
  }
  for (int32_t h = 1; h < n; h *= 2) {
    for (int32_t t = lane; t < n / 2; t += lanes) {
      const int32_t j = (t / h) * 2 * h + t % h;
      const float a = x[j], b = x[j + h];
      x[j] = a + b;
      x[j + h] = a - b;
    }
    sync();
  }
  for (int32_t i = lane; i < n; i += lanes) {
    x[i] *= norm;
    if (inverse) x[i] *= signs[i];
  }
  sync();
}

}  // namespace flashkv::kv
