// Shared by the libFuzzer targets: read every weight of a loaded model so that AddressSanitizer sees any pointer
// that escaped the file image.
#pragma once

#include <cstddef>

#include "flashkv/engine.hpp"

namespace flashkv::fuzz {

inline float touch(const float* p, std::size_t n) {
  float s = 0.0f;
  for (std::size_t i = 0; i < n; ++i) s += p[i];
  return s;
}

inline float touch_model(const Model& m) {
  const auto& c = m.config;
  const std::size_t D = c.dim, H = c.hidden_dim, V = c.vocab_size, KV = c.kv_dim(),
                    Q = static_cast<std::size_t>(c.num_heads) * c.head_dim;
  float s = touch(m.token_embedding, V * D) + touch(m.final_norm, D) + touch(m.classifier, V * D);
  for (const auto& L : m.layers) {
    s += touch(L.attn_norm, D) + touch(L.wq, Q * D) + touch(L.wk, KV * D) + touch(L.wv, KV * D) +
         touch(L.wo, D * Q) + touch(L.ffn_norm, D) + touch(L.w1, H * D) + touch(L.w2, D * H) + touch(L.w3, H * D);
  }
  return s;
}

}  // namespace flashkv::fuzz
