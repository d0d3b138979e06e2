// CLI plumbing: every `flashkv <command>` lives in its own src/cli/cmd_<name>.cpp and registers itself with
// FLASHKV_CLI_COMMAND(fn), where fn(CLI::App& root) adds its subcommand(s). Group commands shared by several files
// ("bench", "explain", "eval") are fetched with group(); do not create them twice.
//
// Error contract: a callback throws flashkv::Error (or CLI::ValidationError) for bad input; main() prints ONE line
// "flashkv: error: ..." to stderr and exits with code 2. Other exceptions exit 1.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace flashkv::cli {

using CommandFn = std::function<void(CLI::App&)>;

struct CommandRegistrar {
  CommandRegistrar(const char* name, CommandFn fn);
};

/// Returns the subcommand `name` of `root`, creating it (with `description`) on first use.
CLI::App* group(CLI::App& root, const std::string& name, const std::string& description);

}  // namespace flashkv::cli

#define FLASHKV_CLI_CONCAT2(a, b) a##b
#define FLASHKV_CLI_CONCAT(a, b) FLASHKV_CLI_CONCAT2(a, b)
#define FLASHKV_CLI_COMMAND(name, fn) \
  static ::flashkv::cli::CommandRegistrar FLASHKV_CLI_CONCAT(flashkv_cli_registrar_, __LINE__)(name, fn)
