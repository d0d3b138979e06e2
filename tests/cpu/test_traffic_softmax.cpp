// The traffic model (include/flashkv/traffic.hpp) against hand-derived counts, and the step-by-step online softmax
// (src/cpu/online_softmax.hpp) against the exact softmax in float64.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/reference.hpp"
#include "cpu/online_softmax.hpp"
#include "flashkv/error.hpp"
#include "flashkv/traffic.hpp"

using namespace flashkv;
using namespace flashkv::testing;

namespace {

TrafficShape shape(int64_t n, int64_t d, bool causal) {
  TrafficShape s;
  s.batch = 2;
  s.num_heads = 3;
  s.seqlen_q = n;
  s.seqlen_k = n;
  s.head_dim = d;
  s.dtype = DType::float16;
  s.causal = causal;
  return s;
}

TEST(Traffic, TiledMatchesHandCount) {
  const TrafficShape s = shape(1024, 64, false);
  const TrafficEstimate t = estimate_traffic(Algorithm::tiled, s);
  const double heads = 6, n = 1024, d = 64, e = 2, tr = 8;  // Br = 128, Bc = 64
  EXPECT_DOUBLE_EQ(t.q_read, heads * n * d * e);
  EXPECT_DOUBLE_EQ(t.k_read, heads * tr * n * d * e);
  EXPECT_DOUBLE_EQ(t.v_read, heads * tr * n * d * e);
  EXPECT_DOUBLE_EQ(t.out_write, heads * n * d * e);
  EXPECT_DOUBLE_EQ(t.lse_write, heads * n * 4);
  EXPECT_DOUBLE_EQ(t.s_write + t.p_write + t.o_acc_write + t.stats_write, 0.0);
  EXPECT_DOUBLE_EQ(t.bytes_total, t.bytes_read + t.bytes_written);
  EXPECT_EQ(t.tiles_visited, 6 * 8 * 16);
  EXPECT_EQ(t.tiles_total, 6 * 8 * 16);
  EXPECT_DOUBLE_EQ(t.flops, 4.0 * 2 * 3 * 1024.0 * 1024.0 * 64);
}

TEST(Traffic, CausalSkipsTilesExceptNaive) {
  const TrafficEstimate full = estimate_traffic(Algorithm::tiled, shape(1024, 64, false));
  const TrafficEstimate causal = estimate_traffic(Algorithm::tiled, shape(1024, 64, true));
  EXPECT_EQ(causal.tiles_visited, 6 * 2 * (8 * 9 / 2));  // Q block i (128 rows) visits 2(i + 1) K/V tiles
  EXPECT_LT(causal.k_read, 0.6 * full.k_read);
  EXPECT_DOUBLE_EQ(causal.flops, 0.5 * full.flops);
  const TrafficEstimate v1c = estimate_traffic(Algorithm::v1_order, shape(1024, 64, true));
  int64_t v1_tiles = 0;  // K/V block j (64 keys) is seen by queries [64j, 1024): ceil((1024 − 64j) / 128) Q blocks
  for (int64_t j = 0; j < 16; ++j) v1_tiles += (1024 - 64 * j + 127) / 128;
  EXPECT_EQ(v1c.tiles_visited, 6 * v1_tiles);
  const TrafficEstimate nf = estimate_traffic(Algorithm::naive, shape(1024, 64, false));
  const TrafficEstimate nc = estimate_traffic(Algorithm::naive, shape(1024, 64, true));
  EXPECT_DOUBLE_EQ(nf.bytes_total, nc.bytes_total);  // naive computes every score, then masks
}

TEST(Traffic, VariantOrderingAndMemoryGrowth) {
  for (int64_t d : {64, 128}) {
    for (int64_t n : {1024, 4096, 16384}) {
      const TrafficEstimate t = estimate_traffic(Algorithm::tiled, shape(n, d, false));
      const TrafficEstimate v1 = estimate_traffic(Algorithm::v1_order, shape(n, d, false));
      const TrafficEstimate nv = estimate_traffic(Algorithm::naive, shape(n, d, false));
      EXPECT_LT(2.5 * t.bytes_total, v1.bytes_total) << n;
      EXPECT_LT(3.5 * t.bytes_total, nv.bytes_total) << n;
      // v1 (float32 O, m, l round trip per 64-key block: (d·e + 2·(dv + 2)·4) bytes per query per block) beats
      // naive (16 bytes per score) at d = 64, but not at d = 128 with such small blocks — FA1's traffic is
      // Θ(N²d²/M): it needs a large fast memory M, which is what the FA2 loop order removes.
      if (d == 64) {
        EXPECT_LT(v1.bytes_total, nv.bytes_total) << n;
      }
      EXPECT_DOUBLE_EQ(nv.s_write, 6.0 * n * n * 4);
      EXPECT_DOUBLE_EQ(nv.s_read + nv.p_write + nv.p_read, 3 * nv.s_write);
    }
  }
  // extra memory: tiled O(1) in N, v1 O(N·d), naive O(N²)
  const double t1 = estimate_traffic(Algorithm::tiled, shape(1024, 64, false)).extra_memory_bytes;
  const double t4 = estimate_traffic(Algorithm::tiled, shape(4096, 64, false)).extra_memory_bytes;
  const double v1a = estimate_traffic(Algorithm::v1_order, shape(1024, 64, false)).extra_memory_bytes;
  const double v1b = estimate_traffic(Algorithm::v1_order, shape(4096, 64, false)).extra_memory_bytes;
  const double n1 = estimate_traffic(Algorithm::naive, shape(1024, 64, false)).extra_memory_bytes;
  const double n4 = estimate_traffic(Algorithm::naive, shape(4096, 64, false)).extra_memory_bytes;
  EXPECT_DOUBLE_EQ(t1, t4);
  EXPECT_GT(v1b / v1a, 3.0);
  EXPECT_LT(v1b / v1a, 4.01);
  EXPECT_GT(n4 / n1, 15.0);
}

TEST(Traffic, RejectsBadShapes) {
  TrafficShape s = shape(128, 64, false);
  s.block_m = 0;
  EXPECT_THROW(estimate_traffic(Algorithm::tiled, s), Error);
  s = shape(128, 64, false);
  s.dtype = DType::int32;
  EXPECT_THROW(estimate_traffic(Algorithm::tiled, s), TypeError);
  EXPECT_THROW(estimate_traffic(static_cast<Algorithm>(9), shape(128, 64, false)), Error);
  EXPECT_FALSE(traffic_formula(Algorithm::naive).empty());
}

// ---- online softmax, step by step -------------------------------------------------------------------------------------

TEST(OnlineSoftmax, StepByStepEqualsExactSoftmax) {
  std::mt19937_64 rng = make_rng(0x5001);
  std::normal_distribution<double> n01(0.0, 3.0);
  const int n = 37, dv = 5, tile = 8;
  std::vector<float> s(n), v(static_cast<std::size_t>(n) * dv);
  for (auto& x : s) x = static_cast<float>(n01(rng));
  for (auto& x : v) x = static_cast<float>(n01(rng));
  s[30] = 12.0f;  // a late maximum forces a visible rescale
  cpu::OnlineSoftmaxRow st;
  std::vector<float> o(dv, 0.0f), out(dv);
  float running_max = -std::numeric_limits<float>::infinity();
  bool saw_rescale = false;
  for (int j0 = 0; j0 < n; j0 += tile) {
    const int len = std::min(tile, n - j0);
    std::vector<float> chunk(s.begin() + j0, s.begin() + j0 + len);
    const float m_old = st.m;
    const float alpha = cpu::online_softmax_update(st, chunk.data(), len, v.data() + j0 * dv, dv, o.data());
    for (int j = 0; j < len; ++j) running_max = std::max(running_max, s[j0 + j]);
    EXPECT_EQ(st.m, running_max);
    if (j0 > 0) {
      EXPECT_NEAR(alpha, std::exp(static_cast<double>(m_old) - st.m), 1e-6);
    }
    saw_rescale = saw_rescale || (j0 > 0 && alpha < 1.0f);
  }
  EXPECT_TRUE(saw_rescale);
  const float lse = cpu::online_softmax_finalize(st, o.data(), dv, out.data(), true);
  double mx = -1e300, l = 0.0;
  for (float x : s) mx = std::max(mx, static_cast<double>(x));
  for (float x : s) l += std::exp(x - mx);
  EXPECT_NEAR(lse, mx + std::log(l), 1e-5);
  for (int c = 0; c < dv; ++c) {
    double ref = 0.0;
    for (int j = 0; j < n; ++j) ref += std::exp(s[j] - mx) / l * v[static_cast<std::size_t>(j) * dv + c];
    EXPECT_NEAR(out[c], ref, 1e-5 * (1 + std::fabs(ref)));
  }
}

TEST(OnlineSoftmax, MaskedTilesAndEmptyRows) {
  const float ninf = -std::numeric_limits<float>::infinity();
  cpu::OnlineSoftmaxRow st;
  std::vector<float> o(3, 0.0f), out(3, 9.0f), v(6, 1.0f);
  std::vector<float> masked = {ninf, ninf};
  EXPECT_EQ(cpu::online_softmax_update(st, masked.data(), 2, v.data(), 3, o.data()), 1.0f);
  EXPECT_EQ(st.m, ninf);
  EXPECT_EQ(st.l, 0.0f);
  EXPECT_EQ(cpu::online_softmax_finalize(st, o.data(), 3, out.data(), /*has_keys=*/false), ninf);
  for (float x : out) EXPECT_EQ(x, 0.0f);
  // huge logits: no overflow, no NaN
  std::vector<float> big = {1e30f, -1e30f};
  std::vector<float> vv = {1, 2, 3, 4, 5, 6};
  cpu::online_softmax_update(st, big.data(), 2, vv.data(), 3, o.data());
  const float lse = cpu::online_softmax_finalize(st, o.data(), 3, out.data(), true);
  EXPECT_EQ(lse, 1e30f);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[2], 3.0f);
}

