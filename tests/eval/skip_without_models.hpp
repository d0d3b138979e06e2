// Shared by the eval tests: skip (with the reason) instead of failing when the 260K test model is missing
// (flashkv::shipped_models_dir(): FLASHKV_MODELS_DIR, else models/aidreams260k from scripts/setup, else
// ../shared/models) — issue 10 item 12.
#pragma once

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "flashkv/model.hpp"

#define FLASHKV_SKIP_WITHOUT_MODELS()                                                                         \
  do {                                                                                                        \
    const std::string dir = ::flashkv::shipped_models_dir();                                                  \
    if (!std::filesystem::is_regular_file(dir + "/aidreams260K.bin") ||                                       \
        !std::filesystem::is_regular_file(dir + "/aidreams260K.tok512.bin")) {                                \
      GTEST_SKIP() << "shipped model not found in '" << dir << "': run scripts/setup (or set FLASHKV_MODELS_DIR)"; \
    }                                                                                                         \
  } while (0)
