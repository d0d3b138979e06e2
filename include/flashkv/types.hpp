// flashkv/types.hpp — element types, devices and the strided tensor view every public API takes.
//
// A TensorView never owns memory. Shapes and strides are in ELEMENTS (not bytes). The last dimension of
// every attention tensor must be contiguous (stride 1); other strides are arbitrary (>= 0).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace flashkv {

/// Element types. Values are part of the C ABI (flashkv.h FLASHKV_DTYPE_*): never renumber.
enum class DType : int32_t {
  float32 = 0,   ///< IEEE binary32
  float16 = 1,   ///< IEEE binary16
  bfloat16 = 2,  ///< bfloat16 (8-bit exponent, 7-bit mantissa)
  int32 = 3,     ///< for cu_seqlens / page tables
  float64 = 4,   ///< references and tests only; attention kernels reject it
  uint8 = 5,     ///< packed quantized codes
  float8_e4m3fn = 6,  ///< OCP FP8 E4M3 "fn" (torch.float8_e4m3fn): 4-bit exponent (bias 7), 3-bit mantissa, no
                      ///< infinities, NaN = S.1111.111, max 448; the CUDA FP8 attention forward's q/k/v
};

/// Where a tensor's memory lives. Values are part of the C ABI (FLASHKV_DEVICE_*).
enum class Device : int32_t { cpu = 0, cuda = 1 };

/// Size in bytes of one element of `t`.
std::size_t dtype_size(DType t);
/// Lower-case name as users write it: "float32", "float16", "bfloat16", "int32", "float64", "uint8",
/// "float8_e4m3fn".
const char* dtype_name(DType t);
const char* device_name(Device d);

/// Non-owning strided view. shape/strides in elements; ndim <= kMaxDims.
struct TensorView {
  static constexpr int kMaxDims = 8;
  void* data = nullptr;
  DType dtype = DType::float32;
  Device device = Device::cpu;
  int32_t device_index = 0;
  int32_t ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};

  /// Row-major contiguous view over `data` with the given shape.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               Device device = Device::cpu, int32_t device_index = 0);
  int64_t numel() const;
  bool is_contiguous() const;
  /// "[2, 128, 8, 64] bfloat16 cpu" — used in error messages.
  std::string describe() const;
};

}  // namespace flashkv
