// flashkv command-line tool: main() and the command registry (see command.hpp).
#include <cstdio>
#include <new>
#include <algorithm>
#include <string>
#include <vector>

#include "cli/command.hpp"
#include "flashkv/attention.hpp"
#include "flashkv/error.hpp"

namespace flashkv::cli {
namespace {
std::vector<std::pair<std::string, CommandFn>>& registry() {
  static std::vector<std::pair<std::string, CommandFn>> r;
  return r;
}
}  // namespace

CommandRegistrar::CommandRegistrar(const char* name, CommandFn fn) { registry().emplace_back(name, std::move(fn)); }

CLI::App* group(CLI::App& root, const std::string& name, const std::string& description) {
  for (CLI::App* sub : root.get_subcommands([](CLI::App*) { return true; })) {
    if (sub->get_name() == name) return sub;
  }
  CLI::App* g = root.add_subcommand(name, description);
  return g;
}

}  // namespace flashkv::cli

int main(int argc, char** argv) {
  CLI::App app{"flashkv — exact IO-aware attention and quantized KV caches"};
  app.set_version_flag("--version", std::string("flashkv ") + flashkv::version());
  app.require_subcommand(1);
  app.fallthrough(false);
  // Registration order is link order; sort by name so --help is stable.
  auto regs = flashkv::cli::registry();
  std::sort(regs.begin(), regs.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [name, fn] : regs) fn(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string msg = e.what();
    std::fprintf(stderr, "flashkv: error: %s (see --help)\n", msg.c_str());
    return 2;
  } catch (const flashkv::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {  // sizes the user asked for that this machine cannot hold: not a flashkv bug
    std::fprintf(stderr, "flashkv: error: out of memory: the requested sizes do not fit this machine's memory\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashkv: internal error: %s\n", e.what());
    return 1;
  }
  return 0;
}
