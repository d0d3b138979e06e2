// ChatML rendering (<|im_start|>ROLE\nCONTENT<|im_end|>\n ...) for GGUF chat templates of the ChatML family. The Jinja
// template itself is not interpreted: it is recognized by its markers, and its default system prompt (a string literal
// "<|im_start|>system\n...<|im_end|>") is extracted. tests/engine/test_smollm2.py checks the output against jinja2.
#include <string>

#include "flashkv/error.hpp"
#include "flashkv/tokenizer.hpp"

namespace flashkv {

namespace {
constexpr std::string_view kStart = "<|im_start|>";
constexpr std::string_view kEnd = "<|im_end|>";

void require_chatml(const std::string& tpl) {
  if (tpl.empty())
    throw Error("chat_template", "a ChatML chat template (tokenizer.chat_template)", "none in this model");
  if (tpl.find(kStart) == std::string::npos || tpl.find(kEnd) == std::string::npos)
    throw Error("chat_template", "a ChatML template (<|im_start|>ROLE ... <|im_end|>)",
                "a template without those markers (only ChatML is supported)");
}
}  // namespace

std::string chat_default_system_prompt(const std::string& chat_template) {
  const std::string head = std::string(kStart) + "system\n";
  const std::size_t at = chat_template.find(head);
  if (at == std::string::npos) return "";
  const std::size_t b = at + head.size();
  const std::size_t e = chat_template.find(kEnd, b);
  if (e == std::string::npos) return "";
  const std::string text = chat_template.substr(b, e - b);
  // Must be one string literal (no quote or Jinja expression inside).
  if (text.find_first_of("'\"{}") != std::string::npos) return "";
  return text;
}

std::string render_chat(const std::string& chat_template, std::span<const ChatMessage> messages,
                        bool add_generation_prompt) {
  require_chatml(chat_template);
  std::string out;
  const std::string sys = chat_default_system_prompt(chat_template);
  if (!sys.empty() && !messages.empty() && messages.front().role != "system")
    out += std::string(kStart) + "system\n" + sys + std::string(kEnd) + "\n";
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role.empty())
      throw Error("messages[" + std::to_string(i) + "].role", "a role (system, user, assistant)", "an empty string");
    out += std::string(kStart) + messages[i].role + "\n" + messages[i].content + std::string(kEnd) + "\n";
  }
  if (add_generation_prompt) out += std::string(kStart) + "assistant\n";
  return out;
}

}  // namespace flashkv
