// GGUF v3 reader for the llama architecture (F32 / F16 / BF16 / Q8_0 tensors; embedded llama vocabulary).
// Every inconsistency raises IoError; F32 tensors at 4-aligned addresses are used in place (memory-mapped).
#include <cmath>
#include <cstring>
#include <map>
#include <variant>

#include "core/float16.hpp"
#include "engine/byte_reader.hpp"
#include "engine/gguf_format.hpp"
#include "flashkv/engine.hpp"

namespace flashkv {
using namespace engine_detail;

namespace {

struct Value {
  GgufValueType type = GgufValueType::u8;
  std::variant<int64_t, uint64_t, double, bool, std::string> scalar;
  GgufValueType elem_type = GgufValueType::u8;  // arrays
  std::vector<std::string> strings;              // array of string
  std::vector<double> numbers;                   // array of numbers/bools
};

struct TensorInfo {
  std::vector<uint64_t> ne;
  uint32_t type = 0;
  uint64_t offset = 0;
};

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

double read_number(ByteReader& r, GgufValueType t, Value* v) {
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

Value read_value(ByteReader& r, GgufValueType t) {
  Value v;
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

class Metadata {
 public:
  Metadata(std::map<std::string, Value> kv, const ByteReader& r) : kv_(std::move(kv)), r_(r) {}
  const Value* find(const std::string& key) const {
    auto it = kv_.find(key);
    return it == kv_.end() ? nullptr : &it->second;
  }
  std::string str(const std::string& key) const {
    const Value* v = find(key);
    if (!v) r_.fail("missing metadata key '" + key + "'");
    if (v->type != GgufValueType::string) r_.fail("metadata key '" + key + "' must be a string");
    return std::get<std::string>(v->scalar);
  }
  int64_t integer(const std::string& key, std::optional<int64_t> def = {}) const {
    const Value* v = find(key);
    if (!v) {
      if (def) return *def;
      r_.fail("missing metadata key '" + key + "'");
    }
    if (const auto* i = std::get_if<int64_t>(&v->scalar)) return *i;
    if (const auto* u = std::get_if<uint64_t>(&v->scalar)) {
      if (*u > static_cast<uint64_t>(INT64_MAX)) r_.fail("metadata key '" + key + "' out of range");
      return static_cast<int64_t>(*u);
    }
    r_.fail("metadata key '" + key + "' must be an integer");
  }
  double real(const std::string& key, double def) const {
    const Value* v = find(key);
    if (!v) return def;
    if (const auto* d = std::get_if<double>(&v->scalar)) return *d;
    r_.fail("metadata key '" + key + "' must be a float");
  }

 private:
  std::map<std::string, Value> kv_;
  const ByteReader& r_;
};

int32_t checked_i32(const ByteReader& r, const char* key, int64_t v) {
  if (v < 0 || v > INT32_MAX) r.fail(std::string("metadata '") + key + "' out of range: " + std::to_string(v));
  return static_cast<int32_t>(v);
}

Model parse(std::shared_ptr<const FileImage> img) {
  ByteReader r(img->bytes(), img->source());
  auto magic = r.take(4, "magic");
  if (std::memcmp(magic.data(), "GGUF", 4) != 0) r.fail("bad magic: not a GGUF file");
  const auto version = r.read<uint32_t>("version");
  if (version != kGgufVersion) r.fail("unsupported GGUF version " + std::to_string(version) + " (expected 3)");
  const auto n_tensors = r.read<uint64_t>("tensor count");
  const auto n_kv = r.read<uint64_t>("metadata count");
  if (n_tensors > r.remaining() / 24) r.fail("tensor count " + std::to_string(n_tensors) + " exceeds the file");
  if (n_kv > r.remaining() / 12) r.fail("metadata count " + std::to_string(n_kv) + " exceeds the file");
  std::map<std::string, Value> kv;
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = read_string(r, "metadata key");
    const auto t = static_cast<GgufValueType>(r.read<uint32_t>("metadata type"));
    if (kv.count(key)) r.fail("duplicate metadata key '" + key + "'");
    kv.emplace(std::move(key), read_value(r, t));
  }
  std::map<std::string, TensorInfo> tensors;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    std::string name = read_string(r, "tensor name");
    TensorInfo ti;
    const auto nd = r.read<uint32_t>("tensor n_dims");
    if (nd < 1 || nd > 4) r.fail("tensor '" + name + "' has " + std::to_string(nd) + " dims (expected 1..4)");
    for (uint32_t d = 0; d < nd; ++d) {
      ti.ne.push_back(r.read<uint64_t>("tensor dim"));
      if (ti.ne.back() > (uint64_t{1} << 40)) r.fail("tensor '" + name + "' dimension too large");
    }
    ti.type = r.read<uint32_t>("tensor type");
    ti.offset = r.read<uint64_t>("tensor offset");
    if (tensors.count(name)) r.fail("duplicate tensor '" + name + "'");
    tensors.emplace(std::move(name), std::move(ti));
  }
  Metadata md(std::move(kv), r);
  const int64_t align = md.integer("general.alignment", static_cast<int64_t>(kGgufDefaultAlignment));
  if (align <= 0 || align > 65536 || (align & (align - 1)) != 0)
    r.fail("general.alignment must be a power of two <= 65536, got " + std::to_string(align));
  const uint64_t data_start = (r.offset() + static_cast<uint64_t>(align) - 1) / static_cast<uint64_t>(align) *
                              static_cast<uint64_t>(align);
  if (data_start > r.size()) r.fail("tensor data section starts past the end of the file");

  const std::string arch = md.str("general.architecture");
  if (arch != "llama") r.fail("unsupported architecture '" + arch + "' (expected 'llama')");
  Model m;
  m.path = img->source();
  m.format = CheckpointFormat::gguf;
  ModelConfig& c = m.config;
  c.dim = checked_i32(r, "llama.embedding_length", md.integer("llama.embedding_length"));
  c.hidden_dim = checked_i32(r, "llama.feed_forward_length", md.integer("llama.feed_forward_length"));
  c.n_layers = checked_i32(r, "llama.block_count", md.integer("llama.block_count"));
  c.num_heads = checked_i32(r, "llama.attention.head_count", md.integer("llama.attention.head_count"));
  c.num_heads_kv = checked_i32(r, "llama.attention.head_count_kv", md.integer("llama.attention.head_count_kv", c.num_heads));
  c.seq_len = checked_i32(r, "llama.context_length", md.integer("llama.context_length"));
  c.rope_theta = static_cast<float>(md.real("llama.rope.freq_base", 10000.0));
  c.norm_eps = static_cast<float>(md.real("llama.attention.layer_norm_rms_epsilon", 1e-5));
  const auto emb = tensors.find("token_embd.weight");
  if (emb == tensors.end()) r.fail("missing tensor 'token_embd.weight'");
  if (emb->second.ne.size() != 2 || emb->second.ne[1] > (1u << 22)) r.fail("token_embd.weight must be 2-D [dim, vocab]");
  c.vocab_size = static_cast<int32_t>(emb->second.ne[1]);
  c.head_dim = c.num_heads > 0 ? c.dim / c.num_heads : 0;
  c.shared_classifier = tensors.find("output.weight") == tensors.end();
  c.validate(img->source());
  const int64_t rope_dims = md.integer("llama.rope.dimension_count", c.head_dim);
  if (rope_dims != c.head_dim)
    r.fail("llama.rope.dimension_count " + std::to_string(rope_dims) + " != head_dim " + std::to_string(c.head_dim) +
           " (partial rotary embeddings are not supported)");

  const std::size_t data_size = r.size() - static_cast<std::size_t>(data_start);
  auto load = [&](const std::string& name, std::initializer_list<uint64_t> shape) -> const float* {
    auto it = tensors.find(name);
    if (it == tensors.end()) r.fail("missing tensor '" + name + "'");
    const TensorInfo& ti = it->second;
    std::vector<uint64_t> want(shape);
    if (ti.ne != want) {
      std::string got, exp;
      for (auto d : ti.ne) got += (got.empty() ? "" : ", ") + std::to_string(d);
      for (auto d : want) exp += (exp.empty() ? "" : ", ") + std::to_string(d);
      r.fail("tensor '" + name + "' has shape [" + got + "], expected [" + exp + "]");
    }
    uint64_t n = 1;
    for (auto d : want) n *= d;
    uint64_t bytes = 0;
    switch (static_cast<GgufType>(ti.type)) {
      case GgufType::f32: bytes = n * 4; break;
      case GgufType::f16: case GgufType::bf16: bytes = n * 2; break;
      case GgufType::q8_0:
        if (want[0] % kQ8Block != 0) r.fail("Q8_0 tensor '" + name + "' has ne[0] not a multiple of 32");
        bytes = n / kQ8Block * kQ8BlockBytes;
        break;
      default: r.fail("tensor '" + name + "' has unsupported type " + std::to_string(ti.type) +
                      " (supported: F32=0, F16=1, Q8_0=8, BF16=30)");
    }
    if (ti.offset % static_cast<uint64_t>(align) != 0) r.fail("tensor '" + name + "' offset is not aligned");
    if (ti.offset > data_size || bytes > data_size - ti.offset)
      r.fail("tensor '" + name + "' data [" + std::to_string(ti.offset) + ", +" + std::to_string(bytes) +
             ") runs past the end of the file (truncated?)");
    const uint8_t* src = r.data_at(static_cast<std::size_t>(data_start + ti.offset));
    const auto type = static_cast<GgufType>(ti.type);
    if (type == GgufType::f32 && reinterpret_cast<uintptr_t>(src) % alignof(float) == 0)
      return reinterpret_cast<const float*>(src);
    std::unique_ptr<float[]> dst(new float[n]);
    for (uint64_t i = 0; i < n; ++i) {
      if (type == GgufType::f32) {
        std::memcpy(&dst[i], src + 4 * i, 4);
      } else if (type == GgufType::f16 || type == GgufType::bf16) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = type == GgufType::f16 ? fp16_to_float(h) : bf16_to_float(h);
      } else {
        const uint8_t* blk = src + (i / kQ8Block) * kQ8BlockBytes;
        uint16_t d;
        std::memcpy(&d, blk, 2);
        dst[i] = fp16_to_float(d) * static_cast<float>(static_cast<int8_t>(blk[2 + i % kQ8Block]));
      }
    }
    m.owned.push_back(std::move(dst));
    return m.owned.back().get();
  };
  const uint64_t D = c.dim, H = c.hidden_dim, V = c.vocab_size, KV = c.kv_dim(),
                 Q = static_cast<uint64_t>(c.num_heads) * c.head_dim;
  m.token_embedding = load("token_embd.weight", {D, V});
  m.layers.resize(static_cast<std::size_t>(c.n_layers));
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    auto& L = m.layers[static_cast<std::size_t>(l)];
    L.attn_norm = load(p + "attn_norm.weight", {D});
    L.wq = load(p + "attn_q.weight", {D, Q});
    L.wk = load(p + "attn_k.weight", {D, KV});
    L.wv = load(p + "attn_v.weight", {D, KV});
    L.wo = load(p + "attn_output.weight", {Q, D});
    L.ffn_norm = load(p + "ffn_norm.weight", {D});
    L.w1 = load(p + "ffn_gate.weight", {D, H});
    L.w2 = load(p + "ffn_down.weight", {H, D});
    L.w3 = load(p + "ffn_up.weight", {D, H});
  }
  m.final_norm = load("output_norm.weight", {D});
  m.classifier = c.shared_classifier ? m.token_embedding : load("output.weight", {D, V});

