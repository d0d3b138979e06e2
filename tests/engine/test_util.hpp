// Shared helpers for the engine tests: shipped-model paths, the test seed, temp files.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <unistd.h>
#include <string>
#include <vector>

#include "flashkv/engine.hpp"
#include "flashkv/error.hpp"

namespace flashkv::test {

/// The 260K test model's folder: flashkv::shipped_models_dir() (FLASHKV_MODELS_DIR, else models/aidreams260k where
/// scripts/setup copies it, else ../shared/models beside the source tree).
inline std::string model_dir() { return shipped_models_dir(); }
inline std::string model_path() { return model_dir() + "/aidreams260K.bin"; }
inline std::string tokenizer_path() { return model_dir() + "/aidreams260K.tok512.bin"; }

/// "" when the shipped model and tokenizer are there; else why not (tests that need them skip with this message
/// instead of failing or crashing on an empty file).
inline std::string missing_models_reason() {
  for (const std::string& p : {model_path(), tokenizer_path()}) {
    if (!std::filesystem::is_regular_file(p)) {
      return "shipped model file '" + p + "' not found: run scripts/setup (it copies aidreams260K.bin and "
             "aidreams260K.tok512.bin into models/aidreams260k), or set FLASHKV_MODELS_DIR to the folder holding them";
    }
  }
  return "";
}

/// SmolLM2's GGUF (fetched by scripts/setup), or "" when it is not installed.
inline std::string smollm2_path() {
  try {
    return resolve_model("smollm2-135m").model_path;
  } catch (const IoError&) {
    return "";
  }
}

inline uint64_t test_seed() {
  static const uint64_t seed = [] {
    const char* env = std::getenv("FLASHKV_TEST_SEED");
    uint64_t s = env ? std::strtoull(env, nullptr, 10) : static_cast<uint64_t>(std::random_device{}());
    std::printf("[flashkv] FLASHKV_TEST_SEED=%llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

/// A file in a per-process temporary directory, removed when the test binary exits.
inline std::string temp_path(const std::string& name) {
  struct Dir {
    std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("flashkv_engine_test_" + std::to_string(::getpid()));
    Dir() { std::filesystem::create_directories(path); }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static Dir dir;
  return (dir.path / name).string();
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
inline void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

}  // namespace flashkv::test

/// First statement of a test that needs the shipped model: skips it (gtest SKIPPED, ctest "Skipped") when missing.
#define FLASHKV_SKIP_WITHOUT_MODELS()                                                          \
  do {                                                                                         \
    if (const std::string why = ::flashkv::test::missing_models_reason(); !why.empty()) GTEST_SKIP() << why; \
  } while (0)

/// First statement of a test that reads SmolLM2: skips it when scripts/setup has not fetched the model.
#define FLASHKV_REQUIRE_SMOLLM2()                                                                                  \
  do {                                                                                                             \
    if (::flashkv::test::smollm2_path().empty())                                                                   \
      GTEST_SKIP() << "SmolLM2 not installed (expected in " << ::flashkv::fetched_models_dir()                     \
                   << "/smollm2-135m): run scripts/setup";                                                         \
  } while (0)
