// Synthetic K/V/Q generators of the KV quality tools (see quality.hpp for what each one mimics and its source).
#include <cmath>
#include <random>
#include <string>

#include "kvcache/quality/quality.hpp"

namespace flashkv::kvq {

const char* distribution_name(Distribution d) {
  switch (d) {
    case Distribution::gaussian: return "gaussian";
    case Distribution::outlier: return "outlier";
    case Distribution::rope: return "rope";
    case Distribution::sink: return "sink";
  }
  return "unknown";
}

Distribution parse_distribution(const std::string& s) {
  for (Distribution d : {Distribution::gaussian, Distribution::outlier, Distribution::rope, Distribution::sink}) {
    if (s == distribution_name(d)) return d;
  }
  throw Error("distribution", "one of gaussian, outlier, rope, sink", "'" + s + "'");
}

namespace {

/// Llama-style RoPE (half-split pairs (c, c + d/2)), theta = 10000, in place on one vector at position pos.
void apply_rope(float* x, int64_t d, int64_t pos) {
  const int64_t half = d / 2;
  for (int64_t c = 0; c < half; ++c) {
    const double freq = std::pow(10000.0, -2.0 * static_cast<double>(c) / static_cast<double>(d));
    const double ang = static_cast<double>(pos) * freq;
    const double cs = std::cos(ang), sn = std::sin(ang);
    const double a = x[c], b = x[c + half];
    x[c] = static_cast<float>(a * cs - b * sn);
    x[c + half] = static_cast<float>(a * sn + b * cs);
  }
}

}  // namespace

Synthetic generate(Distribution dist, int64_t n, int64_t num_q, int64_t head_dim, uint64_t seed) {
  if (n < 1) throw Error("tokens", ">= 1", std::to_string(n));
  if (num_q < 1) throw Error("queries", ">= 1", std::to_string(num_q));
  if (head_dim < 4 || head_dim % 2 != 0) throw Error("head_dim", "an even value >= 4", std::to_string(head_dim));
  Synthetic s;
  s.n = n;
  s.num_q = num_q;
  s.head_dim = head_dim;
  std::mt19937_64 g(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  s.k.resize(static_cast<size_t>(n * head_dim));
  s.v.resize(static_cast<size_t>(n * head_dim));
  s.q.resize(static_cast<size_t>(num_q * head_dim));
  for (float& x : s.k) x = n01(g);
  for (float& x : s.v) x = n01(g);
  for (float& x : s.q) x = n01(g);
  if (dist == Distribution::outlier || dist == Distribution::rope) {
    // 4 fixed outlier channels with magnitudes 10–50× (a per-channel offset plus scaled noise, as LLM keys show)
    std::uniform_int_distribution<int64_t> ch(0, head_dim - 1);
    std::uniform_real_distribution<float> mag(10.0f, 50.0f);
    for (int o = 0; o < 4; ++o) {
      const int64_t c = ch(g);
      const float m = mag(g);
      const float offset = m * (o % 2 == 0 ? 1.0f : -1.0f) * 0.5f;
      for (int64_t t = 0; t < n; ++t) {
        float& x = s.k[static_cast<size_t>(t * head_dim + c)];
        x = offset + m * 0.5f * x;
      }
    }
  }
  if (dist == Distribution::rope) {
    for (int64_t t = 0; t < n; ++t) apply_rope(s.k.data() + t * head_dim, head_dim, t);
    for (int64_t i = 0; i < num_q; ++i) apply_rope(s.q.data() + i * head_dim, head_dim, n - 1);
  }
  if (dist == Distribution::sink) {
    // token 0: key along the mean query direction with a large norm -> score ~ 8 standard deviations above the rest
    std::vector<double> mean(static_cast<size_t>(head_dim), 0.0);
    for (int64_t i = 0; i < num_q; ++i) {
      for (int64_t c = 0; c < head_dim; ++c) mean[static_cast<size_t>(c)] += s.q[static_cast<size_t>(i * head_dim + c)];
    }
    double norm = 0;
    for (double x : mean) norm += x * x;
    norm = std::sqrt(norm) + 1e-12;
    // |k0| = 8·sqrt(d) along the mean query direction: score q·k0/sqrt(d) = 8·(q·dir) >> the O(1) other scores
    const double len = 8.0 * std::sqrt(static_cast<double>(head_dim));
    for (int64_t c = 0; c < head_dim; ++c) {
      s.k[static_cast<size_t>(c)] = static_cast<float>(mean[static_cast<size_t>(c)] / norm * len);
    }
  }
  return s;
}

}  // namespace flashkv::kvq
