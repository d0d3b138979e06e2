// The CUDA engine (EngineOptions::device = cuda) against the CPU engine, teacher-forced on the same tokens:
//   * tolerance: the GPU rounds the weights to bf16 (and the GEMM inputs, q/k/v and the attention to 16 bits). The
//     error scale is the CPU engine on the bf16-rounded weights (bf16_weight_copy) vs the float32 CPU engine; the GPU
//     may be at most kFactor = 4 times that in max |Δlogit| (the guide's "2x the naive same-precision computation",
//     widened because the twin rounds only the weights, not the activations: a numpy emulation of the GPU's roundings
//     on the 260K model measured 2.3x) and kFactor² times its max per-step KL(CPU ‖ GPU) (KL is quadratic in the logit
//     error; the emulation measured 3.8x);
//   * argmax: wherever the CPU's top-2 margin exceeds 2 · max |Δlogit| of the step, the GPU's argmax must equal the
//     CPU's (no rounding can flip it); other steps are reported (count and smallest margin);
//   * free-running greedy: the GPU's tokens equal the CPU's up to the first near-tie (a step whose CPU margin is
//     within 2 · the measured max |Δlogit|), reported.
// Models: the shipped 260K llama2.c model (head_dim 16: the attention and decode run it on their head_dim-64 kernels,
// zero-padded) and a random SmolLM2-shaped model (9 / 3 heads of head_dim 64) for every device KV format;
// SmolLM2-135M itself when scripts/setup fetched it.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "common/reference.hpp"
#include "engine_compare.hpp"
#include "flashkv/error.hpp"
#include "../engine/random_model.hpp"
#include "../engine/test_util.hpp"

using namespace flashkv;
using namespace flashkv::enginetest;

namespace {

constexpr double kFactor = 4.0;

EngineOptions on_cuda() {
  EngineOptions o;
  o.device = Device::cuda;
  return o;
}

KVCacheSpec spec_of(const std::string& dtype) {
  KVCacheSpec s;
  s.kv_cache_dtype = dtype;
  return s;
}

std::vector<int32_t> random_tokens(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)));
  return t;
}

/// The CPU float32 reference and the bf16-weight twin, teacher-forced on (prompt, forced); `cpu_spec` is the CPU
/// reference's cache (fp32, or the format under test).
struct Reference {
  std::vector<std::vector<float>> cpu, twin;
  Comparison twin_vs_cpu;
};
Reference reference(const Model& m, const std::vector<int32_t>& prompt, const std::vector<int32_t>& forced,
                    const KVCacheSpec& cpu_spec, int32_t ctx) {
  Reference r;
  Engine cpu(m, cpu_spec, 1, ctx);
  r.cpu = teacher_forced(cpu, prompt, forced);
  const Model twin = bf16_weight_copy(m);
  Engine tw(twin, cpu_spec, 1, ctx);
  r.twin = teacher_forced(tw, prompt, forced);
  r.twin_vs_cpu = compare_logits(r.cpu, r.twin);
  return r;
}

/// The checks of the file comment for one GPU run against its reference.
void expect_close(const Reference& r, const std::vector<std::vector<float>>& gpu, const std::string& what,
                  double extra_kl = 0.0, double extra_diff = 0.0) {
  const Comparison g = compare_logits(r.cpu, gpu);
  std::printf("[engine-cuda] %s\n  GPU  vs CPU: %s\n  bf16-weight CPU vs CPU: %s\n", what.c_str(),
              g.describe().c_str(), r.twin_vs_cpu.describe().c_str());
  std::printf("  per-step KL(CPU||GPU) max %.3g nats (issue 14 target 1e-4: %s)\n", g.max_kl,
              g.max_kl <= 1e-4 ? "met" : "NOT met");
  EXPECT_LE(g.max_diff, kFactor * r.twin_vs_cpu.max_diff + extra_diff) << what;
  EXPECT_LE(g.max_kl, kFactor * kFactor * r.twin_vs_cpu.max_kl + extra_kl + 1e-7) << what;
  EXPECT_EQ(g.decided_agree, g.decided) << what << ": an argmax flipped where no rounding can flip it";
  EXPECT_GT(g.max_diff, 0.0) << what << ": bf16 weights must change the logits (is this the GPU?)";
}

}  // namespace

