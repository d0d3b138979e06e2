// GGUF v3 parsing: metadata values, the tensor table and tensor bounds. Every inconsistency raises IoError.
#include "engine/gguf_file.hpp"

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "engine/ggml_quants.hpp"
#include "flashkv/error.hpp"
#include "flashkv/model.hpp"

namespace flashkv::engine_detail {

namespace {

std::string read_string(ByteReader& r, const char* what) {
  const auto n = r.read<uint64_t>(what);
  if (n > r.remaining()) r.fail(std::string("string length ") + std::to_string(n) + " of " + what + " exceeds the file");
  auto s = r.take(static_cast<std::size_t>(n), what);
  return {reinterpret_cast<const char*>(s.data()), s.size()};
}

std::size_t scalar_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::u8: case GgufValueType::i8: case GgufValueType::boolean: return 1;
    case GgufValueType::u16: case GgufValueType::i16: return 2;
    case GgufValueType::u32: case GgufValueType::i32: case GgufValueType::f32: return 4;
    case GgufValueType::u64: case GgufValueType::i64: case GgufValueType::f64: return 8;
    default: return 0;
  }
}

const char* value_type_name(GgufValueType t) {
  switch (t) {
    case GgufValueType::u8: return "u8";
    case GgufValueType::i8: return "i8";
    case GgufValueType::u16: return "u16";
    case GgufValueType::i16: return "i16";
    case GgufValueType::u32: return "u32";
    case GgufValueType::i32: return "i32";
    case GgufValueType::f32: return "f32";
    case GgufValueType::boolean: return "bool";
    case GgufValueType::string: return "string";
    case GgufValueType::array: return "array";
    case GgufValueType::u64: return "u64";
    case GgufValueType::i64: return "i64";
    case GgufValueType::f64: return "f64";
  }
  return "?";
}

double read_number(ByteReader& r, GgufValueType t, GgufValue* v) {
  switch (t) {
    case GgufValueType::u8: { auto x = r.read<uint8_t>("u8"); if (v) v->scalar = uint64_t{x}; return x; }
    case GgufValueType::i8: { auto x = r.read<int8_t>("i8"); if (v) v->scalar = int64_t{x}; return x; }
    case GgufValueType::u16: { auto x = r.read<uint16_t>("u16"); if (v) v->scalar = uint64_t{x}; return x; }
    case GgufValueType::i16: { auto x = r.read<int16_t>("i16"); if (v) v->scalar = int64_t{x}; return x; }
    case GgufValueType::u32: { auto x = r.read<uint32_t>("u32"); if (v) v->scalar = uint64_t{x}; return x; }
    case GgufValueType::i32: { auto x = r.read<int32_t>("i32"); if (v) v->scalar = int64_t{x}; return x; }
    case GgufValueType::u64: { auto x = r.read<uint64_t>("u64"); if (v) v->scalar = x; return static_cast<double>(x); }
    case GgufValueType::i64: { auto x = r.read<int64_t>("i64"); if (v) v->scalar = x; return static_cast<double>(x); }
    case GgufValueType::f32: { auto x = r.read<float>("f32"); if (v) v->scalar = double{x}; return x; }
    case GgufValueType::f64: { auto x = r.read<double>("f64"); if (v) v->scalar = x; return x; }
    case GgufValueType::boolean: {
      auto x = r.read<uint8_t>("bool");
      if (x > 1) r.fail("bool value must be 0 or 1, got " + std::to_string(x));
      if (v) v->scalar = x == 1;
      return x;
    }
    default: r.fail("unknown GGUF value type " + std::to_string(static_cast<uint32_t>(t)));
  }
}

GgufValue read_value(ByteReader& r, GgufValueType t) {
  GgufValue v;
  v.type = t;
  if (t == GgufValueType::string) {
    v.scalar = read_string(r, "string value");
  } else if (t == GgufValueType::array) {
    const auto et = static_cast<GgufValueType>(r.read<uint32_t>("array element type"));
    const auto n = r.read<uint64_t>("array length");
    v.elem_type = et;
    if (et == GgufValueType::string) {
      if (n > r.remaining() / 8) r.fail("array of " + std::to_string(n) + " strings exceeds the file");
      v.strings.reserve(static_cast<std::size_t>(n));
      for (uint64_t i = 0; i < n; ++i) v.strings.push_back(read_string(r, "array string"));
    } else {
      const std::size_t es = scalar_size(et);
      if (es == 0) r.fail("unsupported GGUF array element type " + std::to_string(static_cast<uint32_t>(et)));
      if (n > r.remaining() / es) r.fail("array of " + std::to_string(n) + " elements exceeds the file");
      v.numbers.reserve(static_cast<std::size_t>(n));
      for (uint64_t i = 0; i < n; ++i) v.numbers.push_back(read_number(r, et, nullptr));
    }
  } else {
    read_number(r, t, &v);
  }
  return v;
}

}  // namespace

