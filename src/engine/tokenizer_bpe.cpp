// GPT-2 byte-level BPE (tokenizer.ggml.model = "gpt2"): vocabulary checks, special-token partition, pre-tokenizer,
// byte alphabet, merges lowest rank first (leftmost on ties; a heap over adjacent pairs), decoding back to bytes.
#include <algorithm>
#include <queue>
#include <unordered_set>

#include "engine/tokenizer_bpe.hpp"
#include "flashkv/error.hpp"

namespace flashkv {
using engine_detail::PreTokenizerKind;

namespace {

/// GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100.. in order.
std::array<uint32_t, 256> byte_alphabet() {
  std::array<uint32_t, 256> cp{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    cp[b] = printable ? b : next++;
  }
  return cp;
}

std::string utf8_of(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

/// Bytes a token's text stands for: each code point of the byte alphabet back to its byte; any other code point
/// (not produced by byte-level BPE) is kept as its UTF-8.
std::string alphabet_to_bytes(const std::string& text, const std::unordered_map<uint32_t, uint8_t>& inv) {
  std::string out;
  for (std::size_t i = 0; i < text.size();) {
    const auto b0 = static_cast<unsigned char>(text[i]);
    std::size_t len = b0 < 0x80 ? 1 : (b0 >> 5) == 0x6 ? 2 : (b0 >> 4) == 0xE ? 3 : (b0 >> 3) == 0x1E ? 4 : 1;
    if (i + len > text.size()) len = 1;
    uint32_t cp = len == 1 ? b0 : (b0 & (0x7F >> len));
    for (std::size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
    auto it = inv.find(cp);
    if (it != inv.end()) out += static_cast<char>(it->second);
    else out.append(text, i, len);
    i += len;
  }
  return out;
}

[[noreturn]] void fail_at(const std::string& source, const std::string& what) {
  throw IoError("flashkv: " + source + ": " + what);
}

constexpr const char* kEndOfGenerationTexts[] = {"<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>",
                                                 "<|end|>", "<end_of_turn>"};

}  // namespace

Tokenizer Tokenizer::byte_level_bpe(BpeVocab v, const std::string& source) {
  const std::size_t n = v.tokens.size();
  if (n == 0) fail_at(source, "byte-level BPE vocabulary has no tokens");
  if (n > (std::size_t{1} << 22)) fail_at(source, "byte-level BPE vocabulary has " + std::to_string(n) + " tokens (limit 2^22)");
  if (!v.token_types.empty() && v.token_types.size() != n)
    fail_at(source, "tokenizer.ggml.token_type has " + std::to_string(v.token_types.size()) + " entries for " + std::to_string(n) +
         " tokens");
  auto bpe = std::make_shared<Bpe>();
  if (!engine_detail::parse_pre_tokenizer(v.pre, bpe->pre_kind))
    fail_at(source, "unsupported pre-tokenizer tokenizer.ggml.pre = '" + v.pre + "' (supported: gpt2, smollm)");
  bpe->pre = v.pre;
  bpe->chat_template = std::move(v.chat_template);
  for (auto [name, id] : {std::pair<const char*, int32_t>{"bos_token_id", v.bos_id}, {"eos_token_id", v.eos_id},
                          {"unknown_token_id", v.unk_id}, {"eot_token_id", v.eot_id}, {"padding_token_id", v.pad_id}})
    if (id < -1 || id >= static_cast<int32_t>(n))
      fail_at(source, std::string("tokenizer.ggml.") + name + " " + std::to_string(id) + " out of range [0, " + std::to_string(n) + ")");

  Tokenizer t;
  t.kind_ = TokenizerKind::gpt2_bpe;
  t.pieces_ = std::move(v.tokens);
  t.scores_.assign(n, 0.0f);
  t.bos_id_ = v.bos_id;
  t.eos_id_ = v.eos_id;
  t.unk_id_ = v.unk_id;
  t.add_bos_ = v.add_bos;
  bpe->types.resize(n, TokenType::normal);
  for (std::size_t i = 0; i < v.token_types.size(); ++i) {
    const int32_t ty = v.token_types[i];
    if (ty < 0 || ty > 6) fail_at(source, "token " + std::to_string(i) + " has token_type " + std::to_string(ty) + " (expected 0..6)");
    bpe->types[i] = static_cast<TokenType>(ty);
  }

  std::unordered_map<std::string, int32_t> index;
  index.reserve(n * 2);
  for (std::size_t i = 0; i < n; ++i) index.emplace(t.pieces_[i], static_cast<int32_t>(i));
  const auto alphabet = byte_alphabet();
  std::unordered_map<uint32_t, uint8_t> inverse;
  for (uint32_t b = 0; b < 256; ++b) {
    inverse.emplace(alphabet[b], static_cast<uint8_t>(b));
    // A vocabulary may lack the symbols of bytes its training text never had (SmolLM2: 21, e.g. 0x04 and 0xF5..0xFF):
    // such a byte is a symbol no merge touches and no token stands for, so it is dropped (as llama.cpp does).
    auto it = index.find(utf8_of(alphabet[b]));
    bpe->byte_token[b] = it == index.end() ? Bpe::kNoToken : it->second;
  }
  bpe->merges = std::move(v.merges);
  bpe->merge_of.reserve(bpe->merges.size() * 2);
  for (std::size_t r = 0; r < bpe->merges.size(); ++r) {
    const std::string& m = bpe->merges[r];
    const std::size_t sp = m.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 >= m.size() || m.find(' ', sp + 1) != std::string::npos)
      fail_at(source, "merge " + std::to_string(r) + " '" + m + "' is not 'left right' (two tokens separated by one space)");
    const std::string left = m.substr(0, sp), right = m.substr(sp + 1);
    auto l = index.find(left), rt = index.find(right), res = index.find(left + right);
    if (l == index.end() || rt == index.end() || res == index.end())
      fail_at(source, "merge " + std::to_string(r) + " '" + m + "' refers to a token that is not in the vocabulary");
    const uint64_t key = static_cast<uint64_t>(static_cast<uint32_t>(l->second)) << 32 | static_cast<uint32_t>(rt->second);
    bpe->merge_of.emplace(key, Bpe::Merge{static_cast<int32_t>(r), res->second});  // first (lowest) rank wins
  }

  bpe->decoded.resize(n);
  bpe->specials_by_first_byte.resize(256);
  std::unordered_set<std::string> eog_texts(std::begin(kEndOfGenerationTexts), std::end(kEndOfGenerationTexts));
  for (std::size_t i = 0; i < n; ++i) {
    const std::string& text = t.pieces_[i];
    const TokenType ty = bpe->types[i];
    const bool special = ty == TokenType::control || ty == TokenType::user_defined;
    bpe->decoded[i] = special ? text : alphabet_to_bytes(text, inverse);
    if (special && !text.empty())
      bpe->specials_by_first_byte[static_cast<unsigned char>(text[0])].push_back(static_cast<int32_t>(i));
    if (ty == TokenType::control && eog_texts.count(text)) t.eog_.push_back(static_cast<int32_t>(i));
  }
  for (auto& list : bpe->specials_by_first_byte)
    std::stable_sort(list.begin(), list.end(), [&](int32_t a, int32_t b) {
      return t.pieces_[static_cast<std::size_t>(a)].size() > t.pieces_[static_cast<std::size_t>(b)].size();
    });
  if (v.eos_id >= 0) t.eog_.push_back(v.eos_id);
  if (v.eot_id >= 0) t.eog_.push_back(v.eot_id);
  std::sort(t.eog_.begin(), t.eog_.end());
  t.eog_.erase(std::unique(t.eog_.begin(), t.eog_.end()), t.eog_.end());

  t.sorted_.resize(n);
  for (std::size_t i = 0; i < n; ++i) t.sorted_[i] = static_cast<int32_t>(i);
  std::stable_sort(t.sorted_.begin(), t.sorted_.end(), [&](int32_t a, int32_t b) {
    return t.pieces_[static_cast<std::size_t>(a)] < t.pieces_[static_cast<std::size_t>(b)];
  });
  t.bpe_ = std::move(bpe);
  return t;
}

void Tokenizer::Bpe::encode_piece(std::string_view bytes, std::vector<int32_t>& out) const {
  const std::size_t n = bytes.size();
  if (n == 0) return;
  std::vector<int32_t> id(n), next(n), prev(n);
  for (std::size_t i = 0; i < n; ++i) {
    id[i] = byte_token[static_cast<unsigned char>(bytes[i])];
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
    prev[i] = static_cast<int32_t>(i) - 1;
  }
  // Heap of candidate merges (rank, left position, left id, right id); stale entries are skipped when popped.
  struct Cand {
    int32_t rank, pos, left, right;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int32_t a) {
    if (a < 0 || next[static_cast<std::size_t>(a)] < 0) return;
    const int32_t b = next[static_cast<std::size_t>(a)];
    const uint64_t key = static_cast<uint64_t>(static_cast<uint32_t>(id[static_cast<std::size_t>(a)])) << 32 |
                         static_cast<uint32_t>(id[static_cast<std::size_t>(b)]);
    auto it = merge_of.find(key);
    if (it != merge_of.end()) heap.push({it->second.rank, a, id[static_cast<std::size_t>(a)], id[static_cast<std::size_t>(b)]});
  };
  for (std::size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    const auto a = static_cast<std::size_t>(c.pos);
    if (id[a] != c.left || next[a] < 0) continue;
    const auto b = static_cast<std::size_t>(next[a]);
    if (id[b] != c.right) continue;
    const uint64_t key = static_cast<uint64_t>(static_cast<uint32_t>(c.left)) << 32 | static_cast<uint32_t>(c.right);
    id[a] = merge_of.at(key).result;
    id[b] = -1;
    next[a] = next[b];
    if (next[b] >= 0) prev[static_cast<std::size_t>(next[b])] = c.pos;
    push(prev[a]);
    push(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = next[static_cast<std::size_t>(i)])
    if (id[static_cast<std::size_t>(i)] >= 0) out.push_back(id[static_cast<std::size_t>(i)]);  // drops kNoToken bytes
}

std::vector<int32_t> Tokenizer::Bpe::encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  auto raw = [&](std::size_t b, std::size_t e) {
    if (e <= b) return;
    const std::string_view frag = text.substr(b, e - b);
    for (auto [pb, pe] : engine_detail::pre_tokenize(pre_kind, frag)) encode_piece(frag.substr(pb, pe - pb), out);
  };
  std::size_t start = 0;
  if (parse_special) {
    for (std::size_t i = 0; i < text.size();) {
      int32_t hit = -1;
      for (int32_t s : specials_by_first_byte[static_cast<unsigned char>(text[i])]) {
        const std::string& d = decoded[static_cast<std::size_t>(s)];
        if (text.compare(i, d.size(), d) == 0) { hit = s; break; }
      }
      if (hit < 0) { ++i; continue; }
      raw(start, i);
      out.push_back(hit);
      i += decoded[static_cast<std::size_t>(hit)].size();
      start = i;
    }
  }
  raw(start, text.size());
  return out;
}

std::vector<std::string> Tokenizer::Bpe::pre_tokenize(std::string_view text) const {
  std::vector<std::string> out;
  for (auto [b, e] : engine_detail::pre_tokenize(pre_kind, text)) out.emplace_back(text.substr(b, e - b));
  return out;
}

}  // namespace flashkv