TEST(CudaEngine, ShippedModelMatchesCpuEngine) {
  FLASHKV_SKIP_WITHOUT_MODELS();
  LoadedModel lm = load_model_with_tokenizer(test::model_path(), test::tokenizer_path());
  const Model& m = lm.model;
  // The CPU's greedy continuation from BOS (ignoring stop tokens) is the teacher-forced text.
  Engine cpu(m, KVCacheSpec{}, 1);
  Sampler greedy(SamplerConfig{});
  GenerateOptions go;
  go.steps = 100;
  go.ignore_stop_tokens = true;
  go.keep_logits = true;
  const std::vector<int32_t> bos{1};
  const GenerationResult want = generate(cpu, bos, greedy, go);
  ASSERT_EQ(want.tokens.size(), 100u);
  const Reference r = reference(m, bos, want.tokens, KVCacheSpec{}, 0);
  for (const char* fmt : {"bf16", "fp16"}) {
    Engine gpu(m, spec_of(fmt), 1, 0, on_cuda());
    EXPECT_EQ(gpu.device(), Device::cuda);
    expect_close(r, teacher_forced(gpu, bos, want.tokens), std::string("aidreams260K, ") + fmt + " cache");
  }
  // Free-running greedy on the GPU through generate() (device sampling).
  Engine gpu(m, spec_of("bf16"), 1, 0, on_cuda());
  Sampler g2(SamplerConfig{});
  GenerateOptions go2 = go;
  go2.keep_logits = true;
  const GenerationResult got = generate(gpu, bos, g2, go2);
  std::size_t same = 0;
  while (same < got.tokens.size() && same < want.tokens.size() && got.tokens[same] == want.tokens[same]) ++same;
  std::printf("[engine-cuda] aidreams260K greedy: %zu / %zu tokens equal the CPU's\n  GPU text: %s\n", same,
              want.tokens.size(), lm.tokenizer->decode(got.tokens).c_str());
  if (same < want.tokens.size()) {
    const double margin = top2_margin(want.logits[same]);
    double d = 0;
    for (std::size_t v = 0; v < got.logits[same].size(); ++v)
      d = std::max(d, std::fabs(static_cast<double>(got.logits[same][v]) - want.logits[same][v]));
    std::printf("  first difference at step %zu: CPU top-2 margin %.4g, |dlogit| there %.4g\n", same, margin, d);
    EXPECT_LE(margin, 2 * d) << "the greedy paths split where the CPU's argmax was decided";
  }
  // The device sampler draws the CPU sampler's distribution: the same seed gives the same text whenever the logits
  // agree to the token, checked here on the GPU's own logits replayed through the CPU sampler.
  Sampler sg(SamplerConfig{0.8f, 0.9f, 20, 7});
  GenerateOptions go3;
  go3.steps = 60;
  go3.ignore_stop_tokens = true;
  go3.keep_logits = true;
  const GenerationResult sampled = generate(gpu, bos, sg, go3);
  Sampler replay(SamplerConfig{0.8f, 0.9f, 20, 7});
  for (std::size_t i = 0; i < sampled.tokens.size(); ++i)
    ASSERT_EQ(replay.sample(sampled.logits[i]), sampled.tokens[i]) << "step " << i;
}

TEST(CudaEngine, SmolLM2ShapedRandomModelEveryDeviceFormat) {
  ModelConfig c;
  c.dim = 576; c.hidden_dim = 384; c.n_layers = 3; c.num_heads = 9; c.num_heads_kv = 3; c.head_dim = 64;
  c.vocab_size = 1000; c.seq_len = 256; c.rope_theta = 100000.0f; c.shared_classifier = true;
  const uint64_t seed = flashkv::testing::test_seed();
  Model m = test::random_model(c, seed);
  const auto prompt = random_tokens(70, c.vocab_size, seed + 1);  // > 64: the prefill spans two key blocks
  const auto forced = random_tokens(40, c.vocab_size, seed + 2);
  const Reference fp32 = reference(m, prompt, forced, KVCacheSpec{}, 0);
  for (const char* fmt : {"bf16", "fp16"}) {
    Engine gpu(m, spec_of(fmt), 1, 0, on_cuda());
    expect_close(fp32, teacher_forced(gpu, prompt, forced), std::string("random 9/3x64, ") + fmt);
  }
  // Quantized device formats: the GPU's cache quantizes bf16 K/V, the CPU's float32 K/V, so codes can differ by one
  // step; the allowance is the format's own effect on the CPU (CPU format vs CPU fp32).
  for (const char* fmt : {"fp8_e4m3", "fp8_e4m3_dynamic", "int8", "int4", "int4_g32"}) {
    const Reference q = reference(m, prompt, forced, spec_of(fmt), 0);
    const Comparison quant = compare_logits(fp32.cpu, q.cpu);
    Engine gpu(m, spec_of(fmt), 1, 0, on_cuda());
    expect_close(q, teacher_forced(gpu, prompt, forced), std::string("random 9/3x64, ") + fmt, quant.max_kl,
                 quant.max_diff);
  }
}

/// Logits of the last token after feeding `toks` in two extend() chunks (split at `cut`) through the cache.
std::vector<float> chunked(Engine& e, const std::vector<int32_t>& toks, std::size_t cut) {
  const int32_t s = e.add_sequence();
  std::vector<float> l(static_cast<std::size_t>(e.model().config.vocab_size));
  e.extend(s, std::span<const int32_t>(toks).subspan(0, cut), {});
  e.extend(s, std::span<const int32_t>(toks).subspan(cut), l);
  EXPECT_EQ(e.length(s), static_cast<int32_t>(toks.size()));
  e.remove_sequence(s);
  return l;
}