std::string GgufValue::to_string() const {
  if (type == GgufValueType::array) {
    const std::size_t n = elem_type == GgufValueType::string ? strings.size() : numbers.size();
    std::string s = "[";  // built piecewise: GCC 12 warns (-Wrestrict, a false positive) on the chained operator+
    s += std::to_string(n);
    s += " x ";
    s += value_type_name(elem_type);
    s += "]";
    return s;
  }
  if (const auto* s = std::get_if<std::string>(&scalar)) return *s;
  if (const auto* i = std::get_if<int64_t>(&scalar)) return std::to_string(*i);
  if (const auto* u = std::get_if<uint64_t>(&scalar)) return std::to_string(*u);
  if (const auto* b = std::get_if<bool>(&scalar)) return *b ? "true" : "false";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", std::get<double>(scalar));
  return buf;
}

GgufFile::GgufFile(std::shared_ptr<const FileImage> img) : img_(std::move(img)) {
  ByteReader r(img_->bytes(), img_->source());
  auto magic = r.take(4, "magic");
  if (std::memcmp(magic.data(), "GGUF", 4) != 0) r.fail("bad magic: not a GGUF file");
  version_ = r.read<uint32_t>("version");
  if (version_ != kGgufVersion) r.fail("unsupported GGUF version " + std::to_string(version_) + " (expected 3)");
  const auto n_tensors = r.read<uint64_t>("tensor count");
  const auto n_kv = r.read<uint64_t>("metadata count");
  if (n_tensors > r.remaining() / 24) r.fail("tensor count " + std::to_string(n_tensors) + " exceeds the file");
  if (n_kv > r.remaining() / 12) r.fail("metadata count " + std::to_string(n_kv) + " exceeds the file");
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = read_string(r, "metadata key");
    const auto t = static_cast<GgufValueType>(r.read<uint32_t>("metadata type"));
    if (kv_.count(key)) r.fail("duplicate metadata key '" + key + "'");
    GgufValue v = read_value(r, t);
    key_order_.push_back(key);
    kv_.emplace(std::move(key), std::move(v));
  }
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor ti;
    ti.name = read_string(r, "tensor name");
    const auto nd = r.read<uint32_t>("tensor n_dims");
    if (nd < 1 || nd > 4) r.fail("tensor '" + ti.name + "' has " + std::to_string(nd) + " dims (expected 1..4)");
    ti.n_values = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      ti.ne.push_back(r.read<uint64_t>("tensor dim"));
      if (ti.ne.back() > (uint64_t{1} << 40)) r.fail("tensor '" + ti.name + "' dimension too large");
      ti.n_values *= ti.ne.back();
      if (ti.n_values > (uint64_t{1} << 40)) r.fail("tensor '" + ti.name + "' has too many elements");
    }
    ti.type = r.read<uint32_t>("tensor type");
    ti.offset = r.read<uint64_t>("tensor offset");
    if (tensor_index_.count(ti.name)) r.fail("duplicate tensor '" + ti.name + "'");
    tensor_index_.emplace(ti.name, tensors_.size());
    tensors_.push_back(std::move(ti));
  }
  const int64_t align = integer("general.alignment", static_cast<int64_t>(kGgufDefaultAlignment));
  if (align <= 0 || align > 65536 || (align & (align - 1)) != 0)
    r.fail("general.alignment must be a power of two <= 65536, got " + std::to_string(align));
  const uint64_t data_start = (r.offset() + static_cast<uint64_t>(align) - 1) / static_cast<uint64_t>(align) *
                              static_cast<uint64_t>(align);
  if (data_start > r.size()) r.fail("tensor data section starts past the end of the file");
  const uint64_t data_size = r.size() - data_start;
  for (GgufTensor& t : tensors_) {
    const GgmlTypeInfo* ti = ggml_type_info(t.type);
    if (ti == nullptr) continue;  // reported when (if) the tensor is used
    if (t.ne[0] % static_cast<uint64_t>(ti->block_values) != 0)
      r.fail("tensor '" + t.name + "' of type " + ti->name + " has ne[0] = " + std::to_string(t.ne[0]) +
             ", not a multiple of its block size " + std::to_string(ti->block_values));
    t.bytes = t.n_values / static_cast<uint64_t>(ti->block_values) * static_cast<uint64_t>(ti->block_bytes);
    if (t.offset % static_cast<uint64_t>(align) != 0)
      r.fail("tensor '" + t.name + "' offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
             std::to_string(align));
    if (t.offset > data_size || t.bytes > data_size - t.offset)
      r.fail("tensor '" + t.name + "' data [" + std::to_string(t.offset) + ", +" + std::to_string(t.bytes) +
             ") runs past the end of the file's data section (" + std::to_string(data_size) + " bytes; truncated?)");
    t.data = r.data_at(static_cast<std::size_t>(data_start + t.offset));
  }
}

