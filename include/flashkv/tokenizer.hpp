// flashkv/tokenizer.hpp — the two tokenizers of Llama-family checkpoints and ChatML rendering.
//
//   llama2c_spm   llama2.c / SentencePiece-BPE: a dummy-prefix ' ', one piece per UTF-8 code point (byte fallback
//                 <0xXX>), then greedy merges of the adjacent pair whose concatenation is the highest-scoring piece
//                 (llama2.c run.c). Pieces store spaces as ' ' (GGUF files use U+2581).
//   gpt2_bpe      GPT-2 byte-level BPE (Radford et al., "Language Models are Unsupervised Multitask Learners", 2019,
//                 §2.2; Sennrich et al., "Neural Machine Translation of Rare Words with Subword Units", 2016) as GGUF
//                 stores it (tokenizer.ggml.model = "gpt2"): text → special-token partition → pre-tokenizer regex →
//                 bytes of each piece mapped to GPT-2's printable byte alphabet → merges applied lowest rank first
//                 (leftmost on ties) → token ids. Pre-tokenizers (tokenizer.ggml.pre):
//                   "gpt2"    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//                   "smollm"  first every \p{N} code point is isolated (one piece per digit), then the "gpt2" regex
//                             on the rest — llama.cpp's LLAMA_VOCAB_PRE_TYPE_SMOLLM and Hugging Face's
//                             Sequence[Digits(individual_digits=True), ByteLevel(use_regex=True)] for SmolLM/SmolLM2.
//                 \p{L}, \p{N}: Unicode general categories L*, N*; \s: White_Space (ICU, Unicode 15). Bytes that are
//                 not valid UTF-8 are single "other" characters (they match [^\s\p{L}\p{N}]), so every byte string
//                 round-trips (except bytes the vocabulary has no symbol for: Tokenizer::unrepresentable_bytes()).
//                 Control / user-defined tokens (token_type 3 / 4, e.g. <|im_start|>) are matched as
//                 whole tokens in the text when `parse_special` is set (longest first), never split by BPE.
//
// ERRORS: IoError for an inconsistent vocabulary (file name in the message), Error naming the argument otherwise.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace flashkv {

enum class TokenizerKind : int32_t { llama2c_spm = 0, gpt2_bpe = 1 };

/// GGUF tokenizer.ggml.token_type values.
enum class TokenType : int32_t { undefined = 0, normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };

/// Everything a byte-level BPE vocabulary needs (tokenizer.ggml.* of a "gpt2" GGUF).
struct BpeVocab {
  std::vector<std::string> tokens;       ///< token text in GPT-2's byte alphabet (e.g. "Ġthe"); specials as written
  std::vector<std::string> merges;       ///< "left right", rank = index (lower merges first)
  std::vector<int32_t> token_types;      ///< TokenType per token (empty = all normal)
  std::string pre = "gpt2";              ///< pre-tokenizer: "gpt2" | "smollm" (others throw IoError)
  int32_t bos_id = -1, eos_id = -1, unk_id = -1, eot_id = -1, pad_id = -1;  ///< −1 = none
  bool add_bos = false;                  ///< tokenizer.ggml.add_bos_token
  std::string chat_template;             ///< tokenizer.chat_template (Jinja text; "" = none)
};

class Tokenizer {
 public:
  /// SentencePiece (llama2.c): pieces[i] is the UTF-8 text of token i (spaces as ' '), scores[i] its merge score.
  Tokenizer(std::vector<std::string> pieces, std::vector<float> scores, int32_t bos_id = 1, int32_t eos_id = 2,
            int32_t unk_id = 0);
  /// Byte-level BPE. Throws IoError naming `source` when a merge is malformed ("left right" of two tokens whose
  /// concatenation is a token), an id is out of range, the vocabulary lacks one of the 256 byte symbols, or the
  /// pre-tokenizer is unknown.
  static Tokenizer byte_level_bpe(BpeVocab vocab, const std::string& source = "<memory>");
  /// llama2.c tokenizer file: int32 max_token_length, then vocab_size × (float32 score, int32 length, bytes).
  /// Throws IoError on a missing, truncated or inconsistent file (length < 0 or > max_token_length).
  static Tokenizer load_llama2c(const std::string& path, int32_t vocab_size);
  static Tokenizer from_llama2c_bytes(std::span<const uint8_t> bytes, int32_t vocab_size,
                                      const std::string& source = "<memory>");
  /// Writes the llama2.c tokenizer file format (SentencePiece tokenizers only; Error otherwise).
  void write_llama2c(const std::string& path) const;

