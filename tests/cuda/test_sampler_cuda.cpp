// The device sampler (src/engine/cuda/sample_kernels.hpp) against flashkv::Sampler on the same logits and the same
// xorshift64* draws: token-identical for every configuration (greedy, temperature, top-k, top-p, both), on random
// logits of SmolLM2's vocabulary and on crafted rows (ties, −inf, a NaN, one dominant token, all equal).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "common/reference.hpp"
#include "engine/cuda/sample_kernels.hpp"
#include "flashkv/sampler.hpp"

using namespace flashkv;

namespace {

/// Draws `draws` tokens per row on the device and on the CPU with identically seeded samplers; returns mismatches.
int mismatches(const std::vector<std::vector<float>>& rows, const SamplerConfig& cfg, int draws) {
  const int64_t V = static_cast<int64_t>(rows[0].size());
  const int R = static_cast<int>(rows.size());
  std::vector<float> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  float* d = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), flat.size() * 4), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, flat.data(), flat.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  engine_cuda::SampleWorkspace ws;
  std::vector<Sampler> dev, cpu;
  for (int r = 0; r < R; ++r) {
    SamplerConfig c = cfg;
    c.seed = cfg.seed + static_cast<uint64_t>(r);
    dev.emplace_back(c);
    cpu.emplace_back(c);
  }
  int bad = 0;
  for (int k = 0; k < draws; ++k) {
    std::vector<engine_cuda::RowSampling> p(static_cast<size_t>(R));
    for (int r = 0; r < R; ++r) {
      p[r].temperature = cfg.temperature, p[r].top_p = cfg.top_p, p[r].top_k = cfg.top_k;
      p[r].u = cfg.temperature > 0 ? dev[r].next_uniform() : 0.0f;
    }
    const std::vector<int32_t> got = engine_cuda::sample_rows(d, V, p.data(), R, ws, nullptr);
    for (int r = 0; r < R; ++r) {
      const int32_t want = cpu[r].sample(rows[r]);
      if (got[r] != want && bad++ < 5)
        ADD_FAILURE() << "T " << cfg.temperature << " top_k " << cfg.top_k << " top_p " << cfg.top_p << " row " << r
                      << " draw " << k << ": device " << got[r] << ", CPU " << want;
    }
  }
  cudaFree(d);
  return bad;
}

}  // namespace

TEST(CudaSampler, MatchesTheCpuSamplerTokenForToken) {
  const uint64_t seed = flashkv::testing::test_seed();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<std::vector<float>> rows(3, std::vector<float>(49152));
  for (auto& r : rows)
    for (float& x : r) x = nd(rng);
  const SamplerConfig configs[] = {
      {0.0f, 1.0f, 0, seed},  {1.0f, 1.0f, 0, seed},   {0.7f, 1.0f, 40, seed}, {1.3f, 0.9f, 0, seed},
      {0.8f, 0.5f, 20, seed}, {1.0f, 0.95f, 1, seed},  {2.0f, 0.2f, 0, seed},  {1.0f, 1.0f, 49151, seed},
  };
  for (const SamplerConfig& c : configs) EXPECT_EQ(mismatches(rows, c, 40), 0);
}

TEST(CudaSampler, CraftedRows) {
  const int V = 3000;
  std::vector<std::vector<float>> rows;
  std::vector<float> ties(V, -5.0f);
  for (int i : {7, 300, 2999}) ties[i] = 4.0f;  // three-way tie at the top: greedy takes 7; top_k 2 keeps 7, 300
  ties[1000] = -0.0f, ties[1001] = 0.0f;        // ±0 tie
  rows.push_back(ties);
  std::vector<float> inf(V, 1.0f);
  for (int i = 0; i < V; i += 3) inf[i] = -INFINITY;  // masked-out tokens: never drawn
  rows.push_back(inf);
  std::vector<float> dominant(V, 0.0f);
  dominant[123] = 80.0f;  // everything else underflows relative to it
  rows.push_back(dominant);
  rows.push_back(std::vector<float>(V, 0.25f));  // all equal
  std::vector<float> nan_row(V, 0.5f);
  nan_row[10] = NAN;  // greedy ignores a NaN that is not at id 0
  nan_row[20] = 2.0f;
  for (const SamplerConfig& c : {SamplerConfig{0.0f, 1.0f, 0, 1}, SamplerConfig{1.0f, 1.0f, 2, 1},
                                 SamplerConfig{0.9f, 0.7f, 0, 2}, SamplerConfig{1.0f, 1.0f, 0, 3}}) {
    EXPECT_EQ(mismatches(rows, c, 60), 0);
  }
  EXPECT_EQ(mismatches({nan_row}, SamplerConfig{0.0f, 1.0f, 0, 1}, 1), 0);
}
