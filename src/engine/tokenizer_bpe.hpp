// Internal: the byte-level BPE state shared (immutably) by copies of a Tokenizer.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/pretokenize.hpp"
#include "flashkv/tokenizer.hpp"

namespace flashkv {

struct Tokenizer::Bpe {
  std::string pre;                      // tokenizer.ggml.pre as given
  engine_detail::PreTokenizerKind pre_kind = engine_detail::PreTokenizerKind::gpt2;
  std::vector<std::string> merges;      // as given (rank order), for the writer
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  std::unordered_map<uint64_t, Merge> merge_of;  // (left id << 32 | right id) → rank, merged id
  static constexpr int32_t kNoToken = -2;        // byte_token of a byte the vocabulary has no symbol for
  std::array<int32_t, 256> byte_token{};         // id of the one-symbol token of each byte, or kNoToken
  std::vector<TokenType> types;                  // per token
  std::vector<std::string> decoded;              // per token: its bytes (control / user-defined: the text itself)
  std::vector<std::vector<int32_t>> specials_by_first_byte;  // [256] ids, longest text first
  std::string chat_template;

  std::vector<int32_t> encode(std::string_view text, bool parse_special) const;
  std::vector<std::string> pre_tokenize(std::string_view text) const;
  /// BPE of one pre-token piece (its raw bytes), appended to `out`.
  void encode_piece(std::string_view bytes, std::vector<int32_t>& out) const;
};

}  // namespace flashkv
