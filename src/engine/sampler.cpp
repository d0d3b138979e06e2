// Seeded samplers: greedy, temperature, top-k, top-p (nucleus; Holtzman et al., "The Curious Case of Neural Text
// Degeneration", ICLR 2020, §3.1). Random numbers: xorshift64* as in llama2.c, so runs are reproducible per seed.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "flashkv/engine.hpp"
#include "flashkv/error.hpp"

namespace flashkv {

void SamplerConfig::validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0f)
    throw Error("temperature", "a finite value >= 0 (0 = greedy)", std::to_string(temperature));
  if (!(top_p > 0.0f && top_p <= 1.0f)) throw Error("top_p", "a value in (0, 1]", std::to_string(top_p));
  if (top_k < 0) throw Error("top_k", "a value >= 0 (0 = off)", std::to_string(top_k));
}

Sampler::Sampler(SamplerConfig config) : config_(config), state_(config.seed != 0 ? config.seed : 0x9E3779B97F4A7C15ull) {
  config_.validate();
}

float Sampler::next_uniform() {
  state_ ^= state_ >> 12;
  state_ ^= state_ << 25;
  state_ ^= state_ >> 27;
  const uint32_t bits = static_cast<uint32_t>((state_ * 0x2545F4914F6CDD1Dull) >> 32);
  return static_cast<float>(bits >> 8) / 16777216.0f;
}

namespace {
int32_t argmax(std::span<const float> x) {
  int32_t best = 0;
  for (std::size_t i = 1; i < x.size(); ++i)
    if (x[i] > x[static_cast<std::size_t>(best)]) best = static_cast<int32_t>(i);
  return best;
}
}  // namespace

std::vector<double> Sampler::distribution(std::span<const float> logits) const {
  if (logits.empty()) throw Error("logits", "at least one logit", "0");
  const std::size_t n = logits.size();
  std::vector<double> p(n, 0.0);
  if (config_.temperature == 0.0f) {
    p[static_cast<std::size_t>(argmax(logits))] = 1.0;
    return p;
  }
  // Softmax in double of logits / temperature.
  double mx = -INFINITY;
  for (float l : logits) mx = std::max(mx, static_cast<double>(l));
  double sum = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = std::exp((static_cast<double>(logits[i]) - mx) / config_.temperature);
    sum += p[i];
  }
  for (double& v : p) v /= sum;
  const bool use_k = config_.top_k > 0 && static_cast<std::size_t>(config_.top_k) < n;
  const bool use_p = config_.top_p < 1.0f;
  if (!use_k && !use_p) return p;
  // Order by probability descending, lower id first on ties.
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const double pa = p[static_cast<std::size_t>(a)], pb = p[static_cast<std::size_t>(b)];
    return pa > pb || (pa == pb && a < b);
  });
  std::size_t keep = use_k ? static_cast<std::size_t>(config_.top_k) : n;
  if (use_p) {
    double mass = 0.0;
    for (std::size_t i = 0; i < keep; ++i) mass += p[static_cast<std::size_t>(order[i])];
    // Smallest prefix whose share of the (top-k) mass reaches top_p.
    double cum = 0.0;
    std::size_t j = 0;
    for (; j < keep; ++j) {
      cum += p[static_cast<std::size_t>(order[j])];
      if (cum >= static_cast<double>(config_.top_p) * mass) { ++j; break; }
    }
    keep = std::min(keep, std::max<std::size_t>(j, 1));
  }
  std::vector<double> q(n, 0.0);
  double kept = 0.0;
  for (std::size_t i = 0; i < keep; ++i) kept += p[static_cast<std::size_t>(order[i])];
  for (std::size_t i = 0; i < keep; ++i) {
    const auto id = static_cast<std::size_t>(order[i]);
    q[id] = p[id] / kept;
  }
  return q;
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (logits.empty()) throw Error("logits", "at least one logit", "0");
  if (config_.temperature == 0.0f) return argmax(logits);
  std::vector<double> p = distribution(logits);
  const double u = next_uniform();
  double cdf = 0.0;
  int32_t last = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0.0) continue;
    cdf += p[i];
    last = static_cast<int32_t>(i);
    if (u < cdf) return last;
  }
  return last;  // rounding: u at the very top of the cdf
}

}  // namespace flashkv
