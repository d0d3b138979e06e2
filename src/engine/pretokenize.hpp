// Internal: the pre-tokenizers of byte-level BPE vocabularies (see flashkv/tokenizer.hpp for the regexes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace flashkv::engine_detail {

enum class PreTokenizerKind : int32_t { gpt2 = 0, smollm = 1 };

/// Parses tokenizer.ggml.pre; returns false for a name this engine does not implement.
bool parse_pre_tokenizer(std::string_view name, PreTokenizerKind& out);

/// Splits `text` (any bytes; invalid UTF-8 bytes are single "other" characters) into pre-token pieces, returned as
/// [begin, end) byte ranges covering the text in order.
std::vector<std::pair<std::size_t, std::size_t>> pre_tokenize(PreTokenizerKind kind, std::string_view text);

}  // namespace flashkv::engine_detail
