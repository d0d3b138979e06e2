// A copy of a Model with every weight matrix mapped element-wise (header-only test support), shared by
// tests/cuda/engine_compare.hpp (bf16_weight_copy: the bf16-rounded weights the CUDA engine uploads) and
// tests/eval/eval_noise.hpp (perturbed_copy: weight noise that emulates a device with a larger rounding error).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include "flashkv/model.hpp"

namespace flashkv::test {

/// A copy of `m` (the copy owns its weights; `m` may die first) whose matrices are mapped element-wise by `f`
/// (float -> float): the classifier (a separate matrix even when tied to the embedding, as the GPU uploads it), then
/// per layer wq, wk, wv, wo, w1, w2, w3 — `f` is called in that order, elements in index order, so a seeded `f`
/// (noise) is reproducible. The token embedding and the norms (attention, FFN, final) are copied unchanged (float32,
/// as on the GPU). config, stop_tokens and bos_token are copied; path is `m.path + path_suffix`.
template <class F>
Model mapped_weight_copy(const Model& m, const std::string& path_suffix, F&& f) {
  Model b;
  b.config = m.config;
  b.path = m.path + path_suffix;
  b.stop_tokens = m.stop_tokens;
  b.bos_token = m.bos_token;
  const ModelConfig& c = m.config;
  auto keep = [&](const float* p, std::size_t n, bool map) {
    std::unique_ptr<float[]> o(new float[n]);
    for (std::size_t i = 0; i < n; ++i) o[i] = map ? f(p[i]) : p[i];
    b.owned.push_back(std::move(o));
    return b.owned.back().get();
  };
  const std::size_t D = c.dim, H = c.hidden_dim, V = c.vocab_size, KV = c.kv_dim(),
                    Q = static_cast<std::size_t>(c.num_heads) * c.head_dim;
  b.token_embedding = keep(m.token_embedding, V * D, false);
  b.classifier = keep(m.classifier, V * D, true);
  b.final_norm = keep(m.final_norm, D, false);
  for (const LayerWeights& L : m.layers) {
    LayerWeights o;
    o.attn_norm = keep(L.attn_norm, D, false);
    o.ffn_norm = keep(L.ffn_norm, D, false);
    o.wq = keep(L.wq, Q * D, true);
    o.wk = keep(L.wk, KV * D, true);
    o.wv = keep(L.wv, KV * D, true);
    o.wo = keep(L.wo, D * Q, true);
    o.w1 = keep(L.w1, H * D, true);
    o.w2 = keep(L.w2, D * H, true);
    o.w3 = keep(L.w3, H * D, true);
    b.layers.push_back(o);
  }
  return b;
}

}  // namespace flashkv::test
