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
// chance < 1% of the time).
//
// THE DEVICE'S OWN ARITHMETIC AND THE MEAN KL. The device rounds its activations to bf16 at ~6 points per layer (the
// norms' outputs, q / k / v, the attention output, SwiGLU's output; cuda_engine.cpp). Against the device's own
// lossless (bf16) cache these roundings cancel only while the two runs' activations are bit-identical; a quantized
// cache moves every later activation by more than a bf16 ulp, so the format's run and the reference's run round
// independently and KL(device bf16 ‖ device X) = KL_quant + KL(r_X − r_ref): about TWICE the KL of the device's
// rounding noise on top of the quantization's (measured on the CPU with the device emulated — bf16 weights and
// EngineOptions::bf16_activations — on the GPU test's models and seed: +5.6e-5 for int8, t = 45, where the H200
// measured +5.6e-5, t = 49; fp8_e4m3 +8.8e-5 vs +9.5e-5; int4 +1.93e-4 vs +1.94e-4). Top-1 agreement and Δll are
// first order in the logit error and insensitive to it at this size (Δll telescopes exactly); the KL is second
// order: errors that are independent ADD in KL (KL ≈ ½ Var_p(Δlogit)). So the mean KL is compared against the one
// reference both devices share, the CPU's fp32 cache (the truth T), with the device's measured error added:
//     KL(T ‖ device X)   vs   KL(T ‖ CPU X) + KL(T ‖ device's bf16 cache)              (paired_kl_with_device_error)
// — nothing about the device is modelled; both its terms are measured in the same run. A defect in the device's
// quantized path (e.g. dequantized K / V rounded to bf16: + KL(T ‖ CPU bf16 cache), 4.3e-6 on the GPU test's models)
// adds to the left side only. The rule is biased low by at most the format's own share of the bf16 rounding where
// the format's grid contains the device's (bf16 itself: exactly; fp8 with a power-of-two scale: partly), far below
// the bound of any quantized format.
// Calibration and power (tests/eval/test_eval_device.cpp, CI): the device emulated on the CPU (bf16 weights + bf16
// activations, EngineOptions::bf16_activations) passes the rule for every device format while failing the
// device-reference KL comparison the way the H200 did (int8 t = 52–73 over 5 seeds; the rule |t| <= 1.9);
// neighbouring formats fail the rule (int4 vs int4_g32 t = 14–34, int8 vs fp8_e4m3_dynamic |t| > 55, fp8_e4m3_dynamic
// vs fp8_e4m3 t = 6–9); an extra bf16 rounding of every dequantized K / V (a defect of that size) reaches t ≈ 3–5 for
// int8 on the CI models and is buried in the fp8 / int4 rows' noise (printed). tests/cuda/test_eval_cuda.cpp applies
// the rule to the GPU and prints the GPU against the CPU emulation of it as well.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

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

/// The paired comparison of per-block values a[b] and b[b] (the same blocks).
inline PairedMetric paired_values(const char* name, const std::vector<double>& a, const std::vector<double>& b,
                                  double floor) {
  PairedMetric p{name};
  const std::size_t S = std::min(a.size(), b.size());
  std::vector<double> d(S);
  for (std::size_t s = 0; s < S; ++s) {
    p.mean_a += a[s] / static_cast<double>(S);
    p.mean_b += b[s] / static_cast<double>(S);
    d[s] = a[s] - b[s];
  }
  for (double x : d) p.diff += x / static_cast<double>(S);
  double var = 0;
  for (double x : d) var += (x - p.diff) * (x - p.diff);
  p.se = S > 1 ? std::sqrt(var / static_cast<double>(S - 1) / static_cast<double>(S)) : INFINITY;
  p.floor = floor;
  return p;
}

/// The paired comparison of one metric over the per-block metrics of two evaluations (same blocks).
inline PairedMetric paired(const char* name, const std::vector<eval::Metrics>& a, const std::vector<eval::Metrics>& b,
                           const std::function<double(const eval::Metrics&)>& get, double floor) {
  std::vector<double> va, vb;
  for (const auto& m : a) va.push_back(get(m));
  for (const auto& m : b) vb.push_back(get(m));
  return paired_values(name, va, vb, floor);
}

/// The mean-KL rule of the file comment, per block against the CPU's fp32 cache (the truth T): a = KL(T ‖ device X),
/// b = KL(T ‖ CPU X) + KL(T ‖ the device's lossless cache).
inline PairedMetric paired_kl_with_device_error(const std::vector<eval::Metrics>& device_x,
                                                const std::vector<eval::Metrics>& cpu_x,
                                                const std::vector<eval::Metrics>& device_ref) {
  std::vector<double> a, b;
  const std::size_t S = std::min({device_x.size(), cpu_x.size(), device_ref.size()});
  for (std::size_t s = 0; s < S; ++s) {
    a.push_back(device_x[s].mean_kl);
    b.push_back(cpu_x[s].mean_kl + device_ref[s].mean_kl);
  }
  return paired_values("KL+dev", a, b, 1e-12);
}

/// The first-order metrics (top-1 disagreement, Δll) of two evaluations, each against its own device's lossless
/// reference (the mean KL: paired_kl_with_device_error).
inline std::vector<PairedMetric> paired_first_order(const std::vector<eval::Metrics>& a,
                                                    const std::vector<eval::Metrics>& b) {
  return {paired("top-1 dis", a, b, [](const eval::Metrics& m) { return 1.0 - m.top1; }, 1e-4),
          paired("delta ll", a, b, [](const eval::Metrics& m) { return m.delta_ll; }, 1e-12)};
}

/// The CUDA engine's arithmetic emulated on the CPU: run a model whose matrices are rounded to bf16
/// (enginetest::bf16_weight_copy) on this target (EngineOptions::bf16_activations; its fp32 reference cache is then
/// as lossless as the device's bf16 one).
inline eval::EvalTarget emulated_device() {
  eval::EvalTarget t;
  t.engine.bf16_activations = true;
  return t;
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
