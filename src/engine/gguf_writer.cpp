// GGUF v3 writer (`flashkv convert --to gguf`): llama-architecture metadata, the vocabulary (SentencePiece "llama" or
// byte-level BPE "gpt2") and every tensor
// in F32 / F16 / BF16 / Q8_0 (Q8_0: per block of 32 values d = amax/127 stored as fp16, q = round(x/d)).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include "core/float16.hpp"
#include "engine/gguf_format.hpp"
#include "flashkv/engine.hpp"
#include "flashkv/error.hpp"

namespace flashkv {
using namespace engine_detail;

namespace {

class Buffer {
 public:
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
  void key(const std::string& k, GgufValueType t) {
    str(k);
    put<uint32_t>(static_cast<uint32_t>(t));
  }
  void pad(std::size_t align) {
    while (bytes.size() % align != 0) bytes.push_back(0);
  }
  std::vector<uint8_t> bytes;
};

struct PendingTensor {
  std::string name;
  std::vector<uint64_t> ne;
  const float* data;
  GgufType type;
};

std::vector<uint8_t> encode_tensor(const PendingTensor& t) {
  uint64_t n = 1;
  for (auto d : t.ne) n *= d;
  std::vector<uint8_t> out;
  switch (t.type) {
    case GgufType::f32:
      out.resize(n * 4);
      std::memcpy(out.data(), t.data, n * 4);
      break;
    case GgufType::f16:
    case GgufType::bf16:
      out.resize(n * 2);
      for (uint64_t i = 0; i < n; ++i) {
        uint16_t h = t.type == GgufType::f16 ? float_to_fp16(t.data[i]) : float_to_bf16(t.data[i]);
        std::memcpy(out.data() + 2 * i, &h, 2);
      }
      break;
    case GgufType::q8_0: {
      if (t.ne[0] % kQ8Block != 0)
        throw Error("type", "q8_0 only for tensors whose rows are a multiple of 32 (" + t.name + ")",
                    std::to_string(t.ne[0]));
      out.resize(n / kQ8Block * kQ8BlockBytes);
      for (uint64_t b = 0; b < n / kQ8Block; ++b) {
        const float* x = t.data + b * kQ8Block;
        float amax = 0.0f;
        for (int i = 0; i < kQ8Block; ++i) amax = std::max(amax, std::fabs(x[i]));
        const float d = amax / 127.0f;
        const float id = d > 0.0f ? 1.0f / d : 0.0f;
        uint8_t* blk = out.data() + b * kQ8BlockBytes;
        const uint16_t dh = float_to_fp16(d);
        std::memcpy(blk, &dh, 2);
        for (int i = 0; i < kQ8Block; ++i) {
          const float q = std::clamp(std::nearbyint(x[i] * id), -127.0f, 127.0f);
          blk[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(q));
        }
      }
      break;
    }
    default:
      throw Error("type", "f32, f16, bf16 or q8_0 (the types the writer produces)", gguf_type_name(static_cast<uint32_t>(t.type)));
  }
  return out;
}

}  // namespace

void write_gguf(const Model& model, const Tokenizer& tokenizer, const std::string& path, GgufType matrix_type) {
  const ModelConfig& c = model.config;
  c.validate("model");
  if (tokenizer.vocab_size() != c.vocab_size)
    throw Error("tokenizer", "vocab_size " + std::to_string(c.vocab_size) + " (the model's)",
                std::to_string(tokenizer.vocab_size()));
  const uint64_t D = c.dim, H = c.hidden_dim, V = c.vocab_size, KV = c.kv_dim(),
                 Q = static_cast<uint64_t>(c.num_heads) * c.head_dim;
  std::vector<PendingTensor> ts;
  // Q8_0 needs rows that are a multiple of 32 values; other matrices fall back to F16 (as llama.cpp's quantizer).
  auto mat = [&](std::string name, uint64_t in, uint64_t out, const float* p) {
    const GgufType t = matrix_type == GgufType::q8_0 && in % kQ8Block != 0 ? GgufType::f16 : matrix_type;
    ts.push_back({std::move(name), {in, out}, p, t});
  };
  auto vec = [&](std::string name, const float* p) { ts.push_back({std::move(name), {D}, p, GgufType::f32}); };
  mat("token_embd.weight", D, V, model.token_embedding);
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const auto& L = model.layers[static_cast<std::size_t>(l)];
    const std::string p = "blk." + std::to_string(l) + ".";
    vec(p + "attn_norm.weight", L.attn_norm);
    mat(p + "attn_q.weight", D, Q, L.wq);
    mat(p + "attn_k.weight", D, KV, L.wk);
    mat(p + "attn_v.weight", D, KV, L.wv);
    mat(p + "attn_output.weight", Q, D, L.wo);
    vec(p + "ffn_norm.weight", L.ffn_norm);
    mat(p + "ffn_gate.weight", D, H, L.w1);
    mat(p + "ffn_down.weight", H, D, L.w2);
    mat(p + "ffn_up.weight", D, H, L.w3);
  }
  vec("output_norm.weight", model.final_norm);
  if (!c.shared_classifier) mat("output.weight", D, V, model.classifier);

