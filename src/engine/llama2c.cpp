// llama2.c checkpoints: the legacy format (7 int32 header fields + float32 weights) and the versioned format
// (magic "ak42", version 1 = float32). Layouts follow llama2.c's run.c / export.py; see engine.hpp.
#include <cstdio>
#include <cstring>
#include <fstream>

#include "engine/byte_reader.hpp"
#include "engine/model_util.hpp"
#include "flashkv/engine.hpp"

namespace flashkv {
using engine_detail::ByteReader;
using engine_detail::FileImage;

namespace {

constexpr uint32_t kMagicV1 = 0x616b3432u;  // "ak42"
constexpr std::size_t kHeaderV1 = 256;

ModelConfig config_from_header(ByteReader& r, bool legacy) {
  int32_t h[7];
  for (int32_t& v : h) v = r.read<int32_t>("header field");
  ModelConfig c;
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.n_layers = h[2];
  c.num_heads = h[3];
  c.num_heads_kv = h[4];
  c.seq_len = h[6];
  if (legacy) {
    if (h[5] == INT32_MIN) r.fail("vocab_size out of range");
    c.shared_classifier = h[5] > 0;
    c.vocab_size = h[5] > 0 ? h[5] : -h[5];
  } else {
    c.vocab_size = h[5];
  }
  c.head_dim = c.num_heads > 0 ? c.dim / c.num_heads : 0;
  return c;
}

Model parse(std::shared_ptr<const FileImage> img) {
  ByteReader r(img->bytes(), img->source());
  Model m;
  m.path = img->source();
  bool legacy = true;
  if (r.size() >= 4) {
    uint32_t magic;
    std::memcpy(&magic, r.data_at(0), 4);
    if (magic == kMagicV1) {
      legacy = false;
      r.read<uint32_t>("magic");
      int32_t version = r.read<int32_t>("version");
      if (version != 1)
        r.fail("unsupported llama2.c checkpoint version " + std::to_string(version) + " (expected 1 = float32)");
    }
  }
  m.config = config_from_header(r, legacy);
  m.format = legacy ? CheckpointFormat::llama2c_legacy : CheckpointFormat::llama2c_v1;
  if (!legacy) {
    uint8_t shared = r.read<uint8_t>("shared_classifier flag");
    if (shared > 1) r.fail("shared_classifier flag must be 0 or 1, got " + std::to_string(shared));
    m.config.shared_classifier = shared == 1;
  }
  m.config.validate(img->source());
  const ModelConfig& c = m.config;
  const uint64_t D = c.dim, H = c.hidden_dim, L = c.n_layers, V = c.vocab_size, KV = c.kv_dim(),
                 Q = static_cast<uint64_t>(c.num_heads) * c.head_dim;
  const uint64_t layer_floats = 2 * D + Q * D + 2 * KV * D + D * Q + 3 * H * D;
  uint64_t floats = V * D + L * layer_floats + D + (c.shared_classifier ? 0 : V * D);
  const std::size_t header = legacy ? 28 : kHeaderV1;
  if (legacy) floats += static_cast<uint64_t>(c.seq_len) * c.head_dim;  // freq_cis_real + freq_cis_imag
  const uint64_t expected = header + 4 * floats;
  if (r.size() != expected)
    r.fail(std::string(r.size() < expected ? "truncated" : "oversized") + " llama2.c " +
           (legacy ? "legacy" : "v1") + " checkpoint: header (dim " + std::to_string(c.dim) + ", hidden_dim " +
           std::to_string(c.hidden_dim) + ", n_layers " + std::to_string(c.n_layers) + ", vocab_size " +
           std::to_string(c.vocab_size) + ") implies " + std::to_string(expected) + " bytes, file has " +
           std::to_string(r.size()));
  const float* base = reinterpret_cast<const float*>(r.data_at(header));
  std::size_t off = 0;
  auto take = [&](uint64_t n) {
    const float* p = base + off;
    off += n;
    return p;
  };
  m.layers.resize(static_cast<std::size_t>(L));
  if (legacy) {
    m.token_embedding = take(V * D);
    for (auto& l : m.layers) l.attn_norm = take(D);
    for (auto& l : m.layers) l.wq = take(Q * D);
    for (auto& l : m.layers) l.wk = take(KV * D);
    for (auto& l : m.layers) l.wv = take(KV * D);
    for (auto& l : m.layers) l.wo = take(D * Q);
    for (auto& l : m.layers) l.ffn_norm = take(D);
    for (auto& l : m.layers) l.w1 = take(H * D);
    for (auto& l : m.layers) l.w2 = take(D * H);
    for (auto& l : m.layers) l.w3 = take(H * D);
    m.final_norm = take(D);
    take(static_cast<uint64_t>(c.seq_len) * c.head_dim);  // freq_cis, recomputed from rope_theta instead
  } else {
    for (auto& l : m.layers) l.attn_norm = take(D);
    for (auto& l : m.layers) l.ffn_norm = take(D);
    m.final_norm = take(D);
    m.token_embedding = take(V * D);
    for (auto& l : m.layers) l.wq = take(Q * D);
    for (auto& l : m.layers) l.wk = take(KV * D);
    for (auto& l : m.layers) l.wv = take(KV * D);
    for (auto& l : m.layers) l.wo = take(D * Q);
    for (auto& l : m.layers) l.w1 = take(H * D);
    for (auto& l : m.layers) l.w2 = take(D * H);
    for (auto& l : m.layers) l.w3 = take(H * D);
  }
  m.classifier = c.shared_classifier ? m.token_embedding : take(V * D);
  m.storage_keepalive = std::move(img);
  return m;
}

}  // namespace

Model load_llama2c(const std::string& path) { return parse(FileImage::map(path)); }

Model load_llama2c_from_bytes(std::span<const uint8_t> bytes) { return parse(FileImage::copy(bytes)); }

void write_llama2c_v1(const Model& model, const std::string& path) {
  const ModelConfig& c = model.config;
  c.validate("model");
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw IoError("flashkv: cannot open '" + path + "' for writing");
  char header[kHeaderV1] = {};
  int32_t fields[9] = {static_cast<int32_t>(kMagicV1), 1, c.dim, c.hidden_dim, c.n_layers, c.num_heads,
                       c.num_heads_kv, c.vocab_size, c.seq_len};
  std::memcpy(header, fields, sizeof(fields));
  header[sizeof(fields)] = c.shared_classifier ? 1 : 0;
  out.write(header, kHeaderV1);
  const uint64_t D = c.dim, H = c.hidden_dim, V = c.vocab_size, KV = c.kv_dim(),
                 Q = static_cast<uint64_t>(c.num_heads) * c.head_dim;
  auto put = [&](const float* p, uint64_t n) {
    out.write(reinterpret_cast<const char*>(p), static_cast<std::streamsize>(n * sizeof(float)));
  };
  for (const auto& l : model.layers) put(l.attn_norm, D);
  for (const auto& l : model.layers) put(l.ffn_norm, D);
  put(model.final_norm, D);
  put(model.token_embedding, V * D);
  for (const auto& l : model.layers) put(l.wq, Q * D);
  for (const auto& l : model.layers) put(l.wk, KV * D);
  for (const auto& l : model.layers) put(l.wv, KV * D);
  for (const auto& l : model.layers) put(l.wo, D * Q);
  for (const auto& l : model.layers) put(l.w1, H * D);
  for (const auto& l : model.layers) put(l.w2, D * H);
  for (const auto& l : model.layers) put(l.w3, H * D);
  if (!c.shared_classifier) put(model.classifier, V * D);
  out.flush();
  if (!out) throw IoError("flashkv: failed writing '" + path + "'");
}

}  // namespace flashkv
