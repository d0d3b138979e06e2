// flashkv convert: llama2.c checkpoint (+ tokenizer) → GGUF v3 (F32/F16/BF16/Q8_0) or llama2.c v1.
#include <cstdio>

#include "cli/command.hpp"
#include "cli/util_output.hpp"
#include "flashkv/engine.hpp"
#include "flashkv/error.hpp"

namespace {

struct ConvertArgs {
  std::string model, tokenizer, output, to = "gguf", type = "f32";
};

void run(const ConvertArgs& a) {
  using namespace flashkv;
  if (a.to != "gguf" && a.to != "llama2c")
    throw Error("to", "'gguf' or 'llama2c' (version 1, float32)", "'" + a.to + "'");
  const GgufType type = parse_gguf_type(a.type, "type");
  flashkv::cli::check_output_file(a.output, "--output");  // before loading and converting
  LoadedModel lm = load_model_with_tokenizer(a.model, a.tokenizer);
  if (a.to == "gguf") {
    write_gguf(lm.model, *lm.tokenizer, a.output, type);
  } else {
    write_llama2c_v1(lm.model, a.output);
  }
  Model check = load_model(a.output);  // read back: the written file must load
  std::printf("wrote %s (%s, %s%s): dim %d, layers %d, heads %d/%d, vocab %d, context %d\n", a.output.c_str(),
              a.to.c_str(), checkpoint_format_name(check.format), a.to == "gguf" ? (", " + a.type).c_str() : "",
              check.config.dim, check.config.n_layers, check.config.num_heads, check.config.num_heads_kv,
              check.config.vocab_size, check.config.seq_len);
}

void register_convert(CLI::App& root) {
  auto args = std::make_shared<ConvertArgs>();
  CLI::App* sub = root.add_subcommand("convert", "convert a checkpoint: llama2.c → GGUF (llama architecture) or llama2.c v1");
  sub->add_option("--model", args->model, "input checkpoint (llama2.c or GGUF)")->required();
  sub->add_option("--tokenizer", args->tokenizer, "llama2.c tokenizer file (embedded into the GGUF)");
  sub->add_option("--to", args->to, "gguf (default) | llama2c");
  sub->add_option("--type", args->type, "GGUF matrix type: f32 (default), f16, bf16, q8_0");
  sub->add_option("--output,-o", args->output, "output file")->required();
  sub->callback([args] { run(*args); });
}

}  // namespace

FLASHKV_CLI_COMMAND("convert", register_convert);
