// Model-level helpers: configuration validation, format detection, names.
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

#include "engine/model_util.hpp"
#include "flashkv/engine.hpp"
#include "flashkv/error.hpp"

namespace flashkv {

void ModelConfig::validate(const std::string& source) const {
  using namespace engine_detail;
  auto bad = [&](const std::string& what) { throw IoError("flashkv: " + source + ": " + what); };
  auto range = [&](const char* name, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi)
      bad(std::string(name) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
          std::to_string(v));
  };
  range("dim", dim, 2, kMaxDim);
  range("hidden_dim", hidden_dim, 1, kMaxHidden);
  range("n_layers", n_layers, 1, kMaxLayers);
  range("n_heads", num_heads, 1, kMaxHeads);
  range("n_kv_heads", num_heads_kv, 1, kMaxHeads);
  range("vocab_size", vocab_size, 1, kMaxVocab);
  range("seq_len", seq_len, 1, kMaxSeqLen);
  if (dim % num_heads != 0)
    bad("dim " + std::to_string(dim) + " is not divisible by n_heads " + std::to_string(num_heads));
  if (num_heads % num_heads_kv != 0)
    bad("n_heads " + std::to_string(num_heads) + " is not a multiple of n_kv_heads " + std::to_string(num_heads_kv));
  if (head_dim != dim / num_heads)
    bad("head_dim must be dim / n_heads = " + std::to_string(dim / num_heads) + ", got " + std::to_string(head_dim));
  if (head_dim % 2 != 0) bad("head_dim must be even for rotary embeddings, got " + std::to_string(head_dim));
  if (!(rope_theta > 0.0f) || rope_theta > 1e12f) bad("rope_theta must be in (0, 1e12], got " + std::to_string(rope_theta));
  if (!(norm_eps > 0.0f) || norm_eps > 1.0f) bad("norm_eps must be in (0, 1], got " + std::to_string(norm_eps));
}

const char* checkpoint_format_name(CheckpointFormat f) {
  switch (f) {
    case CheckpointFormat::llama2c_legacy: return "llama2c-legacy";
    case CheckpointFormat::llama2c_v1: return "llama2c-v1";
    case CheckpointFormat::gguf: return "gguf";
  }
  return "?";
}

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::steps: return "steps";
    case StopReason::bos: return "bos";
    case StopReason::eos: return "eos";
    case StopReason::context: return "context";
  }
  return "?";
}

std::size_t Model::weight_bytes() const {
  const auto& c = config;
  const std::size_t D = c.dim, H = c.hidden_dim, V = c.vocab_size, KV = c.kv_dim(),
                    Q = static_cast<std::size_t>(c.num_heads) * c.head_dim;
  std::size_t n = V * D + D + layers.size() * (2 * D + Q * D + 2 * KV * D + D * Q + 3 * H * D);
  if (!c.shared_classifier) n += V * D;
  return n * sizeof(float);
}

Model load_model(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError("flashkv: cannot open model '" + path + "': " + std::strerror(errno));
  char magic[4] = {};
  ssize_t n = ::read(fd, magic, 4);
  ::close(fd);
  if (n == 4 && std::memcmp(magic, "GGUF", 4) == 0) return load_gguf(path);
  return load_llama2c(path);
}

}  // namespace flashkv

namespace flashkv {

LoadedModel load_model_with_tokenizer(const std::string& model_path, const std::string& tokenizer_path) {
  LoadedModel lm;
  lm.model = load_model(model_path);
  const int32_t vocab = lm.model.config.vocab_size;
  if (!tokenizer_path.empty()) {
    lm.tokenizer = std::make_shared<const Tokenizer>(Tokenizer::load_llama2c(tokenizer_path, vocab));
  } else if (lm.model.embedded_tokenizer) {
    lm.tokenizer = lm.model.embedded_tokenizer;
  } else {
    throw IoError("flashkv: '" + model_path + "' has no embedded vocabulary: pass --tokenizer PATH (llama2.c tokenizer file)");
  }
  if (lm.tokenizer->vocab_size() != vocab)
    throw IoError("flashkv: tokenizer has " + std::to_string(lm.tokenizer->vocab_size()) + " pieces, model vocab_size is " +
                  std::to_string(vocab));
  return lm;
}

std::shared_ptr<const Tokenizer> load_named_tokenizer(const std::string& name_or_path, const std::string& tokenizer_path) {
  const ResolvedModel r = resolve_model(name_or_path, tokenizer_path);
  if (r.tokenizer_path.empty()) return load_gguf_vocabulary(r.model_path);
  // A llama2.c tokenizer file does not store its size: take it from the model's header.
  const int32_t vocab = load_model(r.model_path).config.vocab_size;
  return std::make_shared<const Tokenizer>(Tokenizer::load_llama2c(r.tokenizer_path, vocab));
}

LoadedModel load_named_model(const std::string& name_or_path, const std::string& tokenizer_path) {
  const ResolvedModel r = resolve_model(name_or_path, tokenizer_path);
  LoadedModel lm = load_model_with_tokenizer(r.model_path, r.tokenizer_path);
  lm.alias = r.alias;
  return lm;
}

}  // namespace flashkv
