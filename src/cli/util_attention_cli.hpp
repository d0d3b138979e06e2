// Argument parsing and names shared by the attention commands (`flashkv bench attention`, `flashkv explain ...`).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "flashkv/attention.hpp"
#include "flashkv/types.hpp"

namespace flashkv::cli {

/// "float32" | "float16" | "bfloat16" -> DType; anything else: flashkv::Error naming --dtype.
DType parse_dtype(const std::string& s);

/// "naive" | "v1" | "v2" (= "tiled") | "all" -> the forward variants, in the order naive, v1, tiled; anything else:
/// flashkv::Error naming --variant.
std::vector<Algorithm> parse_variants(const std::string& s);

/// The CLI name of a forward variant: "naive", "v1" or "v2" (tiled).
const char* variant_label(Algorithm a);

/// The `flashkv explain` group (created with its description on first use).
CLI::App* explain_group(CLI::App& root);

}  // namespace flashkv::cli
