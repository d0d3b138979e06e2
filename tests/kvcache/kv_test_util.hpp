// Helpers for the KV-cache tests: seeded RNG and the float64 attention reference with an explicit boolean mask, both
// from tests/common/reference.hpp; random tensors and cache snapshots for "unchanged" checks.
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

#include "common/reference.hpp"
#include "flashkv/kvcache.hpp"

namespace kvtest {

/// The process-wide seed of tests/common/reference.hpp (printed once; FLASHKV_TEST_SEED overrides).
inline uint64_t test_seed() { return flashkv::testing::test_seed(); }

/// RNG seeded from the test seed and a per-test salt.
inline std::mt19937_64 rng(uint64_t salt) { return flashkv::testing::make_rng(salt); }

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

/// Float64 attention with an explicit boolean mask: the shared test reference (tests/common/reference.hpp) with
/// batch 1: q [nq][Hq][d], k/v [n][H][d]; query i at position n − nq + i (bottom-right); out [nq][Hq][d], lse [Hq][nq].
/// K / V given as float or double.
template <class T>
inline void reference_attention(const std::vector<float>& q, int64_t nq, int64_t Hq, const std::vector<T>& k,
                                const std::vector<T>& v, int64_t n, int64_t H, int64_t d, double scale, bool causal,
                                int64_t window_left, double softcap, std::vector<double>& out,
                                std::vector<double>& lse) {
  flashkv::testing::RefShape s;
  s.batch = 1;
  s.seqlen_q = nq;
  s.seqlen_k = n;
  s.num_heads = Hq;
  s.num_heads_kv = H;
  s.head_dim = d;
  s.head_dim_v = d;
  flashkv::testing::RefOptions o;
  o.softmax_scale = scale;
  o.causal = causal;
  o.window_size_left = window_left;
  o.softcap = softcap;
  const std::vector<double> qd(q.begin(), q.end()), kd(k.begin(), k.end()), vd(v.begin(), v.end());
  flashkv::testing::reference_forward(s, o, qd, kd, vd, out, lse);
}

}  // namespace kvtest
