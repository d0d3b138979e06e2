// Writing a command's --json result.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "flashkv/engine.hpp"

namespace flashkv::cli {

/// Writes j (indented by 2, newline-terminated) to stdout when path is "-", else to the file `path` (truncated).
/// Throws flashkv::IoError "flashkv: cannot write JSON '<path>'" if the file cannot be opened.
void print_or_write_json(const nlohmann::json& j, const std::string& path);

/// The CUDA engine's graph counters (flashkv::CudaGraphStats) as an object.
nlohmann::json graph_stats_json(const CudaGraphStats& s);

}  // namespace flashkv::cli
