#include "cli/util_json.hpp"

#include <cstdio>
#include <fstream>

#include "flashkv/error.hpp"

namespace flashkv::cli {

void print_or_write_json(const nlohmann::json& j, const std::string& path) {
  if (path == "-") {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::ofstream out(path);
    if (!out) throw IoError("flashkv: cannot write JSON '" + path + "'");
    out << j.dump(2) << "\n";
  }
}

nlohmann::json graph_stats_json(const CudaGraphStats& s) {
  return {{"graph_steps", s.graph_steps}, {"eager_steps", s.eager_steps}, {"captures", s.captures},
          {"capture_failures", s.capture_failures}, {"evictions", s.evictions}, {"graphs", s.graphs},
          {"last_capture_error", s.last_capture_error}};
}

}  // namespace flashkv::cli
