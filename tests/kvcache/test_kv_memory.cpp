// Memory accounting: a live cache's memory_report() equals kv_memory_estimate() (the `flashkv kv-mem` formula) field
// by field, and both equal hand-computed values from the formula in kvcache.hpp.
#include <gtest/gtest.h>

#include "kv_test_util.hpp"

using namespace flashkv;

namespace {
void expect_same(const KVMemoryReport& a, const KVMemoryReport& b, const std::string& what) {
  EXPECT_EQ(a.code_bytes, b.code_bytes) << what;
  EXPECT_EQ(a.metadata_bytes, b.metadata_bytes) << what;
  EXPECT_EQ(a.residual_bytes, b.residual_bytes) << what;
  EXPECT_EQ(a.slack_bytes, b.slack_bytes) << what;
  EXPECT_EQ(a.total_bytes, b.total_bytes) << what;
  EXPECT_EQ(a.pages_used, b.pages_used) << what;
  EXPECT_EQ(a.page_bytes, b.page_bytes) << what;
  EXPECT_EQ(a.num_tokens, b.num_tokens) << what;
  EXPECT_DOUBLE_EQ(a.bits_per_element, b.bits_per_element) << what;
}
}  // namespace

TEST(KVMemory, LiveCacheEqualsFormula) {
  struct C {
    const char* dtype;
    int32_t P, R, S;
    int64_t T;
  };
  const C cases[] = {{"bf16", 16, 0, 0, 100},        {"fp32", 32, 0, 0, 64},           {"fp8_e4m3", 16, 0, 0, 33},
                     {"fp8_e5m2_dynamic", 16, 4, 1, 50}, {"int8", 32, 0, 0, 31},        {"int4_g32", 16, 16, 4, 90},
                     {"int4_kivi", 32, 0, 0, 95},     {"int2_kivi", 64, 32, 2, 200},   {"k:int8,v:int2_kivi_g16", 16, 8, 0, 77},
                     {"int2_kivi", 32, 0, 0, 5}};
  for (const C& cs : cases) {
    const int32_t L = 2, H = 2, d = 64, B = 3;
    KVCacheConfig cfg = kvtest::make_config(cs.dtype, L, H, d, cs.P, cs.R, cs.S, 64);
    PagedKVCache c(cfg);
    auto g = kvtest::rng(31);
    std::vector<float> k = kvtest::randn(g, static_cast<size_t>(cs.T * H * d));
    for (int b = 0; b < B; ++b) {
      c.add_sequence(b);
      for (int32_t l = 0; l < L; ++l) c.append(b, l, kvtest::view3(k, cs.T, H, d), kvtest::view3(k, cs.T, H, d));
    }
    const KVMemoryReport live = c.memory_report(), est = kv_memory_estimate(cfg, B, cs.T);
    expect_same(live, est, cs.dtype);
    EXPECT_EQ(live.pages_total, 64);
    EXPECT_EQ(live.pages_free, 64 - live.pages_used);
    EXPECT_EQ(live.total_bytes, live.pages_used * live.page_bytes + live.residual_bytes);
    EXPECT_GE(live.slack_bytes, 0);
    // removing everything returns every page and byte
    for (int b = 0; b < B; ++b) c.remove_sequence(b);
    const KVMemoryReport empty = c.memory_report();
    EXPECT_EQ(empty.total_bytes, 0);
    EXPECT_EQ(empty.pages_free, 64);
    EXPECT_EQ(empty.bits_per_element, 0.0);
  }
}

TEST(KVMemory, HandComputedLlama3_8B) {
  // Llama-3-8B: 32 layers, 8 KV heads, head_dim 128 (HF config.json). 131072 tokens, page 16, no windows.
  KVCacheConfig cfg = kvtest::make_config("bf16", 32, 8, 128, 16, 0, 0, 1);
  const int64_t T = 131072;
  KVMemoryReport r = kv_memory_estimate(cfg, 1, T);
  EXPECT_EQ(r.total_bytes, 2LL * 32 * T * 8 * 128 * 2);  // 16 GiB
  EXPECT_EQ(r.total_bytes, 16LL << 30);
  EXPECT_DOUBLE_EQ(r.bits_per_element, 16.0);
  // int4 per (token, head): fp16 scale + min = 32 bits per 128 elements -> 4.25 bits
  cfg.with_kv_cache_dtype("int4");
  r = kv_memory_estimate(cfg, 1, T);
  EXPECT_EQ(r.code_bytes, 2LL * 32 * T * 8 * 64);
  EXPECT_EQ(r.metadata_bytes, 2LL * 32 * T * 8 * 4);
  EXPECT_EQ(r.slack_bytes, 0);
  EXPECT_DOUBLE_EQ(r.bits_per_element, 4.25);
  // int2 KIVI G=32 with a 128-token residual: 3 bits on the quantized part + bf16 ring of 128 + 31 tokens
  cfg.with_kv_cache_dtype("int2_kivi");
  cfg.page_size = 32;
  cfg.residual_tokens = 128;
  r = kv_memory_estimate(cfg, 1, T);
  const int64_t nq = (T - 128) / 32 * 32;
  EXPECT_EQ(r.code_bytes + r.metadata_bytes, 2LL * 32 * nq * 8 * 128 * 3 / 8);
  EXPECT_EQ(r.residual_bytes, 2LL * 32 * 8 * 128 * 2 * (128 + 31));
  // fp8 static: exactly 8 bits
  cfg = kvtest::make_config("fp8_e4m3", 32, 8, 128, 16, 0, 0, 1);
  EXPECT_DOUBLE_EQ(kv_memory_estimate(cfg, 4, T).bits_per_element, 8.0);
  // slack: 17 tokens with page 16 occupy 2 pages
  cfg = kvtest::make_config("int8", 1, 1, 128, 16, 0, 0, 1);
  r = kv_memory_estimate(cfg, 1, 17);
  EXPECT_EQ(r.pages_used, 2);
  EXPECT_EQ(r.slack_bytes, 15 * 2 * (128 + 4));
}
