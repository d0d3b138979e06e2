// Engine::append_synthetic on the CUDA engine (the benchmark's context fill, staged on the device): the device cache
// receives the same values as the CPU engine's (exact in bf16, and quantized by the same codec), so decoding after the
// fill matches the CPU engine within the bf16-weight error scale of engine_compare.hpp (plus, for quantized formats,
// the allowance of the CPU's own quantization effect on the model's new K/V, as test_engine_cuda.cpp).
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "common/reference.hpp"
#include "engine_compare.hpp"
#include "flashkv/error.hpp"
#include "../engine/random_model.hpp"

using namespace flashkv;
using namespace flashkv::enginetest;

namespace {

constexpr double kFactor = 4.0;  // test_engine_cuda.cpp's allowance over the bf16-weight scale

/// Logits of decoding `forced` one token at a time after `n` synthetic tokens (seed) in a fresh sequence.
std::vector<std::vector<float>> after_fill(Engine& e, int32_t n, uint64_t seed, const std::vector<int32_t>& forced) {
  const std::size_t V = static_cast<std::size_t>(e.model().config.vocab_size);
  const int32_t s = e.add_sequence();
  e.append_synthetic(s, n, seed);
  EXPECT_EQ(e.length(s), n);
  std::vector<std::vector<float>> rows;
  std::vector<float> l(V);
  for (int32_t t : forced) {
    e.decode(std::vector<int32_t>{s}, std::vector<int32_t>{t}, l);
    rows.push_back(l);
  }
  e.remove_sequence(s);
  return rows;
}

}  // namespace

TEST(CudaEngineSynthetic, FillEqualsTheCpuEnginesForEachDeviceFormat) {
  ModelConfig c;
  c.dim = 256; c.hidden_dim = 192; c.n_layers = 2; c.num_heads = 4; c.num_heads_kv = 2; c.head_dim = 64;
  c.vocab_size = 300; c.seq_len = 512; c.shared_classifier = false;
  const uint64_t seed = flashkv::testing::test_seed() + 23;
  Model m = test::random_model(c, seed);
  const Model twin = bf16_weight_copy(m);
  std::mt19937_64 rng(seed);
  std::vector<int32_t> forced;
  for (int i = 0; i < 6; ++i) forced.push_back(static_cast<int32_t>(rng() % c.vocab_size));
  const int32_t n = 300;  // several pages and split-KV chunks
  EngineOptions gpu_opts;
  gpu_opts.device = Device::cuda;
  Engine cpu32(m, KVCacheSpec{}, 1);
  const auto fp32 = after_fill(cpu32, n, seed, forced);
  for (const char* fmt : {"bf16", "int8", "int4"}) {
    KVCacheSpec spec;
    spec.kv_cache_dtype = fmt;
    Engine cpu(m, spec, 1), tw(twin, spec, 1), gpu(m, spec, 1, 0, gpu_opts);
    const auto ref = after_fill(cpu, n, seed, forced);
    const Comparison scale = compare_logits(ref, after_fill(tw, n, seed, forced));
    const Comparison quant = compare_logits(fp32, ref);
    const Comparison g = compare_logits(ref, after_fill(gpu, n, seed, forced));
    std::printf("[engine-cuda] %s after %d synthetic tokens, GPU vs CPU: %s\n  bf16-weight CPU vs CPU: %s\n  %s vs "
                "fp32 cache on the CPU: %s\n", fmt, n, g.describe().c_str(), scale.describe().c_str(), fmt,
                quant.describe().c_str());
    const double extra = std::string(fmt) == "bf16" ? 0.0 : quant.max_diff;
    EXPECT_LE(g.max_diff, kFactor * scale.max_diff + extra) << fmt;
    EXPECT_EQ(g.decided_agree, g.decided) << fmt;
    EXPECT_GT(g.max_diff, 0.0) << fmt << ": bf16 weights must change the logits (is this the GPU?)";
  }
}