  // Embedded vocabulary (optional).
  if (md.find("tokenizer.ggml.model")) {
    const std::string tm = md.str("tokenizer.ggml.model");
    if (tm != "llama") r.fail("unsupported tokenizer.ggml.model '" + tm + "' (expected 'llama')");
    const Value* toks = md.find("tokenizer.ggml.tokens");
    const Value* scores = md.find("tokenizer.ggml.scores");
    if (!toks || toks->type != GgufValueType::array || toks->elem_type != GgufValueType::string)
      r.fail("tokenizer.ggml.tokens must be an array of strings");
    if (toks->strings.size() != static_cast<std::size_t>(c.vocab_size))
      r.fail("tokenizer has " + std::to_string(toks->strings.size()) + " tokens, model vocab_size is " +
             std::to_string(c.vocab_size));
    std::vector<float> sc(toks->strings.size(), 0.0f);
    if (scores) {
      if (scores->type != GgufValueType::array || scores->numbers.size() != toks->strings.size())
        r.fail("tokenizer.ggml.scores must be an array with one score per token");
      for (std::size_t i = 0; i < sc.size(); ++i) sc[i] = static_cast<float>(scores->numbers[i]);
    }
    std::vector<std::string> pieces;
    pieces.reserve(toks->strings.size());
    for (const auto& t : toks->strings) {
      std::string p;
      for (std::size_t i = 0; i < t.size();) {
        if (t.compare(i, 3, kSentencePieceSpace) == 0) { p += ' '; i += 3; } else { p += t[i++]; }
      }
      pieces.push_back(std::move(p));
    }
    const int64_t nv = c.vocab_size;
    auto id = [&](const char* key, int64_t def) {
      const int64_t v = md.integer(key, std::min<int64_t>(def, nv - 1));
      if (v < 0 || v >= nv) r.fail(std::string(key) + " " + std::to_string(v) + " out of range");
      return static_cast<int32_t>(v);
    };
    m.embedded_tokenizer = std::make_shared<const Tokenizer>(std::move(pieces), std::move(sc),
                                                             id("tokenizer.ggml.bos_token_id", 1),
                                                             id("tokenizer.ggml.eos_token_id", 2),
                                                             id("tokenizer.ggml.unknown_token_id", 0));
  }
  m.storage_keepalive = std::move(img);
  return m;
}

}  // namespace

Model load_gguf(const std::string& path) { return parse(FileImage::map(path)); }
Model load_gguf_from_bytes(std::span<const uint8_t> bytes) { return parse(FileImage::copy(bytes)); }

GgufType parse_gguf_type(const std::string& name, const std::string& argument) {
  if (name == "f32") return GgufType::f32;
  if (name == "f16") return GgufType::f16;
  if (name == "bf16") return GgufType::bf16;
  if (name == "q8_0") return GgufType::q8_0;
  throw Error(argument, "one of f32, f16, bf16, q8_0", "'" + name + "'");
}

}  // namespace flashkv
