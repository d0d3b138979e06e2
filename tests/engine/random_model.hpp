// A random Llama model with owned float32 weights, shared by the CPU engine tests and the CUDA engine tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>

#include "flashkv/model.hpp"

namespace flashkv::test {

/// A random Llama model with owned weights (std-normal · scale).
inline Model random_model(const ModelConfig& c, uint64_t seed) {
  Model m;
  m.config = c;
  m.path = "<random>";
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto make = [&](std::size_t n, float scale, float offset = 0.0f) {
    std::unique_ptr<float[]> p(new float[n]);
    for (std::size_t i = 0; i < n; ++i) p[i] = offset + scale * nd(rng);
    m.owned.push_back(std::move(p));
    return m.owned.back().get();
  };
  const std::size_t D = c.dim, H = c.hidden_dim, V = c.vocab_size, KV = c.kv_dim(), Q = c.num_heads * c.head_dim;
  m.token_embedding = make(V * D, 1.0f);
  m.layers.resize(static_cast<std::size_t>(c.n_layers));
  for (auto& L : m.layers) {
    L.attn_norm = make(D, 0.1f, 1.0f);
    L.wq = make(Q * D, 1.0f / std::sqrt(static_cast<float>(D)));
    L.wk = make(KV * D, 1.0f / std::sqrt(static_cast<float>(D)));
    L.wv = make(KV * D, 1.0f / std::sqrt(static_cast<float>(D)));
    L.wo = make(D * Q, 1.0f / std::sqrt(static_cast<float>(Q)));
    L.ffn_norm = make(D, 0.1f, 1.0f);
    L.w1 = make(H * D, 1.0f / std::sqrt(static_cast<float>(D)));
    L.w2 = make(D * H, 1.0f / std::sqrt(static_cast<float>(H)));
    L.w3 = make(H * D, 1.0f / std::sqrt(static_cast<float>(D)));
  }
  m.final_norm = make(D, 0.1f, 1.0f);
  m.classifier = c.shared_classifier ? m.token_embedding : make(V * D, 1.0f);
  return m;
}

}  // namespace flashkv::test
