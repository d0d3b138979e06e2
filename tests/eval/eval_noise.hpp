// "Matches within noise" for two evaluations of the same KV format (the GPU eval and the CPU eval; the CPU eval and an
// emulation of the GPU on the CPU), shared by tests/eval (CPU, CI) and tests/cuda (label gpu).
//
// WHY THIS DESIGN AND BOUND. A format's metric (mean KL, top-1 disagreement, Δll) averages per-position values whose
// quantization errors depend on the exact K/V the cache encodes. The GPU computes K/V from bf16 weights and
// activations, so codes near a rounding boundary round the other way: the GPU's quantization error is a partly new
// draw of the same error distribution, not the CPU's error plus a small term, and the two evaluations differ by the
// sampling noise of the metric over those draws even when both are right. That noise has a MODEL-level part: one
// perturbation of the weights moves every sequence of that model coherently (measured: with one model and its
// sequences as the blocks, t = diff / SE spread with sd 1.5–2.8 over 12 perturbation draws, |t| up to 5.4). So the
// blocks are independent MODELS: kBlocks random SmolLM2-shaped models (block_model(b)), each evaluated on its own
// kSeqs sampled sequences of kLen tokens; per block b, d_b = metric_a(b) − metric_b(b), and
//     |mean(d)| <= kZ · sd(d) / sqrt(kBlocks)  +  floor
// with kZ = 5 (a two-sided t-test with 15 degrees of freedom at p ≈ 2e-4: the ~40 checks of one GPU run fail by
// chance < 1% of the time). Calibration (the bf16-rounded weights plus uniform weight noise of ±2.3·2^-8 — the CUDA
// engine's logit error is ~2.3x that of rounding the weights alone, test_engine_cuda.cpp — as the "device", 5
// formats x 3 metrics): on the GPU test's shape sd(t) = 1.0, max |t| = 2.7 over 60 checks (4 noise draws); on the CI
// test's smaller shape sd(t) = 1.04, max |t| = 3.3 over 105 checks (7 seeds). Power (CPU formats against each other
// on the same blocks, mean KL): int4 vs int4_g32 t = 14–32, int8 vs fp8_e4m3_dynamic |t| > 50, and even fp8_e4m3 vs
// fp8_e4m3_dynamic (8–13% apart) t = 5.2 (GPU shape) / 6.2–7.8 (CI shape). The floor only keeps a metric that is 0 in
// every block of both runs from dividing 0 by 0. tests/eval/test_eval_device.cpp checks the calibration and the
// power on the CPU in CI; tests/cuda/test_eval_cuda.cpp applies the bound
// to the GPU.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../common/model_copy.hpp"
#include "../engine/random_model.hpp"
#include "eval/evaluation.hpp"
#include "eval/perplexity.hpp"

