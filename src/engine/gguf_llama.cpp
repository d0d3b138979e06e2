// GGUF v3 → a llama-architecture Model: hyper-parameters from llama.* metadata, weights dequantized to float32 (F32
// tensors at 4-aligned addresses are used in place, memory-mapped), and the embedded vocabulary (SentencePiece
// "llama" or byte-level BPE "gpt2").
#include <algorithm>
#include <cstring>

#include "engine/ggml_quants.hpp"
#include "engine/gguf_file.hpp"
#include "flashkv/engine.hpp"
#include "flashkv/error.hpp"

namespace flashkv {
using namespace engine_detail;

namespace {

int32_t checked_i32(const GgufFile& f, const char* key, int64_t v) {
  if (v < 0 || v > INT32_MAX) f.fail(std::string("metadata '") + key + "' out of range: " + std::to_string(v));
  return static_cast<int32_t>(v);
}

std::string shape_text(const std::vector<uint64_t>& ne) {
  std::string s;
  for (auto d : ne) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return "[" + s + "]";
}

/// The "llama" (SentencePiece) vocabulary: pieces with U+2581 for spaces, scores, special ids.
std::shared_ptr<const Tokenizer> spm_vocabulary(const GgufFile& f, int32_t vocab_size) {
  const auto& toks = f.string_array("tokenizer.ggml.tokens");
  if (toks.size() != static_cast<std::size_t>(vocab_size))
    f.fail("tokenizer has " + std::to_string(toks.size()) + " tokens, model vocab_size is " + std::to_string(vocab_size));
  std::vector<float> sc(toks.size(), 0.0f);
  if (const GgufValue* scores = f.find("tokenizer.ggml.scores")) {
    if (scores->type != GgufValueType::array || scores->numbers.size() != toks.size())
      f.fail("tokenizer.ggml.scores must be an array with one score per token");
    for (std::size_t i = 0; i < sc.size(); ++i) sc[i] = static_cast<float>(scores->numbers[i]);
  }
  std::vector<std::string> pieces;
  pieces.reserve(toks.size());
  for (const auto& t : toks) {
    std::string p;
    for (std::size_t i = 0; i < t.size();) {
      if (t.compare(i, 3, kSentencePieceSpace) == 0) { p += ' '; i += 3; } else { p += t[i++]; }
    }
    pieces.push_back(std::move(p));
  }
  const int64_t nv = vocab_size;
  auto id = [&](const char* key, int64_t def) {
    const int64_t v = f.integer(key, std::min<int64_t>(def, nv - 1));
    if (v < 0 || v >= nv) f.fail(std::string(key) + " " + std::to_string(v) + " out of range [0, " + std::to_string(nv) + ")");
    return static_cast<int32_t>(v);
  };
  return std::make_shared<const Tokenizer>(std::move(pieces), std::move(sc), id("tokenizer.ggml.bos_token_id", 1),
                                           id("tokenizer.ggml.eos_token_id", 2), id("tokenizer.ggml.unknown_token_id", 0));
}

/// The "gpt2" (byte-level BPE) vocabulary.
std::shared_ptr<const Tokenizer> bpe_vocabulary(const GgufFile& f, int32_t vocab_size) {
  BpeVocab v;
  v.tokens = f.string_array("tokenizer.ggml.tokens");
  if (v.tokens.size() != static_cast<std::size_t>(vocab_size))
    f.fail("tokenizer has " + std::to_string(v.tokens.size()) + " tokens, model vocab_size is " +
           std::to_string(vocab_size));
  v.merges = f.string_array("tokenizer.ggml.merges");
  if (f.find("tokenizer.ggml.token_type")) {
    v.token_types = f.int_array("tokenizer.ggml.token_type");
    if (v.token_types.size() != v.tokens.size())
      f.fail("tokenizer.ggml.token_type has " + std::to_string(v.token_types.size()) + " entries for " +
             std::to_string(v.tokens.size()) + " tokens");
  }
  v.pre = f.str_or("tokenizer.ggml.pre", "gpt2");
  auto id = [&](const char* key) -> int32_t {
    const int64_t x = f.integer(key, -1);
    if (x < -1 || x >= vocab_size) f.fail(std::string(key) + " " + std::to_string(x) + " out of range [0, " + std::to_string(vocab_size) + ")");
    return static_cast<int32_t>(x);
  };
  v.bos_id = id("tokenizer.ggml.bos_token_id");
  v.eos_id = id("tokenizer.ggml.eos_token_id");
  v.unk_id = id("tokenizer.ggml.unknown_token_id");
  v.eot_id = id("tokenizer.ggml.eot_token_id");
  v.pad_id = id("tokenizer.ggml.padding_token_id");
  v.add_bos = f.boolean("tokenizer.ggml.add_bos_token", false);
  if (v.add_bos && v.bos_id < 0) f.fail("tokenizer.ggml.add_bos_token is true but there is no bos_token_id");
  v.chat_template = f.str_or("tokenizer.chat_template", "");
  return std::make_shared<const Tokenizer>(Tokenizer::byte_level_bpe(std::move(v), f.source()));
}

Model parse(std::shared_ptr<const FileImage> img) {
  GgufFile f(std::move(img));
  const std::string arch = f.str("general.architecture");
  if (arch != "llama") f.fail("unsupported architecture '" + arch + "' (expected 'llama')");
  Model m;
  m.path = f.source();
  m.format = CheckpointFormat::gguf;
  ModelConfig& c = m.config;
  c.dim = checked_i32(f, "llama.embedding_length", f.integer("llama.embedding_length"));
  c.hidden_dim = checked_i32(f, "llama.feed_forward_length", f.integer("llama.feed_forward_length"));
  c.n_layers = checked_i32(f, "llama.block_count", f.integer("llama.block_count"));
  c.num_heads = checked_i32(f, "llama.attention.head_count", f.integer("llama.attention.head_count"));
  c.num_heads_kv = checked_i32(f, "llama.attention.head_count_kv", f.integer("llama.attention.head_count_kv", c.num_heads));
  c.seq_len = checked_i32(f, "llama.context_length", f.integer("llama.context_length"));
  c.rope_theta = static_cast<float>(f.real("llama.rope.freq_base", 10000.0));
  c.norm_eps = static_cast<float>(f.real("llama.attention.layer_norm_rms_epsilon", 1e-5));
  const GgufTensor* emb = f.tensor("token_embd.weight");
  if (emb == nullptr) f.fail("missing tensor 'token_embd.weight'");
  if (emb->ne.size() != 2 || emb->ne[1] > (1u << 22)) f.fail("tensor 'token_embd.weight' must be 2-D [dim, vocab]");
  c.vocab_size = static_cast<int32_t>(emb->ne[1]);
  if (const GgufValue* vs = f.find("llama.vocab_size"); vs != nullptr && f.integer("llama.vocab_size") != c.vocab_size)
    f.fail("llama.vocab_size " + std::to_string(f.integer("llama.vocab_size")) + " != token_embd.weight rows " +
           std::to_string(c.vocab_size));
  c.head_dim = c.num_heads > 0 ? c.dim / c.num_heads : 0;
  c.shared_classifier = f.tensor("output.weight") == nullptr;
  c.validate(f.source());
  const int64_t rope_dims = f.integer("llama.rope.dimension_count", c.head_dim);
  if (rope_dims != c.head_dim)
    f.fail("llama.rope.dimension_count " + std::to_string(rope_dims) + " != head_dim " + std::to_string(c.head_dim) +
           " (partial rotary embeddings are not supported)");
  if (f.find("llama.rope.scaling.type") && f.str("llama.rope.scaling.type") != "none")
    f.fail("llama.rope.scaling.type '" + f.str("llama.rope.scaling.type") + "' is not supported (only unscaled RoPE)");

  auto load = [&](const std::string& name, std::initializer_list<uint64_t> shape) -> const float* {
    const GgufTensor* t = f.tensor(name);
    if (t == nullptr) f.fail("missing tensor '" + name + "'");
    const std::vector<uint64_t> want(shape);
    if (t->ne != want) f.fail("tensor '" + name + "' has shape " + shape_text(t->ne) + ", expected " + shape_text(want));
    m.tensor_types.emplace_back(name, ggml_type_name(t->type));
    if (t->type == static_cast<uint32_t>(GgufType::f32) && reinterpret_cast<uintptr_t>(t->data) % alignof(float) == 0)
      return reinterpret_cast<const float*>(t->data);
    std::unique_ptr<float[]> dst(new float[t->n_values]);
    f.dequantize(*t, dst.get());
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
  if (f.find("tokenizer.ggml.model")) {
    const std::string tm = f.str("tokenizer.ggml.model");
    if (tm == "llama") m.embedded_tokenizer = spm_vocabulary(f, c.vocab_size);
    else if (tm == "gpt2") m.embedded_tokenizer = bpe_vocabulary(f, c.vocab_size);
    else f.fail("unsupported tokenizer.ggml.model '" + tm + "' (expected 'llama' or 'gpt2')");
    m.stop_tokens = m.embedded_tokenizer->end_of_generation();
    m.bos_token = m.embedded_tokenizer->bos_id();
  }
  m.storage_keepalive = f.image();
  return m;
}

}  // namespace

Model load_gguf(const std::string& path) { return parse(FileImage::map(path)); }

std::shared_ptr<const Tokenizer> load_gguf_vocabulary(const std::string& path) {
  GgufFile f(FileImage::map(path));
  if (!f.find("tokenizer.ggml.model")) f.fail("has no embedded vocabulary (tokenizer.ggml.model)");
  const std::string tm = f.str("tokenizer.ggml.model");
  const auto n = static_cast<int32_t>(f.string_array("tokenizer.ggml.tokens").size());
  if (tm == "llama") return spm_vocabulary(f, n);
  if (tm == "gpt2") return bpe_vocabulary(f, n);
  f.fail("unsupported tokenizer.ggml.model '" + tm + "' (expected 'llama' or 'gpt2')");
}
Model load_gguf_from_bytes(std::span<const uint8_t> bytes) { return parse(FileImage::copy(bytes)); }

GgufType parse_gguf_type(const std::string& name, const std::string& argument) {
  if (name == "f32") return GgufType::f32;
  if (name == "f16") return GgufType::f16;
  if (name == "bf16") return GgufType::bf16;
  if (name == "q8_0") return GgufType::q8_0;
  throw Error(argument, "one of f32, f16, bf16, q8_0", "'" + name + "'");
}

}  // namespace flashkv
