#include "cli/util_attention_cli.hpp"

#include "cli/command.hpp"
#include "flashkv/error.hpp"

namespace flashkv::cli {

DType parse_dtype(const std::string& s) {
  if (s == "float32") return DType::float32;
  if (s == "float16") return DType::float16;
  if (s == "bfloat16") return DType::bfloat16;
  throw Error("--dtype", "float32, float16 or bfloat16", "'" + s + "'");
}

std::vector<Algorithm> parse_variants(const std::string& s) {
  if (s == "all") return {Algorithm::naive, Algorithm::v1_order, Algorithm::tiled};
  if (s == "naive") return {Algorithm::naive};
  if (s == "v1") return {Algorithm::v1_order};
  if (s == "v2" || s == "tiled") return {Algorithm::tiled};
  throw Error("--variant", "naive, v1, v2 (= tiled) or all", "'" + s + "'");
}

const char* variant_label(Algorithm a) {
  return a == Algorithm::tiled ? "v2" : a == Algorithm::v1_order ? "v1" : "naive";
}

CLI::App* explain_group(CLI::App& root) {
  CLI::App* g = group(root, "explain", "Explain FlashAttention's ideas on tiny examples computed by the library");
  g->require_subcommand(1);  // `flashkv explain` alone is an error naming the choices, not a silent exit 0
  return g;
}

}  // namespace flashkv::cli
