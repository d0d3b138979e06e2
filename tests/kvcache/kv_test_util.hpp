// Helpers for the KV-cache tests: seeded RNG (FLASHKV_TEST_SEED overrides; the seed is printed), random tensors, an
// independent float64 attention reference with an explicit boolean mask, and cache snapshots for "unchanged" checks.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "flashkv/kvcache.hpp"

namespace kvtest {

inline uint64_t test_seed() {
  static const uint64_t seed = [] {
    const char* e = std::getenv("FLASHKV_TEST_SEED");
    const uint64_t s = e ? std::strtoull(e, nullptr, 10) : std::random_device{}();
    std::printf("[kvcache tests] FLASHKV_TEST_SEED=%llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

/// RNG seeded from the test seed and a per-test salt.
inline std::mt19937_64 rng(uint64_t salt) { return std::mt19937_64(test_seed() * 0x9E3779B97F4A7C15ull + salt); }

inline std::vector<float> randn(std::mt19937_64& g, size_t n, float sd = 1.0f) {
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = dist(g);
  return v;
}

inline flashkv::TensorView view3(std::vector<float>& v, int64_t a, int64_t b, int64_t c) {
  return flashkv::TensorView::contiguous(v.data(), flashkv::DType::float32, {a, b, c});
}

inline flashkv::KVCacheConfig make_config(const std::string& dtype, int32_t layers, int32_t heads_kv, int32_t head_dim,
                                          int32_t page_size, int32_t residual, int32_t sinks, int64_t pages) {
  flashkv::KVCacheConfig c;
  c.num_layers = layers;
  c.num_heads_kv = heads_kv;
  c.head_dim = head_dim;
  c.page_size = page_size;
  c.residual_tokens = residual;
  c.sink_tokens = sinks;
  c.capacity_pages = pages;
  c.with_kv_cache_dtype(dtype);
  return c;
}

/// Dequantized K and V of (seq, layer) as [n][H][d] float32.
struct KV {
  std::vector<float> k, v;
  int64_t n = 0;
};
inline KV dequant(const flashkv::PagedKVCache& c, int64_t seq, int32_t layer) {
  KV r;
  r.n = c.seq_len(seq, layer);
  const int64_t H = c.config().num_heads_kv, d = c.config().head_dim;
  r.k.resize(static_cast<size_t>(r.n * H * d));
  r.v.resize(static_cast<size_t>(r.n * H * d));
  c.dequantize(seq, layer, view3(r.k, r.n, H, d), view3(r.v, r.n, H, d));
  return r;
}

/// Bitwise snapshot of everything observable: memory report and every (seq, layer) dequantized.
struct Snapshot {
  std::string report;
  std::vector<std::vector<uint32_t>> contents;
  bool operator==(const Snapshot&) const = default;
};
inline Snapshot snapshot(const flashkv::PagedKVCache& c) {
  Snapshot s;
  s.report = c.memory_report().to_string() + " free=" + std::to_string(c.free_pages());
  for (int64_t id : c.sequence_ids()) {
    for (int32_t l = 0; l < c.config().num_layers; ++l) {
      KV kv = dequant(c, id, l);
      std::vector<uint32_t> bits(kv.k.size() + kv.v.size() + 1);
      std::memcpy(bits.data(), kv.k.data(), kv.k.size() * 4);
      std::memcpy(bits.data() + kv.k.size(), kv.v.data(), kv.v.size() * 4);
      bits.back() = static_cast<uint32_t>(id * 131 + l);
      s.contents.push_back(std::move(bits));
    }
  }
  return s;
}

/// Float64 attention with an explicit boolean mask (the definition; independent of the library):
/// q [nq][Hq][d], k/v [n][H][d]; query i at position n − nq + i; out [nq][Hq][d], lse [Hq][nq].
inline void reference_attention(const std::vector<float>& q, int64_t nq, int64_t Hq, const std::vector<float>& k,
                                const std::vector<float>& v, int64_t n, int64_t H, int64_t d, double scale, bool causal,
                                int64_t window_left, double softcap, std::vector<double>& out,
                                std::vector<double>& lse) {
  out.assign(static_cast<size_t>(nq * Hq * d), 0.0);
  lse.assign(static_cast<size_t>(Hq * nq), -std::numeric_limits<double>::infinity());
  const int64_t g = Hq / H;
  std::vector<char> mask(static_cast<size_t>(n));
  std::vector<double> s(static_cast<size_t>(n));
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t pos = n - nq + i;
    for (int64_t j = 0; j < n; ++j) {
      bool vis = true;
      if (causal && j > pos) vis = false;
      if (window_left >= 0 && j < pos - window_left) vis = false;
      mask[static_cast<size_t>(j)] = vis;
    }
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / g;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < n; ++j) {
        if (!mask[static_cast<size_t>(j)]) continue;
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) {
          dot += static_cast<double>(q[static_cast<size_t>((i * Hq + h) * d + c)]) *
                 static_cast<double>(k[static_cast<size_t>((j * H + hk) * d + c)]);
        }
        dot *= scale;
        if (softcap > 0) dot = softcap * std::tanh(dot / softcap);
        s[static_cast<size_t>(j)] = dot;
        mx = std::max(mx, dot);
      }
      if (mx == -std::numeric_limits<double>::infinity()) continue;
      double l = 0;
      for (int64_t j = 0; j < n; ++j) {
        if (!mask[static_cast<size_t>(j)]) continue;
        const double p = std::exp(s[static_cast<size_t>(j)] - mx);
        l += p;
        for (int64_t c = 0; c < d; ++c) {
          out[static_cast<size_t>((i * Hq + h) * d + c)] += p * v[static_cast<size_t>((j * H + hk) * d + c)];
        }
      }
      for (int64_t c = 0; c < d; ++c) out[static_cast<size_t>((i * Hq + h) * d + c)] /= l;
      lse[static_cast<size_t>(h * nq + i)] = mx + std::log(l);
    }
  }
}

}  // namespace kvtest
