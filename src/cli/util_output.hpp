// Output paths of the `flashkv` commands, checked before any work (issue 10 item 6): a run that takes minutes must
// not fail at its end because --json / --plot / --heatmap-dir / --output points somewhere unwritable. A bad path is a
// user mistake: flashkv::Error naming the option (main() prints one line, exit 2), never "internal error".
#pragma once

#include <string>

namespace flashkv::cli {

/// Checks that `path` can be written as a file: not a directory, its directory exists, and a file can be created
/// there (probed by creating and removing it when it does not exist yet; an existing file is opened for appending and
/// left unchanged). "-" (stdout) passes when `allow_stdout`. Empty `path` = option not given: nothing to check.
void check_output_file(const std::string& path, const std::string& option, bool allow_stdout = false);

/// Creates directory `dir` (with parents) if needed and checks that files can be created in it.
void prepare_output_dir(const std::string& dir, const std::string& option);

}  // namespace flashkv::cli
