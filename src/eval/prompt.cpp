#include "eval/prompt.hpp"

namespace flashkv::eval {

bool tokenizer_adds_bos(const Tokenizer&) { return true; }

std::vector<int32_t> chat_prompt_tokens(const LoadedModel& lm, const std::string& user, const std::string& answer_prefix) {
  return lm.tokenizer->encode(user + "\n" + answer_prefix, true, false);
}

bool has_chat_template(const LoadedModel&) { return false; }

std::vector<int32_t> stop_tokens(const LoadedModel& lm) { return {lm.tokenizer->bos_id(), lm.tokenizer->eos_id()}; }

}  // namespace flashkv::eval