void GgufFile::fail(const std::string& what) const { throw IoError("flashkv: " + source() + ": " + what); }

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

std::string GgufFile::str(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) fail("missing metadata key '" + key + "'");
  if (v->type != GgufValueType::string) fail("metadata key '" + key + "' must be a string");
  return std::get<std::string>(v->scalar);
}

std::string GgufFile::str_or(const std::string& key, const std::string& def) const {
  return find(key) ? str(key) : def;
}

int64_t GgufFile::integer(const std::string& key, std::optional<int64_t> def) const {
  const GgufValue* v = find(key);
  if (!v) {
    if (def) return *def;
    fail("missing metadata key '" + key + "'");
  }
  if (const auto* i = std::get_if<int64_t>(&v->scalar); i && v->type != GgufValueType::array) return *i;
  if (const auto* u = std::get_if<uint64_t>(&v->scalar); u && v->type != GgufValueType::array) {
    if (*u > static_cast<uint64_t>(INT64_MAX)) fail("metadata key '" + key + "' out of range");
    return static_cast<int64_t>(*u);
  }
  fail("metadata key '" + key + "' must be an integer");
}

double GgufFile::real(const std::string& key, double def) const {
  const GgufValue* v = find(key);
  if (!v) return def;
  if (const auto* d = std::get_if<double>(&v->scalar); d && v->type != GgufValueType::array) return *d;
  fail("metadata key '" + key + "' must be a float");
}

bool GgufFile::boolean(const std::string& key, bool def) const {
  const GgufValue* v = find(key);
  if (!v) return def;
  if (const auto* b = std::get_if<bool>(&v->scalar); b && v->type == GgufValueType::boolean) return *b;
  fail("metadata key '" + key + "' must be a bool");
}

const std::vector<std::string>& GgufFile::string_array(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) fail("missing metadata key '" + key + "'");
  if (v->type != GgufValueType::array || v->elem_type != GgufValueType::string)
    fail("metadata key '" + key + "' must be an array of strings");
  return v->strings;
}

std::vector<int32_t> GgufFile::int_array(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) fail("missing metadata key '" + key + "'");
  const bool integral = v->elem_type == GgufValueType::i32 || v->elem_type == GgufValueType::u32 ||
                        v->elem_type == GgufValueType::i8 || v->elem_type == GgufValueType::u8 ||
                        v->elem_type == GgufValueType::i16 || v->elem_type == GgufValueType::u16 ||
                        v->elem_type == GgufValueType::i64 || v->elem_type == GgufValueType::u64;
  if (v->type != GgufValueType::array || !integral) fail("metadata key '" + key + "' must be an array of integers");
  std::vector<int32_t> out;
  out.reserve(v->numbers.size());
  for (double x : v->numbers) {
    if (x < static_cast<double>(INT32_MIN) || x > static_cast<double>(INT32_MAX))
      fail("metadata key '" + key + "' has an element out of the int32 range");
    out.push_back(static_cast<int32_t>(x));
  }
  return out;
}

const GgufTensor* GgufFile::tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

void GgufFile::dequantize(const GgufTensor& t, float* dst) const {
  const GgmlTypeInfo* ti = ggml_type_info(t.type);
  if (ti == nullptr)
    fail("tensor '" + t.name + "' has unsupported type " + ggml_type_name(t.type) + " (ggml type " +
         std::to_string(t.type) + "; supported: " + ggml_supported_types() + ")");
  const int64_t bad = ggml_dequantize(*ti, t.data, dst, static_cast<int64_t>(t.n_values));
  if (bad >= 0)
    fail("tensor '" + t.name + "' (" + ti->name + ") has a non-finite value at element " + std::to_string(bad) +
         " (block " + std::to_string(bad / ti->block_values) + "): corrupt scale or data");
}

}  // namespace flashkv::engine_detail

namespace flashkv {

std::string gguf_type_name(uint32_t type) { return engine_detail::ggml_type_name(type); }

GgufInfo read_gguf_info(const std::string& path) {
  engine_detail::GgufFile f(engine_detail::FileImage::map(path));
  GgufInfo info;
  info.version = f.version();
  for (const auto& k : f.keys()) info.metadata.emplace_back(k, f.find(k)->to_string());
  for (const auto& t : f.tensors()) info.tensors.push_back({t.name, t.ne, t.type, t.offset, t.bytes});
  return info;
}

std::vector<float> read_gguf_tensor(const std::string& path, const std::string& name) {
  engine_detail::GgufFile f(engine_detail::FileImage::map(path));
  const auto* t = f.tensor(name);
  if (t == nullptr) f.fail("no tensor named '" + name + "'");
  std::vector<float> out(static_cast<std::size_t>(t->n_values));
  f.dequantize(*t, out.data());
  return out;
}

}  // namespace flashkv
