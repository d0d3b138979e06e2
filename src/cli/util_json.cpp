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

}  // namespace flashkv::cli
