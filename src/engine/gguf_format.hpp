// Internal: GGUF v3 constants and the tensor naming of the llama architecture (as written by llama.cpp).
// File layout: "GGUF" u32 version u64 n_tensors u64 n_kv; n_kv × (string key, u32 type, value);
// n_tensors × (string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset); pad to general.alignment;
// tensor data (offsets relative to the data start, each aligned). Strings are u64 length + bytes (no NUL).
// ne[0] is the fastest-varying dimension: a row-major [out, in] matrix has ne = {in, out}.
#pragma once

#include <cstdint>
#include <string>

namespace flashkv::engine_detail {

enum class GgufValueType : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8, array = 9, u64 = 10,
  i64 = 11, f64 = 12,
};

constexpr uint32_t kGgufVersion = 3;
constexpr uint64_t kGgufDefaultAlignment = 32;
constexpr int kQ8Block = 32;             // values per Q8_0 block
constexpr int kQ8BlockBytes = 2 + 32;    // fp16 scale + 32 int8

inline const char* kSentencePieceSpace = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

/// SentencePiece token types (tokenizer.ggml.token_type).
enum GgufTokenType : int32_t { kTokNormal = 1, kTokUnknown = 2, kTokControl = 3, kTokByte = 6 };

}  // namespace flashkv::engine_detail
