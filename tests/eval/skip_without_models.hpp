// Shared by the eval tests: skip (with the reason) instead of failing when the shipped model folder is missing
// (FLASHKV_MODELS_DIR, default ../shared/models) — issue 10 item 12.
#pragma once

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "flashkv/model.hpp"

#define FLASHKV_SKIP_WITHOUT_MODELS()                                                                         \
  do {                                                                                                        \
    const std::string dir = ::flashkv::models_dir(FLASHKV_DEFAULT_MODELS_DIR);                                \
    if (!std::filesystem::is_regular_file(dir + "/aidreams260K.bin") ||                                       \
        !std::filesystem::is_regular_file(dir + "/aidreams260K.tok512.bin")) {                                \
      GTEST_SKIP() << "shipped model not found in '" << dir << "': set FLASHKV_MODELS_DIR (default ../shared/models)"; \
    }                                                                                                         \
  } while (0)
