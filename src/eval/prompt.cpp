#include "eval/prompt.hpp"

namespace flashkv::eval {

bool tokenizer_adds_bos(const Tokenizer& tok) { return tok.add_bos(); }

bool has_chat_template(const LoadedModel& lm) { return !lm.tokenizer->chat_template().empty(); }

std::vector<int32_t> chat_prompt_tokens(const LoadedModel& lm, const std::string& user, const std::string& answer_prefix) {
  const Tokenizer& tok = *lm.tokenizer;
  if (!has_chat_template(lm)) return tok.encode(user + "\n" + answer_prefix, tok.add_bos(), false);
  const ChatMessage msg{"user", user};
  return tok.encode_prompt(render_chat(tok.chat_template(), std::span<const ChatMessage>(&msg, 1), true) + answer_prefix);
}

std::vector<int32_t> stop_tokens(const LoadedModel& lm) { return lm.model.stop_tokens; }

}  // namespace flashkv::eval