  Buffer meta;  // metadata entries, counted as written
  uint64_t n_kv = 0;
  auto key = [&](const std::string& k, GgufValueType t) { meta.key(k, t); ++n_kv; };
  auto kv_str = [&](const std::string& k, const std::string& v) { key(k, GgufValueType::string); meta.str(v); };
  auto kv_u32 = [&](const std::string& k, uint32_t v) { key(k, GgufValueType::u32); meta.put<uint32_t>(v); };
  auto kv_f32 = [&](const std::string& k, float v) { key(k, GgufValueType::f32); meta.put<float>(v); };
  auto kv_bool = [&](const std::string& k, bool v) { key(k, GgufValueType::boolean); meta.put<uint8_t>(v ? 1 : 0); };
  auto kv_strings = [&](const std::string& k, const std::vector<std::string>& v) {
    key(k, GgufValueType::array);
    meta.put<uint32_t>(static_cast<uint32_t>(GgufValueType::string));
    meta.put<uint64_t>(v.size());
    for (const auto& x : v) meta.str(x);
  };
  kv_str("general.architecture", "llama");
  kv_str("general.name", "flashkv-convert");
  kv_u32("general.alignment", static_cast<uint32_t>(kGgufDefaultAlignment));
  kv_u32("llama.context_length", static_cast<uint32_t>(c.seq_len));
  kv_u32("llama.embedding_length", static_cast<uint32_t>(c.dim));
  kv_u32("llama.block_count", static_cast<uint32_t>(c.n_layers));
  kv_u32("llama.feed_forward_length", static_cast<uint32_t>(c.hidden_dim));
  kv_u32("llama.attention.head_count", static_cast<uint32_t>(c.num_heads));
  kv_u32("llama.attention.head_count_kv", static_cast<uint32_t>(c.num_heads_kv));
  kv_u32("llama.rope.dimension_count", static_cast<uint32_t>(c.head_dim));
  kv_f32("llama.rope.freq_base", c.rope_theta);
  kv_f32("llama.attention.layer_norm_rms_epsilon", c.norm_eps);
  const int32_t nv = tokenizer.vocab_size();
  std::vector<std::string> toks(static_cast<std::size_t>(nv));
  const bool bpe = tokenizer.kind() == TokenizerKind::gpt2_bpe;
  for (int32_t i = 0; i < nv; ++i) {
    if (bpe) { toks[static_cast<std::size_t>(i)] = tokenizer.piece(i); continue; }
    std::string p;
    for (char ch : tokenizer.piece(i)) {
      if (ch == ' ') p += kSentencePieceSpace; else p += ch;
    }
    toks[static_cast<std::size_t>(i)] = std::move(p);
  }
  kv_str("tokenizer.ggml.model", bpe ? "gpt2" : "llama");
  if (bpe) kv_str("tokenizer.ggml.pre", tokenizer.pre_tokenizer());
  kv_strings("tokenizer.ggml.tokens", toks);
  if (bpe) {
    kv_strings("tokenizer.ggml.merges", tokenizer.merges());
  } else {
    key("tokenizer.ggml.scores", GgufValueType::array);
    meta.put<uint32_t>(static_cast<uint32_t>(GgufValueType::f32));
    meta.put<uint64_t>(static_cast<uint64_t>(nv));
    for (int32_t i = 0; i < nv; ++i) meta.put<float>(tokenizer.score(i));
  }
  key("tokenizer.ggml.token_type", GgufValueType::array);
  meta.put<uint32_t>(static_cast<uint32_t>(GgufValueType::i32));
  meta.put<uint64_t>(static_cast<uint64_t>(nv));
  for (int32_t i = 0; i < nv; ++i) meta.put<int32_t>(static_cast<int32_t>(tokenizer.token_type(i)));
  if (tokenizer.bos_id() >= 0) kv_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(tokenizer.bos_id()));
  if (tokenizer.eos_id() >= 0) kv_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(tokenizer.eos_id()));
  if (tokenizer.unk_id() >= 0) kv_u32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(tokenizer.unk_id()));
  if (bpe) {
    kv_bool("tokenizer.ggml.add_bos_token", tokenizer.add_bos());
    if (!tokenizer.chat_template().empty()) kv_str("tokenizer.chat_template", tokenizer.chat_template());
  }

  Buffer b;
  b.bytes.insert(b.bytes.end(), {'G', 'G', 'U', 'F'});
  b.put<uint32_t>(kGgufVersion);
  b.put<uint64_t>(ts.size());
  b.put<uint64_t>(n_kv);
  b.bytes.insert(b.bytes.end(), meta.bytes.begin(), meta.bytes.end());

  std::vector<std::vector<uint8_t>> payloads;
  uint64_t offset = 0;
  for (const auto& t : ts) {
    payloads.push_back(encode_tensor(t));
    b.str(t.name);
    b.put<uint32_t>(static_cast<uint32_t>(t.ne.size()));
    for (auto d : t.ne) b.put<uint64_t>(d);
    b.put<uint32_t>(static_cast<uint32_t>(t.type));
    b.put<uint64_t>(offset);
    offset += (payloads.back().size() + kGgufDefaultAlignment - 1) / kGgufDefaultAlignment * kGgufDefaultAlignment;
  }
  b.pad(kGgufDefaultAlignment);
  for (const auto& p : payloads) {
    b.bytes.insert(b.bytes.end(), p.begin(), p.end());
    b.pad(kGgufDefaultAlignment);
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw IoError("flashkv: cannot open '" + path + "' for writing");
  out.write(reinterpret_cast<const char*>(b.bytes.data()), static_cast<std::streamsize>(b.bytes.size()));
  out.flush();
  if (!out) throw IoError("flashkv: failed writing '" + path + "'");
}

}  // namespace flashkv
