// flashkv inspect: a GGUF file's metadata and tensor table (like gguf-dump), and one tensor dequantized to float32.
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "cli/util_model_cli.hpp"
#include "cli/util_output.hpp"
#include "flashkv/engine.hpp"
#include "flashkv/error.hpp"

namespace {

struct InspectArgs {
  std::string model, tensor, out;
  bool json = false;
};

void run(const InspectArgs& a) {
  using namespace flashkv;
  if (a.tensor.empty() != a.out.empty()) throw Error("tensor", "--tensor and --out together", "only one of them");
  flashkv::cli::check_output_file(a.out, "out");
  const ResolvedModel r = resolve_model(a.model);
  if (!a.tensor.empty()) {
    const std::vector<float> v = read_gguf_tensor(r.model_path, a.tensor);
    std::ofstream f(a.out, std::ios::binary | std::ios::trunc);
    if (!f) throw IoError("flashkv: cannot write --out '" + a.out + "'");
    f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
    if (!f) throw IoError("flashkv: failed writing --out '" + a.out + "'");
    std::printf("%s: %zu float32 values -> %s\n", a.tensor.c_str(), v.size(), a.out.c_str());
    return;
  }
  const GgufInfo info = read_gguf_info(r.model_path);
  if (a.json) {
    nlohmann::json meta = nlohmann::json::object(), tensors = nlohmann::json::array();
    for (const auto& [k, v] : info.metadata) meta[k] = v;
    for (const auto& t : info.tensors)
      tensors.push_back({{"name", t.name}, {"ne", t.ne}, {"type", gguf_type_name(t.type)}, {"offset", t.offset},
                         {"bytes", t.bytes}});
    nlohmann::json j = {{"path", r.model_path}, {"version", info.version}, {"metadata", meta}, {"tensors", tensors}};
    std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return;
  }
  std::printf("%s: GGUF v%u, %zu metadata keys, %zu tensors\n", r.model_path.c_str(), info.version, info.metadata.size(),
              info.tensors.size());
  for (const auto& [k, v] : info.metadata) {
    std::string s = v;
    for (char& ch : s) if (ch == '\n') ch = ' ';
    if (s.size() > 100) s = s.substr(0, 97) + "...";
    std::printf("  %-42s %s\n", k.c_str(), s.c_str());
  }
  std::map<std::string, std::pair<int, uint64_t>> by_type;
  for (const auto& t : info.tensors) {
    auto& e = by_type[gguf_type_name(t.type)];
    ++e.first;
    e.second += t.bytes;
  }
  std::printf("tensor types:");
  for (const auto& [name, e] : by_type) std::printf(" %s x%d (%.1f MiB)", name.c_str(), e.first, e.second / 1048576.0);
  std::printf("\n");
  for (const auto& t : info.tensors) {
    std::string shape;
    for (auto d : t.ne) shape += (shape.empty() ? "" : " x ") + std::to_string(d);
    std::printf("  %-28s %-5s [%s]\n", t.name.c_str(), gguf_type_name(t.type).c_str(), shape.c_str());
  }
}

void register_inspect(CLI::App& root) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* sub = root.add_subcommand("inspect", "a GGUF file's metadata and tensors; --tensor NAME --out F dumps one as float32");
  args->model = "smollm2-135m";
  sub->add_option("--model", args->model, flashkv::cli::model_option_help("smollm2-135m") + " (GGUF only)");
  sub->add_option("--tensor", args->tensor, "tensor to dequantize (with --out)");
  sub->add_option("--out", args->out, "file for --tensor's float32 values (ggml order, ne[0] fastest, little-endian)");
  sub->add_flag("--json", args->json, "print metadata and tensor table as JSON");
  sub->callback([args] { run(*args); });
}

}  // namespace

FLASHKV_CLI_COMMAND("inspect", register_inspect);