  /// Encodes UTF-8 (or any byte) text. `bos` / `eos` prepend / append bos_id() / eos_id() (pass add_bos() for the
  /// file's own rule; Error when the vocabulary has no such token). `parse_special`: text equal to a control or
  /// user-defined token becomes that token (byte-level BPE only; SentencePiece has no such tokens here).
  /// SentencePiece: llama2.c's algorithm (see the file comment). Byte-level BPE: see the file comment.
  std::vector<int32_t> encode(std::string_view text, bool bos = true, bool eos = false, bool parse_special = false) const;
  /// Encodes a prompt the way the file says: BOS iff add_bos(), special tokens parsed (as llama.cpp and Hugging Face do
  /// for prompts and chat templates).
  std::vector<int32_t> encode_prompt(std::string_view text) const { return encode(text, add_bos(), false, true); }
  /// Bytes of `token` when it follows `prev_token`. SentencePiece: drops the leading space after BOS, turns <0xXX>
  /// into the raw byte. Byte-level BPE: the token's bytes (may be part of a UTF-8 character; control tokens give their
  /// text). Throws Error for an out-of-range token id.
  std::string decode_piece(int32_t prev_token, int32_t token) const;
  /// Concatenation of decode_piece over `tokens` (the first token's predecessor is BOS). For byte-level BPE
  /// decode(encode(s, false, false, p)) == s for every byte string s without unrepresentable_bytes() (with
  /// parse_special too; invalid UTF-8 included).
  std::string decode(std::span<const int32_t> tokens) const;

  TokenizerKind kind() const { return kind_; }
  int32_t vocab_size() const { return static_cast<int32_t>(pieces_.size()); }
  /// Token text as stored (SentencePiece: spaces as ' '; byte-level BPE: GPT-2 byte alphabet, e.g. "Ġthe").
  const std::string& piece(int32_t id) const { return pieces_.at(static_cast<std::size_t>(id)); }
  float score(int32_t id) const { return scores_.at(static_cast<std::size_t>(id)); }
  TokenType token_type(int32_t id) const;
  int32_t bos_id() const { return bos_id_; }  ///< −1 when the vocabulary has none
  int32_t eos_id() const { return eos_id_; }
  int32_t unk_id() const { return unk_id_; }
  /// Whether prompts start with BOS: llama2.c true; GGUF tokenizer.ggml.add_bos_token (SmolLM2: false).
  bool add_bos() const { return add_bos_; }
  /// Tokens that end a generated turn: SentencePiece {bos, eos} (llama2.c convention); byte-level BPE: eos, eot and
  /// every control token named <|endoftext|>, <|im_end|>, <|eot_id|>, <|eom_id|>, <|end|>, <end_of_turn> (llama.cpp's
  /// end-of-generation set). Sorted, unique.
  const std::vector<int32_t>& end_of_generation() const { return eog_; }
  /// Id of the token with exactly this text, or −1.
  int32_t lookup(std::string_view piece) const;
  /// Byte-level BPE: the pre-tokenizer name, merges (rank order) and chat template; empty for SentencePiece.
  const std::string& pre_tokenizer() const;
  std::vector<std::string> merges() const;
  const std::string& chat_template() const;
  /// Byte-level BPE: the bytes the vocabulary has no symbol for, ascending (SmolLM2: 21 of them — 0x04 0x06 0x13 0x14
  /// 0x16 0x1D 0xC0 0xC1 0xF1 0xF2 0xF5..0xFF). encode() drops them, as llama.cpp does (Hugging Face drops them too):
  /// the round trip is exact for every text without them. Empty for SentencePiece (byte fallback).
  std::vector<uint8_t> unrepresentable_bytes() const;
  /// The pre-tokenizer's pieces of `text` (byte-level BPE only; for tests and `flashkv tokenize --pieces`).
  std::vector<std::string> pre_tokenize(std::string_view text) const;

  struct Bpe;  // internal

 private:
  Tokenizer() = default;
  std::vector<int32_t> encode_spm(std::string_view text) const;

  TokenizerKind kind_ = TokenizerKind::llama2c_spm;
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<int32_t> sorted_;    // ids sorted by piece (for lookup)
  std::vector<int32_t> byte_ids_;  // SentencePiece: [256], −1 when the vocabulary has no <0xXX> piece for the byte
  int32_t bos_id_ = -1, eos_id_ = -1, unk_id_ = -1;
  bool add_bos_ = true;
  std::vector<int32_t> eog_;
  std::shared_ptr<const Bpe> bpe_;  // immutable after construction: copies share it
};

// ---------------------------------------------------------------------------------------------------------------------
// Chat templates
// ---------------------------------------------------------------------------------------------------------------------

struct ChatMessage {
  std::string role;     ///< "system" | "user" | "assistant"
  std::string content;
};

/// Renders `messages` in ChatML, the format of the GGUF's tokenizer.chat_template (SmolLM2, Qwen, ...):
///   [<|im_start|>system\nDEFAULT<|im_end|>\n  — only when the template has a default system prompt and
///    there is a first message that is not a system message]
///   for each message: <|im_start|>ROLE\nCONTENT<|im_end|>\n
///   [<|im_start|>assistant\n                 — when add_generation_prompt]
/// which equals the Jinja template's output (tested against jinja2 on the SmolLM2 template). The default system
/// prompt is the text the template writes between "<|im_start|>system\n" and "<|im_end|>" in a string literal.
/// Throws Error naming 'chat_template' when the template is empty or not ChatML (no <|im_start|> / <|im_end|>), and
/// 'messages' for an empty role.
std::string render_chat(const std::string& chat_template, std::span<const ChatMessage> messages,
                        bool add_generation_prompt = true);
/// The default system prompt of a ChatML template ("" when it has none).
std::string chat_default_system_prompt(const std::string& chat_template);

}  // namespace flashkv
