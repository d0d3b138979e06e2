// Helpers of the CUDA engine tests: teacher-forced logits of an Engine, the bf16-weight twin of a model (the "naive
// same-precision computation" the GPU's error is measured against), and per-step logit / KL / argmax comparisons.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "../common/model_copy.hpp"
#include "core/float16.hpp"
#include "flashkv/engine.hpp"

namespace flashkv::enginetest {

/// Logits after the prompt (prefill) and after each of `forced` but the last (decode, one token at a time):
/// forced.size() rows of [vocab] — row i predicts forced[i].
inline std::vector<std::vector<float>> teacher_forced(Engine& e, const std::vector<int32_t>& prompt,
                                                      const std::vector<int32_t>& forced) {
  const std::size_t V = static_cast<std::size_t>(e.model().config.vocab_size);
  std::vector<std::vector<float>> rows;
  const int32_t s = e.add_sequence();
  std::vector<float> l(V);
  e.prefill(s, prompt, l);
  rows.push_back(l);
  for (std::size_t i = 0; i + 1 < forced.size(); ++i) {
    const int32_t seq[1] = {s}, tok[1] = {forced[i]};
    e.decode(seq, tok, l);
    rows.push_back(l);
  }
  e.remove_sequence(s);
  return rows;
}

/// A copy of `m` whose matrices (wq, wk, wv, wo, w1, w2, w3, classifier) are rounded to bf16, as the CUDA engine
/// uploads them; the token embedding and the norms stay float32 (as on the GPU). The copy owns its weights.
inline Model bf16_weight_copy(const Model& m) {
  return test::mapped_weight_copy(m, " (bf16 weights)", [](float x) { return bf16_to_float(float_to_bf16(x)); });
}

/// KL(p ‖ q) in nats of the softmaxes of two logit rows (float64).
inline double kl_divergence(const std::vector<float>& p_logits, const std::vector<float>& q_logits) {
  auto logsoftmax = [](const std::vector<float>& l) {
    double mx = -INFINITY;
    for (float x : l) mx = std::max(mx, static_cast<double>(x));
    double s = 0;
    for (float x : l) s += std::exp(x - mx);
    std::vector<double> o(l.size());
    for (std::size_t i = 0; i < l.size(); ++i) o[i] = l[i] - mx - std::log(s);
    return o;
  };
  const auto lp = logsoftmax(p_logits), lq = logsoftmax(q_logits);
  double kl = 0;
  for (std::size_t i = 0; i < lp.size(); ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  return std::max(0.0, kl);
}

inline int32_t argmax(const std::vector<float>& l) {
  return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
}
/// top-1 minus top-2 logit.
inline double top2_margin(const std::vector<float>& l) {
  std::vector<float> s = l;
  std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<float>());
  return static_cast<double>(s[0]) - s[1];
}

/// Per-step comparison of `got` against the reference `ref` (same teacher-forced tokens).
struct Comparison {
  double max_diff = 0;   ///< max over steps and vocab of |got − ref|
  double max_kl = 0;     ///< max over steps of KL(ref ‖ got)
  double mean_kl = 0;
  int steps = 0;
  int decided = 0;       ///< steps whose ref top-2 margin exceeds 2 · that step's max |got − ref|
  int decided_agree = 0; ///< of those, steps where argmax(got) == argmax(ref)
  int argmax_agree = 0;  ///< all steps where the argmaxes agree
  double min_margin_disagree = INFINITY;  ///< smallest ref margin among disagreeing steps
  std::string describe() const {
    char b[320];
    std::snprintf(b, sizeof b,
                  "max|dlogit| %.3g, KL max %.3g mean %.3g nats, argmax agree %d/%d, decided %d (agree %d), "
                  "smallest margin at a disagreement %.3g",
                  max_diff, max_kl, mean_kl, argmax_agree, steps, decided, decided_agree, min_margin_disagree);
    return b;
  }
};

inline Comparison compare_logits(const std::vector<std::vector<float>>& ref, const std::vector<std::vector<float>>& got) {
  Comparison c;
  c.steps = static_cast<int>(ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) {
    double d = 0;
    for (std::size_t v = 0; v < ref[i].size(); ++v)
      d = std::max(d, std::fabs(static_cast<double>(ref[i][v]) - got[i][v]));
    c.max_diff = std::max(c.max_diff, d);
    const double kl = kl_divergence(ref[i], got[i]);
    c.max_kl = std::max(c.max_kl, kl);
    c.mean_kl += kl / static_cast<double>(ref.size());
    const bool agree = argmax(ref[i]) == argmax(got[i]);
    c.argmax_agree += agree;
    const double margin = top2_margin(ref[i]);
    if (margin > 2 * d) {
      ++c.decided;
      c.decided_agree += agree;
    }
    if (!agree) c.min_margin_disagree = std::min(c.min_margin_disagree, margin);
  }
  return c;
}

}  // namespace flashkv::enginetest
