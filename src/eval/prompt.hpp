// What the evaluation needs from a tokenizer beyond encode/decode: whether prompts start with BOS, how a chat turn is
// rendered, which tokens end a generated answer. One place, so that every eval tool treats a model the same way.
#pragma once

#include <string>
#include <vector>

#include "flashkv/engine.hpp"

namespace flashkv::eval {

/// Whether this tokenizer's prompts start with BOS (llama2.c: yes; SmolLM2: no).
bool tokenizer_adds_bos(const Tokenizer& tok);

/// Tokens of a one-turn chat prompt: `user` as the user message and `answer_prefix` as the start of the assistant's
/// reply. Models without a chat template (llama2.c) get BOS + user + "\n" + answer_prefix as plain text.
std::vector<int32_t> chat_prompt_tokens(const LoadedModel& lm, const std::string& user, const std::string& answer_prefix);

/// Whether the model renders prompts in a chat template (ChatML GGUFs).
bool has_chat_template(const LoadedModel& lm);

/// Tokens at which a generated answer ends (Model::stop_tokens: llama2.c BOS and EOS; SmolLM2 <|im_end|>, <|endoftext|>).
std::vector<int32_t> stop_tokens(const LoadedModel& lm);

}  // namespace flashkv::eval
