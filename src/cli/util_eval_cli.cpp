#include "cli/util_eval_cli.hpp"

#include <cstdio>

#include "cli/util_parse.hpp"
#include "flashkv/error.hpp"

namespace flashkv::cli {

std::vector<int32_t> parse_token_counts(const std::string& list, const std::string& option) {
  std::vector<int32_t> out;
  for (int64_t v : parse_count_list(list, option, 1, int64_t{1} << 24)) out.push_back(static_cast<int32_t>(v));
  return out;
}

std::vector<double> parse_percents(const std::string& list, const std::string& option) {
  const char* what = "comma-separated percentages in [0, 100] like 0,25,50,75,100";
  std::vector<double> out;
  for (const std::string& s : parse_list(list, option)) {
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (end == s.c_str() || *end != '\0' || !(v >= 0.0 && v <= 100.0)) throw Error(option, what, "'" + s + "'");
    out.push_back(v / 100.0);
  }
  return out;
}

std::vector<KVCacheSpec> parse_kv_list(const std::vector<std::string>& args, const KVCacheSpec& defaults,
                                       int32_t head_dim) {
  std::vector<KVCacheSpec> specs;
  if (args.empty()) return specs;
  for (const std::string& w : parse_kv_format_list(args, "--kv-cache"))
    specs.push_back(eval::fit_kv_spec(eval::parse_format_item(w, defaults), head_dim));
  return specs;
}

void add_eval_device_options(CLI::App* sub, DeviceOptions& device, std::string& reference) {
  add_device_option(sub, device,
                    "where the formats run: cpu (default) or cuda / cuda:N (the CUDA engine: bf16 weights, cuBLAS, the "
                    "device's KV formats; a listed format it cannot run is an error before any work, formats of the "
                    "default list it cannot run are skipped with the reason)");
  add_reference_option(sub, reference);
}

void add_reference_option(CLI::App* sub, std::string& reference) {
  sub->add_option("--reference", reference,
                  "what every format is compared with: device (default: the same device's widest cache - fp32 on "
                  "the CPU, bf16 on CUDA - so KL measures the KV format alone) or cpu (the CPU engine with the fp32 "
                  "cache: with --device cuda the metrics then include the GPU's own bf16 error, its bf16 row alone)");
}

eval::EvalTarget eval_target(const DeviceOptions& device, const std::string& reference) {
  eval::EvalTarget t;
  t.engine = device.engine();  // Error naming 'device'
  if (reference != "device" && reference != "cpu")
    throw Error("reference", "'device' (the same device's widest cache) or 'cpu' (the CPU's fp32 cache)",
                "'" + reference + "'");
  t.cpu_reference = reference == "cpu";
  return t;
}

std::vector<KVCacheSpec> formats_for_target(const Model& model, const std::vector<KVCacheSpec>& specs, bool explicit_list,
                                            const eval::EvalTarget& target, std::vector<eval::SkippedFormat>& skipped) {
  if (explicit_list) {
    eval::check_target(model, specs, target);
    return specs;
  }
  return eval::runnable_specs(model, specs, target, skipped);
}

void print_target(const eval::EvalTarget& target, const std::vector<eval::SkippedFormat>& skipped) {
  if (target.engine.device == Device::cpu && skipped.empty()) return;  // the CPU commands' output is unchanged
  std::printf("device: %s%s; reference = %s%s\n", target.device_name().c_str(),
              target.engine.device == Device::cuda ? " (bf16 weights, cuBLAS, CUDA attention and paged decode)" : "",
              target.reference_name().c_str(),
              target.cpu_reference && target.engine.device != Device::cpu
                  ? " (the metrics include the device's own error; its bf16 row shows it alone)"
                  : " (the metrics measure the KV format alone)");
  for (const eval::SkippedFormat& s : skipped)
    std::printf("skipped on %s (default list): %s - %s\n", target.device_name().c_str(), s.label.c_str(),
                s.reason.c_str());
}

std::string reference_text(const eval::EvalTarget& target) {
  return target.engine.device == Device::cpu ? std::string("fp32 cache") : target.reference_name();
}

}  // namespace flashkv::cli
