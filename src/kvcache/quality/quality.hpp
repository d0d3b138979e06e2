// KV-cache quality tools (library behind `flashkv eval kv`): synthetic K/V generators that mimic what real models
// produce, per-format error metrics, and the attention-level needle test. All computations go through the real
// PagedKVCache (append + attention + dequantize), so they measure exactly what the cache stores and computes.
//
// Generators (one KV head; keys/values [n][head_dim], queries [num_q][head_dim]):
//   gaussian  every element N(0, 1)
//   outlier   keys with 4 fixed outlier channels (per head) 10–50× larger than the rest, as observed in LLM keys
//             (KIVI arXiv 2402.02750 §3.1, KVQuant arXiv 2401.18079 §3.1); values N(0, 1)
//   rope      the outlier keys after rotary embedding (RoFormer, theta = 10000, half-split pairs as Llama) at their
//             positions; queries rotated at the last position — RoPE mixes channel pairs so per-channel ranges vary
//   sink      gaussian keys/values plus token 0 whose key makes the largest score by far (an attention sink, Xiao et
//             al. arXiv 2309.17453), so most of every query's probability mass sits on it
// Metrics per (format, generator):
//   nmse_k, nmse_v  Σ (x̂ − x)² / Σ x² over the dequantized cache
//   attn_rel_err    ‖out − out_exact‖ / ‖out_exact‖ over all queries (out_exact: the same cache in fp32)
//   qk_bias, qk_std mean and standard deviation of q·k̂ − q·k (scaled by softmax_scale) over all (query, key) pairs
// Needle (attention-level long-context retrieval): n distractor keys N(0, 1) and values N(0, 1) + a common mean
// vector (value vectors of real models share a mean direction); at position depth·(n − 1) a key whose score exceeds
// the log-sum-exp of the distractor scores by `margin` (so the exact softmax puts p = e^margin / (1 + e^margin) of the
// mass on it) with a random zero-mean value; success when cos(out, needle value) >= 0.9, which needs p >~ 0.67 — so
// a quantization error that lowers the needle's logit relative to the distractors by more than about
// margin − 0.7 makes retrieval fail.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashkv/kvcache.hpp"

namespace flashkv::kvq {

enum class Distribution { gaussian, outlier, rope, sink };
const char* distribution_name(Distribution d);
/// "gaussian" | "outlier" | "rope" | "sink"; Error('distribution') otherwise.
Distribution parse_distribution(const std::string& s);

struct Synthetic {
  int64_t n = 0, num_q = 0, head_dim = 0;
  std::vector<float> k, v;  ///< [n][head_dim]
  std::vector<float> q;     ///< [num_q][head_dim]
};
/// Deterministic for a given seed.
Synthetic generate(Distribution dist, int64_t n, int64_t num_q, int64_t head_dim, uint64_t seed);

/// Cache settings shared by every format of one evaluation (the format itself comes as kv_cache_dtype).
struct CacheSettings {
  int32_t page_size = 32;
  int32_t residual_tokens = 0;
  int32_t sink_tokens = 0;
  bool hadamard = false;
  uint64_t rotation_seed = 0;
};

struct FormatQuality {
  std::string kv_cache_dtype;
  std::string distribution;
  double bits_per_element = 0;
  double nmse_k = 0, nmse_v = 0;
  double attn_rel_err = 0;
  double qk_bias = 0, qk_std = 0;
};
/// Metrics of one format on one synthetic set (see the file comment). Throws Error for a bad format string.
FormatQuality evaluate_format(const std::string& kv_cache_dtype, const CacheSettings& settings, const Synthetic& data);

struct NeedleCell {
  int64_t context = 0;
  double depth = 0;      ///< 0..1
  double cosine = 0;     ///< cos(out, needle value)
  bool success = false;  ///< cosine >= 0.9
};
struct NeedleResult {
  std::string kv_cache_dtype;
  std::vector<NeedleCell> cells;  ///< contexts × depths, context-major
  double success_rate(int64_t context) const;
};
/// Runs the needle test for one format over contexts × depths (depths in [0, 1]). head_dim 128 by default.
NeedleResult needle_test(const std::string& kv_cache_dtype, const CacheSettings& settings,
                         const std::vector<int64_t>& contexts, const std::vector<double>& depths, double margin,
                         int32_t head_dim, uint64_t seed);

/// SVG heatmap (depth rows × context columns, colour = cosine, ✓/✗ per cell) of one format's needle result.
std::string needle_heatmap_svg(const NeedleResult& r, const std::vector<int64_t>& contexts,
                               const std::vector<double>& depths);

}  // namespace flashkv::kvq
