// Division of 31-bit unsigned integers by a divisor fixed before a kernel launch: one multiply-high, one add and one
// shift instead of the ~20-instruction integer division sequence (or an int64 division's subroutine) per use.
// Granlund & Montgomery, "Division by Invariant Integers using Multiplication" (PLDI 1994), §4 Figure 4.1: with
// l = ceil(log2 d) and m = floor(2^32 · (2^l − d) / d) + 1, floor(n / d) = (mulhi(m, n) + n) >> l for every n < 2^32
// (the sum is formed in 33 bits there; it fits 32 bits here because n < 2^31 — callers guarantee it).
// Host and device (FLASHKV_HD); tests/core/test_fast_divmod.cpp checks it against `/` and `%`.
#pragma once
#include <cstdint>
#include <stdexcept>

#include "core/host_device.hpp"

namespace flashkv::core {

struct FastDivmod {
  uint32_t divisor = 1;
  uint32_t multiplier = 1;  ///< m above
  uint32_t shift = 0;       ///< l above

  FastDivmod() = default;
  /// 1 <= d <= 2^31 (std::invalid_argument otherwise: a caller's bug, the launchers check their shapes first).
  explicit FastDivmod(uint32_t d) : divisor(d) {
    if (d == 0 || d > (uint32_t{1} << 31)) throw std::invalid_argument("FastDivmod: divisor outside [1, 2^31]");
    uint32_t l = 0;
    while ((uint64_t{1} << l) < divisor) ++l;
    multiplier = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << l) - divisor)) / divisor + 1);
    shift = l;
  }
  /// floor(n / divisor) for n < 2^31.
  FLASHKV_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(multiplier, n);
#else
    const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(multiplier) * n) >> 32);
#endif
    return (hi + n) >> shift;
  }
  /// q = floor(n / divisor), r = n − q · divisor, for n < 2^31.
  FLASHKV_HD void divmod(uint32_t n, uint32_t& q, uint32_t& r) const {
    q = div(n);
    r = n - q * divisor;
  }
};

}  // namespace flashkv::core