namespace flashkv::evaltest {

inline constexpr double kZ = 5.0;
inline constexpr int kBlocks = 16;  ///< independent random models
inline constexpr int kSeqs = 4;     ///< sampled sequences per model
inline constexpr int kLen = 64;     ///< tokens per sequence
inline constexpr float kLogitScale = 0.12f;

struct PairedMetric {
  const char* name;
  double mean_a = 0, mean_b = 0, diff = 0, se = 0, floor = 0;
  double t() const { return se > 0 ? diff / se : (diff == 0 ? 0.0 : INFINITY); }
  bool ok() const { return std::fabs(diff) <= kZ * se + floor; }
  std::string describe() const {
    char b[256];
    std::snprintf(b, sizeof b, "%-9s a %.4g  b %.4g  diff %+.3g  se %.3g  t %+.2f  (bound %.3g)%s", name, mean_a,
                  mean_b, diff, se, t(), kZ * se + floor, ok() ? "" : "  FAILS");
    return b;
  }
};

/// The paired comparison of one metric over the per-sequence metrics of two evaluations (same sequences).
inline PairedMetric paired(const char* name, const std::vector<eval::Metrics>& a, const std::vector<eval::Metrics>& b,
                           const std::function<double(const eval::Metrics&)>& get, double floor) {
  PairedMetric p{name};
  const std::size_t S = std::min(a.size(), b.size());
  std::vector<double> d(S);
  for (std::size_t s = 0; s < S; ++s) {
    p.mean_a += get(a[s]) / static_cast<double>(S);
    p.mean_b += get(b[s]) / static_cast<double>(S);
    d[s] = get(a[s]) - get(b[s]);
  }
  for (double x : d) p.diff += x / static_cast<double>(S);
  double var = 0;
  for (double x : d) var += (x - p.diff) * (x - p.diff);
  p.se = S > 1 ? std::sqrt(var / static_cast<double>(S - 1) / static_cast<double>(S)) : INFINITY;
  p.floor = floor;
  return p;
}

/// KL, top-1 disagreement and Δll of two evaluations of one format.
inline std::vector<PairedMetric> paired_metrics(const std::vector<eval::Metrics>& a,
                                                const std::vector<eval::Metrics>& b) {
  return {paired("mean KL", a, b, [](const eval::Metrics& m) { return m.mean_kl; }, 1e-12),
          paired("top-1 dis", a, b, [](const eval::Metrics& m) { return 1.0 - m.top1; }, 1e-4),
          paired("delta ll", a, b, [](const eval::Metrics& m) { return m.delta_ll; }, 1e-12)};
}

inline bool all_ok(const std::vector<PairedMetric>& ms) {
  return std::all_of(ms.begin(), ms.end(), [](const PairedMetric& m) { return m.ok(); });
}

/// A copy of `m` (the copy owns its weights) whose matrices are multiplied by (1 + u), u uniform in [−rel, rel],
/// seeded: weight noise of a chosen size, to emulate a device whose rounding error is larger than bf16's.
inline Model perturbed_copy(const Model& m, double rel, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-rel, rel);
  return test::mapped_weight_copy(m, " (perturbed)",
                                  [&](float x) { return static_cast<float>(x * (1.0 + u(rng))); });
}

/// `m` with its final norm weights scaled by `s` (the logits scale by s): the random test models' logits have a
/// standard deviation of ~sqrt(dim) ≈ 24 (one-hot softmaxes that no KV error moves); s ≈ 0.12 gives ~3, the spread
/// of a trained model's logits, so that KL, top-1 and Δll respond to the cache.
inline void scale_logits(Model& m, float s) {
  std::unique_ptr<float[]> fn(new float[static_cast<std::size_t>(m.config.dim)]);
  for (int32_t i = 0; i < m.config.dim; ++i) fn[static_cast<std::size_t>(i)] = m.final_norm[i] * s;
  m.final_norm = fn.get();
  m.owned.push_back(std::move(fn));
}

/// Block b's model: a random Llama with SmolLM2's attention shape (9 query / 3 KV heads of 64, dim 576) or, `small`,
/// a cheaper one for the CPU (4 / 2 heads of 64, dim 256); untied classifier, logits scaled (scale_logits), context
/// 128, seeded by (seed, b).
inline Model block_model(uint64_t seed, int b, bool small = false) {
  ModelConfig c;
  if (small) {
    c.dim = 256; c.hidden_dim = 256; c.num_heads = 4; c.num_heads_kv = 2; c.vocab_size = 256;
  } else {
    c.dim = 576; c.hidden_dim = 384; c.num_heads = 9; c.num_heads_kv = 3; c.vocab_size = 512;
  }
  c.head_dim = 64; c.n_layers = 2; c.seq_len = 128; c.rope_theta = 100000.0f; c.shared_classifier = false;
  Model m = test::random_model(c, seed * 1000003u + 1000u + static_cast<uint64_t>(b));
  scale_logits(m, kLogitScale);
  return m;
}

/// Block b's sequences: kSeqs sampled from its model with the CPU's fp32 cache (the same for every device).
inline std::vector<std::vector<int32_t>> block_sequences(const Model& m, uint64_t seed, int b) {
  return eval::sample_sequences(m, kSeqs, kLen, seed * 7919u + 50u + static_cast<uint64_t>(b));
}

/// The text protocol's statistics as the metrics above: KLD, same top-1, Δll = ln PPL(reference) − ln PPL(format).
inline eval::Metrics text_metrics(const eval::TextStats& reference, const eval::TextStats& format) {
  eval::Metrics m;
  m.mean_kl = format.kld_mean;
  m.top1 = format.same_top1;
  m.delta_ll = std::log(reference.ppl) - std::log(format.ppl);
  return m;
}

}  // namespace flashkv::evaltest