TEST(OnlineSoftmax, NonFiniteScoresGiveNaNRowsNotEmptyRows) {
  // include/flashkv/attention.hpp NON-FINITE INPUTS, at the level of one row: a NaN or +inf score anywhere (first
  // tile, a later tile, a tile where everything else is masked) makes out and lse NaN; all-(−inf) visible scores are
  // NaN too; only has_keys = false gives (0, −inf).
  const float ninf = -std::numeric_limits<float>::infinity(), inf = -ninf;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> v = {1, 2, 3, 4, 5, 6};
  struct Case {
    std::vector<std::vector<float>> tiles;
    bool has_keys;
    bool want_nan;
  };
  const Case cases[] = {
      {{{0.5f, nan}, {1.0f, 2.0f}}, true, true},   // NaN in the first tile
      {{{0.5f, 1.0f}, {nan, 2.0f}}, true, true},   // NaN in a later tile
      {{{ninf, nan}, {1.0f, 2.0f}}, true, true},   // NaN next to masked keys only ("nothing visible yet")
      {{{ninf, ninf}, {nan, ninf}}, true, true},   // NaN and masked keys only
      {{{1.0f, inf}, {2.0f, 3.0f}}, true, true},   // +inf: exp(inf − inf)
      {{{1.0f, 2.0f}, {inf, 3.0f}}, true, true},   // +inf in a later tile
      {{{ninf, ninf}, {ninf, ninf}}, true, true},  // keys visible but every score −inf
      {{{ninf, ninf}, {ninf, ninf}}, false, false},  // no visible key: 0 and −inf
      {{{ninf, 1.0f}, {ninf, 2.0f}}, true, false},   // some −inf: p = 0 for those, the rest normal
  };
  for (const Case& c : cases) {
    cpu::OnlineSoftmaxRow st;
    std::vector<float> o(3, 0.0f), out(3, 9.0f);
    for (std::vector<float> t : c.tiles) cpu::online_softmax_update(st, t.data(), 2, v.data(), 3, o.data());
    const float lse = cpu::online_softmax_finalize(st, o.data(), 3, out.data(), c.has_keys);
    if (c.want_nan) {
      EXPECT_TRUE(std::isnan(lse)) << lse;
      for (float x : out) EXPECT_TRUE(std::isnan(x)) << x;
    } else if (!c.has_keys) {
      EXPECT_EQ(lse, ninf);
      for (float x : out) EXPECT_EQ(x, 0.0f);
    } else {
      EXPECT_TRUE(std::isfinite(lse));
      const double e = std::exp(1.0 - 2.0);  // keys with scores 1 and 2: v rows 1 and 1 of the two tiles
      EXPECT_NEAR(out[0], (e * 4 + 1 * 4) / (e + 1), 1e-5);
      EXPECT_NEAR(lse, 2.0 + std::log(1.0 + e), 1e-5);
    }
  }
}

TEST(OnlineSoftmax, ExpFlushAccuracy) {
  for (double x = -87.0; x <= 0.0; x += 0.01) {
    const double ref = std::exp(x);
    EXPECT_NEAR(cpu::exp_flush(static_cast<float>(x)) / ref, std::exp(static_cast<double>(static_cast<float>(x)) - x),
                4e-7)
        << x;
  }
  EXPECT_EQ(cpu::exp_flush(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(cpu::exp_flush(-100.0f), 0.0f);
  EXPECT_EQ(cpu::exp_flush(0.0f), 1.0f);
  EXPECT_TRUE(std::isnan(cpu::exp_flush(std::numeric_limits<float>::quiet_NaN())));
}

}  // namespace
