// flashkv tokenize: text → token ids with a model's tokenizer (like llama.cpp's llama-tokenize). Reads no weights for
// GGUF models. --lines FILE tokenizes one JSON string per line (batch comparisons against other tokenizers).
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "cli/util_model_cli.hpp"
#include "flashkv/engine.hpp"
#include "flashkv/error.hpp"

namespace {

struct TokenizeArgs {
  std::string model, tokenizer, text, file, lines;
  bool json = false, no_special = false, bos = false, no_bos = false, pre = false, text_given = false;
};

nlohmann::json result(const flashkv::Tokenizer& tok, const std::string& text, const TokenizeArgs& a) {
  const bool bos = a.bos || (!a.no_bos && tok.add_bos());
  const std::vector<int32_t> ids = tok.encode(text, bos, false, !a.no_special);
  std::vector<int32_t> body(ids.begin() + (bos ? 1 : 0), ids.end());
  nlohmann::json j = {{"tokens", ids}, {"count", ids.size()}, {"roundtrip", tok.decode(body) == text}};
  if (a.pre) j["pre_tokens"] = tok.pre_tokenize(text);
  return j;
}

void run(const TokenizeArgs& a) {
  using namespace flashkv;
  const int sources = (a.text_given ? 1 : 0) + (a.file.empty() ? 0 : 1) + (a.lines.empty() ? 0 : 1);
  if (sources != 1) throw Error("text", "exactly one of --text, --file, --lines", std::to_string(sources) + " given");
  if (a.bos && a.no_bos) throw Error("bos", "either --bos or --no-bos", "both");
  const auto tok = load_named_tokenizer(a.model, a.tokenizer);
  const auto dump = [](const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); };
  if (!a.lines.empty()) {
    std::ifstream f(a.lines);
    if (!f) throw IoError("flashkv: cannot read --lines '" + a.lines + "'");
    std::string line;
    for (int n = 1; std::getline(f, line); ++n) {
      nlohmann::json in;
      try {
        in = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception&) {
        throw Error("lines", "one JSON string per line", "line " + std::to_string(n) + " is not JSON");
      }
      if (!in.is_string()) throw Error("lines", "one JSON string per line", "line " + std::to_string(n) + " is " + in.type_name());
      std::printf("%s\n", dump(result(*tok, in.get<std::string>(), a)).c_str());
    }
    return;
  }
  std::string text = a.text;
  if (!a.file.empty()) {
    std::ifstream f(a.file, std::ios::binary);
    if (!f) throw IoError("flashkv: cannot read --file '" + a.file + "'");
    text.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  const nlohmann::json j = result(*tok, text, a);
  if (a.json) {
    std::printf("%s\n", dump(j).c_str());
    return;
  }
  std::string out;
  for (const auto& id : j["tokens"]) out += (out.empty() ? "" : " ") + std::to_string(id.get<int32_t>());
  std::printf("%s\n", out.c_str());
}

void register_tokenize(CLI::App& root) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* sub = root.add_subcommand("tokenize", "text -> token ids with a model's tokenizer (no weights loaded for GGUF)");
  flashkv::cli::add_model_options(sub, args->model, args->tokenizer, "smollm2-135m");
  sub->add_option("--text", args->text, "text to tokenize")->each([args](const std::string&) { args->text_given = true; });
  sub->add_option("--file", args->file, "tokenize the bytes of this file");
  sub->add_option("--lines", args->lines, "tokenize each line of this file, one JSON string per line; prints JSON lines");
  sub->add_flag("--bos", args->bos, "prepend BOS (default: as the tokenizer says; SmolLM2: no)");
  sub->add_flag("--no-bos", args->no_bos, "never prepend BOS");
  sub->add_flag("--no-special", args->no_special, "treat <|im_start|> etc. in the text as plain text");
  sub->add_flag("--pre-tokens", args->pre, "also print the pre-tokenizer's pieces (byte-level BPE)");
  sub->add_flag("--json", args->json, "print {tokens, count, roundtrip} as JSON");
  sub->callback([args] { run(*args); });
}

}  // namespace

FLASHKV_CLI_COMMAND("tokenize", register_tokenize);
