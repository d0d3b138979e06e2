#include "flashkv/types.hpp"

#include "flashkv/attention.hpp"
#include "flashkv/error.hpp"

namespace flashkv {

const char* kernel_family_name(KernelFamily f) {
  switch (f) {
    case KernelFamily::automatic: return "auto";
    case KernelFamily::sm80: return "sm80";
    case KernelFamily::sm90: return "sm90";
    case KernelFamily::sm90ws: return "sm90ws";
  }
  return "unknown";
}

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::float32: return 4;
    case DType::float16: return 2;
    case DType::bfloat16: return 2;
    case DType::int32: return 4;
    case DType::float64: return 8;
    case DType::uint8: return 1;
    case DType::float8_e4m3fn: return 1;
  }
  throw Error("dtype", "one of float32, float16, bfloat16, int32, float64, uint8, float8_e4m3fn",
              "enum value " + std::to_string(static_cast<int>(t)));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::float32: return "float32";
    case DType::float16: return "float16";
    case DType::bfloat16: return "bfloat16";
    case DType::int32: return "int32";
    case DType::float64: return "float64";
    case DType::uint8: return "uint8";
    case DType::float8_e4m3fn: return "float8_e4m3fn";
  }
  return "unknown";
}

const char* device_name(Device d) { return d == Device::cpu ? "cpu" : d == Device::cuda ? "cuda" : "unknown"; }

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device,
                                  int32_t device_index) {
  if (shape.size() > static_cast<std::size_t>(kMaxDims)) {
    throw Error("shape", "at most " + std::to_string(kMaxDims) + " dimensions", std::to_string(shape.size()));
  }
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.device_index = device_index;
  t.ndim = static_cast<int32_t>(shape.size());
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.strides[d] = stride;
    stride *= t.shape[d];
  }
  return t;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != stride) return false;
    stride *= shape[d];
  }
  return true;
}

std::string TensorView::describe() const {
  std::string s = "[";
  for (int d = 0; d < ndim; ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  s += "] ";
  s += dtype_name(dtype);
  s += " ";
  s += device_name(device);
  return s;
}

}  // namespace flashkv
