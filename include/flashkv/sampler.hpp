// flashkv/sampler.hpp — seeded token samplers: greedy, temperature, top-k, top-p (nucleus; Holtzman et al., "The
// Curious Case of Neural Text Degeneration", ICLR 2020, §3.1). Random numbers: xorshift64* as in llama2.c.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace flashkv {

struct SamplerConfig {
  float temperature = 0.0f;  ///< 0 = greedy (argmax, lowest id on ties); > 0 divides the logits
  float top_p = 1.0f;        ///< nucleus (Holtzman et al. 2020, §3.1): smallest set with cumulative prob >= top_p
  int32_t top_k = 0;         ///< keep the k most probable tokens (0 = off); applied before top_p
  uint64_t seed = 42;        ///< xorshift64* state; the same seed gives the same tokens
  /// Throws Error naming "temperature" (< 0 or non-finite), "top_p" (not in (0, 1]) or "top_k" (< 0).
  void validate() const;
};

/// Seeded sampler. Ties in probability are broken by the lower token id, so results do not depend on sort stability.
class Sampler {
 public:
  explicit Sampler(SamplerConfig config);
  /// Draws one token id from `logits` [vocab] (float32, not modified). Throws Error if logits is empty.
  int32_t sample(std::span<const float> logits);
  /// Probabilities after temperature, top-k and top-p (renormalized; zeros outside the kept set). Used by the tests.
  std::vector<double> distribution(std::span<const float> logits) const;
  /// Next uniform in [0, 1) from the xorshift64* stream (24-bit resolution).
  float next_uniform();
  const SamplerConfig& config() const { return config_; }

 private:
  SamplerConfig config_;
  uint64_t state_;
};

}  // namespace flashkv
