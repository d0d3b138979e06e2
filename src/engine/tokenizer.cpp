// Tokenizer: the shared parts (lookup, decode, accessors) and the llama2.c / SentencePiece-BPE algorithm: encode by
// greedy highest-score merges with byte fallback, decode with the BOS leading-space rule and <0xXX> byte pieces
// (llama2.c run.c semantics). The byte-level BPE lives in tokenizer_bpe.cpp.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "engine/byte_reader.hpp"
#include "engine/tokenizer_bpe.hpp"
#include "flashkv/error.hpp"
#include "flashkv/tokenizer.hpp"

namespace flashkv {
using engine_detail::ByteReader;
using engine_detail::FileImage;

namespace {
int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}
/// Byte value of a "<0xXX>" piece, or −1.
int byte_piece_value(const std::string& p) {
  if (p.size() != 6 || p[0] != '<' || p[1] != '0' || p[2] != 'x' || p[5] != '>') return -1;
  int hi = hex_digit(p[3]), lo = hex_digit(p[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}
const std::string kEmpty;
}  // namespace

Tokenizer::Tokenizer(std::vector<std::string> pieces, std::vector<float> scores, int32_t bos_id, int32_t eos_id,
                     int32_t unk_id)
    : kind_(TokenizerKind::llama2c_spm), pieces_(std::move(pieces)), scores_(std::move(scores)), bos_id_(bos_id),
      eos_id_(eos_id), unk_id_(unk_id), add_bos_(true) {
  const auto n = static_cast<int32_t>(pieces_.size());
  if (n == 0) throw Error("pieces", "a non-empty vocabulary", "0 pieces");
  if (scores_.size() != pieces_.size())
    throw Error("scores", std::to_string(n) + " scores (one per piece)", std::to_string(scores_.size()));
  for (auto [name, id] : {std::pair<const char*, int32_t>{"bos_id", bos_id}, {"eos_id", eos_id}, {"unk_id", unk_id}})
    if (id < 0 || id >= n) throw Error(name, "an id in [0, " + std::to_string(n) + ")", std::to_string(id));
  sorted_.resize(pieces_.size());
  for (int32_t i = 0; i < n; ++i) sorted_[static_cast<std::size_t>(i)] = i;
  std::stable_sort(sorted_.begin(), sorted_.end(),
                   [&](int32_t a, int32_t b) { return pieces_[static_cast<std::size_t>(a)] < pieces_[static_cast<std::size_t>(b)]; });
  byte_ids_.assign(256, -1);
  for (int32_t i = n - 1; i >= 0; --i) {
    int b = byte_piece_value(pieces_[static_cast<std::size_t>(i)]);
    if (b >= 0) byte_ids_[static_cast<std::size_t>(b)] = i;
  }
  eog_ = {bos_id_, eos_id_};
  std::sort(eog_.begin(), eog_.end());
  eog_.erase(std::unique(eog_.begin(), eog_.end()), eog_.end());
}

int32_t Tokenizer::lookup(std::string_view piece) const {
  auto it = std::lower_bound(sorted_.begin(), sorted_.end(), piece, [&](int32_t id, std::string_view p) {
    return std::string_view(pieces_[static_cast<std::size_t>(id)]) < p;
  });
  if (it != sorted_.end() && pieces_[static_cast<std::size_t>(*it)] == piece) return *it;
  return -1;
}

TokenType Tokenizer::token_type(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    throw Error("token", "an id in [0, " + std::to_string(vocab_size()) + ")", std::to_string(id));
  if (bpe_) return bpe_->types[static_cast<std::size_t>(id)];
  if (id == unk_id_) return TokenType::unknown;
  if (id == bos_id_ || id == eos_id_) return TokenType::control;
  if (byte_piece_value(pieces_[static_cast<std::size_t>(id)]) >= 0) return TokenType::byte;
  return TokenType::normal;
}

const std::string& Tokenizer::pre_tokenizer() const { return bpe_ ? bpe_->pre : kEmpty; }
const std::string& Tokenizer::chat_template() const { return bpe_ ? bpe_->chat_template : kEmpty; }
std::vector<std::string> Tokenizer::merges() const { return bpe_ ? bpe_->merges : std::vector<std::string>{}; }

Tokenizer Tokenizer::from_llama2c_bytes(std::span<const uint8_t> bytes, int32_t vocab_size, const std::string& source) {
  if (vocab_size <= 0 || vocab_size > (1 << 22))
    throw Error("vocab_size", "a value in [1, 4194304]", std::to_string(vocab_size));
  ByteReader r(bytes, source);
  int32_t max_len = r.read<int32_t>("max_token_length");
  if (max_len <= 0 || max_len > (1 << 16)) r.fail("max_token_length must be in [1, 65536], got " + std::to_string(max_len));
  std::vector<std::string> pieces;
  std::vector<float> scores;
  pieces.reserve(static_cast<std::size_t>(vocab_size));
  scores.reserve(static_cast<std::size_t>(vocab_size));
  for (int32_t i = 0; i < vocab_size; ++i) {
    float score = r.read<float>("piece score");
    int32_t len = r.read<int32_t>("piece length");
    if (len < 0 || len > max_len)
      r.fail("piece " + std::to_string(i) + " has length " + std::to_string(len) + ", expected 0.." +
             std::to_string(max_len) + " (max_token_length)");
    auto s = r.take(static_cast<std::size_t>(len), "piece bytes");
    pieces.emplace_back(reinterpret_cast<const char*>(s.data()), s.size());
    scores.push_back(score);
  }
  if (r.remaining() != 0)
    r.fail("tokenizer has " + std::to_string(r.remaining()) + " trailing bytes after " + std::to_string(vocab_size) +
           " pieces (vocabulary size mismatch with the model?)");
  int32_t n = vocab_size;
  return Tokenizer(std::move(pieces), std::move(scores), std::min(1, n - 1), std::min(2, n - 1), 0);
}

Tokenizer Tokenizer::load_llama2c(const std::string& path, int32_t vocab_size) {
  auto img = FileImage::map(path);
  return from_llama2c_bytes(img->bytes(), vocab_size, path);
}

void Tokenizer::write_llama2c(const std::string& path) const {
  if (kind_ != TokenizerKind::llama2c_spm)
    throw Error("tokenizer", "a SentencePiece (llama2.c) vocabulary for the llama2.c tokenizer format",
                "a byte-level BPE vocabulary");
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw IoError("flashkv: cannot open '" + path + "' for writing");
  int32_t max_len = 1;
  for (const auto& p : pieces_) max_len = std::max<int32_t>(max_len, static_cast<int32_t>(p.size()));
  out.write(reinterpret_cast<const char*>(&max_len), 4);
  for (std::size_t i = 0; i < pieces_.size(); ++i) {
    int32_t len = static_cast<int32_t>(pieces_[i].size());
    out.write(reinterpret_cast<const char*>(&scores_[i]), 4);
    out.write(reinterpret_cast<const char*>(&len), 4);
    out.write(pieces_[i].data(), len);
  }
  if (!out) throw IoError("flashkv: failed writing '" + path + "'");
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool bos, bool eos, bool parse_special) const {
  std::vector<int32_t> tokens;
  if (bos) {
    if (bos_id_ < 0) throw Error("bos", "a vocabulary with a BOS token", "none (tokenizer.ggml.bos_token_id absent)");
    tokens.push_back(bos_id_);
  }
  std::vector<int32_t> body = bpe_ ? bpe_->encode(text, parse_special) : encode_spm(text);
  tokens.insert(tokens.end(), body.begin(), body.end());
  if (eos) {
    if (eos_id_ < 0) throw Error("eos", "a vocabulary with an EOS token", "none (tokenizer.ggml.eos_token_id absent)");
    tokens.push_back(eos_id_);
  }
  return tokens;
}

std::vector<int32_t> Tokenizer::encode_spm(std::string_view text) const {
  std::vector<int32_t> body;
  if (!text.empty()) {
    int32_t prefix = lookup(" ");
    if (prefix >= 0) body.push_back(prefix);
  }
  // One token per UTF-8 code point, byte fallback otherwise.
  std::size_t i = 0;
  while (i < text.size()) {
    std::size_t len = 1;
    auto c = static_cast<unsigned char>(text[i]);
    if ((c & 0xE0) == 0xC0) len = 2;
    else if ((c & 0xF0) == 0xE0) len = 3;
    else if ((c & 0xF8) == 0xF0) len = 4;
    // Accept the code point only if the continuation bytes are well-formed.
    if (i + len > text.size()) len = 1;
    for (std::size_t j = 1; j < len; ++j)
      if ((static_cast<unsigned char>(text[i + j]) & 0xC0) != 0x80) { len = 1; break; }
    int32_t id = lookup(text.substr(i, len));
    if (id >= 0) {
      body.push_back(id);
    } else {
      for (std::size_t j = 0; j < len; ++j) {
        int32_t b = byte_ids_[static_cast<unsigned char>(text[i + j])];
        body.push_back(b >= 0 ? b : unk_id_);
      }
    }
    i += len;
  }
  // Greedy BPE: merge the adjacent pair whose concatenation is the highest-scoring piece (leftmost on ties).
  std::string buf;
  while (body.size() >= 2) {
    float best_score = 0.0f;
    int32_t best_id = -1;
    std::size_t best_idx = 0;
    for (std::size_t k = 0; k + 1 < body.size(); ++k) {
      buf = pieces_[static_cast<std::size_t>(body[k])];
      buf += pieces_[static_cast<std::size_t>(body[k + 1])];
      int32_t id = lookup(buf);
      if (id >= 0 && (best_id < 0 || scores_[static_cast<std::size_t>(id)] > best_score)) {
        best_score = scores_[static_cast<std::size_t>(id)];
        best_id = id;
        best_idx = k;
      }
    }
    if (best_id < 0) break;
    body[best_idx] = best_id;
    body.erase(body.begin() + static_cast<std::ptrdiff_t>(best_idx) + 1);
  }
  return body;
}

std::string Tokenizer::decode_piece(int32_t prev_token, int32_t token) const {
  if (token < 0 || token >= vocab_size())
    throw Error("token", "an id in [0, " + std::to_string(vocab_size()) + ")", std::to_string(token));
  if (bpe_) return bpe_->decoded[static_cast<std::size_t>(token)];
  const std::string& p = pieces_[static_cast<std::size_t>(token)];
  int b = byte_piece_value(p);
  if (b >= 0) return std::string(1, static_cast<char>(b));
  if (prev_token == bos_id_ && !p.empty() && p[0] == ' ') return p.substr(1);
  return p;
}

std::string Tokenizer::decode(std::span<const int32_t> tokens) const {
  std::string out;
  int32_t prev = bos_id_;
  for (int32_t t : tokens) {
    out += decode_piece(prev, t);
    prev = t;
  }
  return out;
}

std::vector<uint8_t> Tokenizer::unrepresentable_bytes() const {
  std::vector<uint8_t> out;
  if (bpe_)
    for (int b = 0; b < 256; ++b)
      if (bpe_->byte_token[static_cast<std::size_t>(b)] == Bpe::kNoToken) out.push_back(static_cast<uint8_t>(b));
  return out;
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  if (!bpe_) throw Error("tokenizer", "a byte-level BPE vocabulary (pre_tokenize)", "a SentencePiece vocabulary");
  return bpe_->pre_tokenize(text);
}

}  // namespace flashkv
