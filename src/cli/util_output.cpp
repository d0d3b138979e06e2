#include "cli/util_output.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "flashkv/error.hpp"

namespace flashkv::cli {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& option, const std::string& expected, const std::string& path,
                       const std::string& why) {
  throw Error(option, expected, "'" + path + "' (" + why + ")", Status::io);
}

/// Creates `file` (which must not exist), then removes it; returns "" or the reason it failed.
std::string probe_create(const fs::path& file) {
  errno = 0;
  std::ofstream out(file);
  if (!out) return errno != 0 ? std::strerror(errno) : "cannot create a file there";
  out.close();
  std::error_code ec;
  fs::remove(file, ec);
  return "";
}

}  // namespace

void check_output_file(const std::string& path, const std::string& option, bool allow_stdout) {
  if (path.empty() || (allow_stdout && path == "-")) return;
  const char* expected = allow_stdout ? "a writable file path (or - for stdout)" : "a writable file path";
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec)) fail(option, expected, path, "a directory");
  if (fs::exists(p, ec)) {
    errno = 0;
    std::ofstream out(p, std::ios::app);  // opening for append changes nothing
    if (!out) fail(option, expected, path, errno != 0 ? std::strerror(errno) : "cannot be opened for writing");
    return;
  }
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec)) fail(option, expected, path, "directory '" + dir.string() + "' does not exist");
  const std::string why = probe_create(p);
  if (!why.empty()) fail(option, expected, path, why);
}

void prepare_output_dir(const std::string& dir, const std::string& option) {
  if (dir.empty()) return;
  const char* expected = "a directory that can be created and written";
  std::error_code ec;
  const fs::path p(dir);
  if (fs::exists(p, ec) && !fs::is_directory(p, ec)) fail(option, expected, dir, "exists and is not a directory");
  fs::create_directories(p, ec);
  if (ec) fail(option, expected, dir, ec.message());
  fs::path probe = p / ".flashkv-write-probe";
  for (int i = 0; fs::exists(probe, ec); ++i) probe = p / (".flashkv-write-probe" + std::to_string(i));
  const std::string why = probe_create(probe);
  if (!why.empty()) fail(option, expected, dir, why);
}

}  // namespace flashkv::cli