TEST(CudaEngine, ChunkedExtendThroughTheDeviceCache) {
  ModelConfig c;
  c.dim = 256; c.hidden_dim = 192; c.n_layers = 2; c.num_heads = 4; c.num_heads_kv = 2; c.head_dim = 64;
  c.vocab_size = 300; c.seq_len = 200; c.shared_classifier = false;
  const uint64_t seed = flashkv::testing::test_seed() + 11;
  Model m = test::random_model(c, seed);
  const auto toks = random_tokens(90, c.vocab_size, seed);
  const Reference r = reference(m, toks, {0}, KVCacheSpec{}, 0);  // one row: the prefill's last logits
  // bf16: the chunks' queries read back the bf16 K/V the prefill attends to directly: the same function.
  Engine gpu(m, spec_of("bf16"), 1, 0, on_cuda());
  const Comparison same = compare_logits(teacher_forced(gpu, toks, {0}), {chunked(gpu, toks, 37)});
  std::printf("[engine-cuda] bf16 chunked extend vs prefill: %s\n", same.describe().c_str());
  EXPECT_LE(same.max_diff, kFactor * r.twin_vs_cpu.max_diff);
  EXPECT_EQ(same.decided_agree, same.decided);
  // int8: the history is read from the quantized pages, on both devices; the allowance is int8's own effect on the
  // CPU (CPU int8 chunks vs CPU float32 chunks) on top of the bf16 scale.
  Engine cpu8(m, spec_of("int8"), 1), cpu32(m, KVCacheSpec{}, 1), gpu8(m, spec_of("int8"), 1, 0, on_cuda());
  const std::vector<float> c8 = chunked(cpu8, toks, 37);
  const Comparison quant = compare_logits({chunked(cpu32, toks, 37)}, {c8});
  const Comparison g8 = compare_logits({c8}, {chunked(gpu8, toks, 37)});
  std::printf("[engine-cuda] int8 chunked extend, GPU vs CPU: %s (int8 vs fp32 on the CPU: %s)\n",
              g8.describe().c_str(), quant.describe().c_str());
  EXPECT_GT(quant.max_diff, 0.0);
  EXPECT_LE(g8.max_diff, kFactor * r.twin_vs_cpu.max_diff + quant.max_diff);
}

TEST(CudaEngine, SmolLM2MatchesCpuEngine) {
  FLASHKV_REQUIRE_SMOLLM2();
  LoadedModel lm = load_named_model("smollm2-135m");
  const std::vector<int32_t> prompt = lm.tokenizer->encode_prompt("The capital of France is");
  Engine cpu(lm.model, KVCacheSpec{}, 1, 256);
  Sampler greedy(SamplerConfig{});
  GenerateOptions go;
  go.steps = 48;
  go.ignore_stop_tokens = true;
  const GenerationResult want = generate(cpu, prompt, greedy, go);
  const Reference r = reference(lm.model, prompt, want.tokens, KVCacheSpec{}, 256);
  for (const char* fmt : {"bf16", "int8"}) {
    Engine gpu(lm.model, spec_of(fmt), 1, 256, on_cuda());
    double extra_kl = 0, extra_diff = 0;
    if (std::string(fmt) != "bf16") {
      Engine q(lm.model, spec_of(fmt), 1, 256);
      const Comparison quant = compare_logits(r.cpu, teacher_forced(q, prompt, want.tokens));
      extra_kl = quant.max_kl, extra_diff = quant.max_diff;
    }
    expect_close(r, teacher_forced(gpu, prompt, want.tokens), std::string("SmolLM2-135M, ") + fmt, extra_kl,
                 extra_diff);
  }
}

TEST(CudaEngine, UnsupportedSpecsAreTypedErrors) {
  ModelConfig c;
  c.dim = 128; c.hidden_dim = 64; c.n_layers = 1; c.num_heads = 2; c.num_heads_kv = 1; c.head_dim = 64;
  c.vocab_size = 50; c.seq_len = 64;
  Model m = test::random_model(c, 5);
  auto expect_unsupported = [&](const KVCacheSpec& s, const char* needle) {
    try {
      Engine e(m, s, 1, 0, on_cuda());
      ADD_FAILURE() << s.label() << ": expected UnsupportedError";
    } catch (const UnsupportedError& err) {
      EXPECT_NE(std::string(err.what()).find(needle), std::string::npos) << err.what();
    }
  };
  expect_unsupported(spec_of("fp32"), "bf16");
  expect_unsupported(spec_of("int2_kivi"), "KIVI");
  KVCacheSpec r = spec_of("int8");
  r.residual = 32;
  expect_unsupported(r, "residual");
  // head_dim 16 (the 260K model's) has no quantized device decode in the default build: named, not run on the CPU.
  ModelConfig c16 = c;
  c16.dim = 64; c16.num_heads = 4; c16.num_heads_kv = 4; c16.head_dim = 16;
  Model m16 = test::random_model(c16, 6);
  try {
    Engine e(m16, spec_of("int8"), 1, 0, on_cuda());
    ADD_FAILURE() << "int8 at head_dim 16: expected UnsupportedError";
  } catch (const UnsupportedError& err) {
    EXPECT_NE(std::string(err.what()).find("head_dim 16"), std::string::npos) << err.what();
  }
  EngineOptions bad = on_cuda();
  bad.device_index = 99;
  EXPECT_THROW(Engine(m, spec_of("bf16"), 1, 0, bad), Error);
}
