// Internal: a parsed GGUF v3 file (any architecture) — metadata, tensor table, bounds-checked tensor data.
// File layout: "GGUF" u32 version u64 n_tensors u64 n_kv; n_kv × (string key, u32 type, value);
// n_tensors × (string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset); pad to general.alignment;
// tensor data (offsets relative to the data start, each aligned). Strings are u64 length + bytes (no NUL).
// ne[0] is the fastest-varying dimension: a row-major [out, in] matrix has ne = {in, out}.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "engine/byte_reader.hpp"
#include "engine/gguf_format.hpp"

namespace flashkv::engine_detail {

struct GgufValue {
  GgufValueType type = GgufValueType::u8;
  std::variant<int64_t, uint64_t, double, bool, std::string> scalar;
  GgufValueType elem_type = GgufValueType::u8;  // arrays
  std::vector<std::string> strings;              // array of string
  std::vector<double> numbers;                   // array of numbers/bools
  /// Short text for listings: scalars as text, arrays as "[N × type]".
  std::string to_string() const;
};

struct GgufTensor {
  std::string name;
  std::vector<uint64_t> ne;
  uint32_t type = 0;
  uint64_t offset = 0;          // relative to the data section
  uint64_t n_values = 0;        // product of ne
  uint64_t bytes = 0;           // 0 when the type is not supported
  const uint8_t* data = nullptr;  // nullptr when the type is not supported
};

class GgufFile {
 public:
  /// Parses and bounds-checks everything (IoError naming the source, key or tensor on any inconsistency). Tensors of
  /// supported types must lie inside the file, aligned, with ne[0] a multiple of the block size.
  explicit GgufFile(std::shared_ptr<const FileImage> img);

  const std::string& source() const { return img_->source(); }
  uint32_t version() const { return version_; }
  const std::shared_ptr<const FileImage>& image() const { return img_; }

  // Metadata
  const GgufValue* find(const std::string& key) const;
  const std::vector<std::string>& keys() const { return key_order_; }
  std::string str(const std::string& key) const;                                  // required string
  std::string str_or(const std::string& key, const std::string& def) const;
  int64_t integer(const std::string& key, std::optional<int64_t> def = {}) const;  // any integer type
  double real(const std::string& key, double def) const;                          // f32 / f64
  bool boolean(const std::string& key, bool def) const;
  const std::vector<std::string>& string_array(const std::string& key) const;     // required
  std::vector<int32_t> int_array(const std::string& key) const;                   // required, integer elements

  // Tensors
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* tensor(const std::string& name) const;
  /// Dequantizes `t` to float32 into `dst` (t.n_values floats). IoError naming the tensor for an unsupported type or
  /// a non-finite value (corrupt scale).
  void dequantize(const GgufTensor& t, float* dst) const;

  [[noreturn]] void fail(const std::string& what) const;

 private:
  std::shared_ptr<const FileImage> img_;
  uint32_t version_ = 0;
  std::map<std::string, GgufValue> kv_;
  std::vector<std::string> key_order_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, std::size_t> tensor_index_;
};

}  // namespace flashkv::engine_detail
