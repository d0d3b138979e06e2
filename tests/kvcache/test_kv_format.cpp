// kv_cache_dtype grammar, canonical names, per-format byte counts and KVCacheConfig validation.
#include <gtest/gtest.h>

#include <cstring>

#include "flashkv/kvcache.hpp"

using namespace flashkv;

TEST(KVFormat, ParsesVllmNamesAndAliases) {
  EXPECT_EQ(parse_kv_format("fp8").format, KVFormat::fp8_e4m3);
  EXPECT_FALSE(parse_kv_format("fp8_e4m3").dynamic_scale);
  EXPECT_TRUE(parse_kv_format("fp8_per_token_head").dynamic_scale);
  EXPECT_EQ(parse_kv_format("fp8_e5m2_dynamic").format, KVFormat::fp8_e5m2);
  EXPECT_EQ(parse_kv_format("auto").format, KVFormat::bf16);
  EXPECT_EQ(parse_kv_format("half").format, KVFormat::fp16);
  EXPECT_EQ(parse_kv_format("int8_per_token_head").format, KVFormat::int8);
  EXPECT_EQ(parse_kv_format("int4").group_size, 0);
  EXPECT_EQ(parse_kv_format("int4_g32").group_size, 32);
  EXPECT_EQ(parse_kv_format("int2_kivi_g64").format, KVFormat::int2_kivi);
  EXPECT_EQ(parse_kv_format("int2_kivi_g64").group_size, 64);
}

TEST(KVFormat, NamesRoundTrip) {
  for (const char* s : {"fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3_dynamic", "fp8_e5m2_dynamic", "int8",
                        "int8_g32", "int4", "int4_g64", "int4_kivi", "int2_kivi", "int4_kivi_g16", "int2_kivi_g128"}) {
    const KVFormatSpec f = parse_kv_format(s);
    EXPECT_EQ(f.name(), s);
    EXPECT_EQ(parse_kv_format(f.name()), f);
  }
}

TEST(KVFormat, ExplicitKVForm) {
  auto [k, v] = parse_kv_cache_dtype("k:int8,v:int4_g32");
  EXPECT_EQ(k.format, KVFormat::int8);
  EXPECT_EQ(v.format, KVFormat::int4);
  EXPECT_EQ(v.group_size, 32);
  auto [k2, v2] = parse_kv_cache_dtype("int2_kivi");
  EXPECT_EQ(k2, v2);
}

TEST(KVFormat, RejectsUnknownAndMalformed) {
  for (const char* s : {"", "int3", "fp8_e3m4", "int4_g", "int4_g3x", "int4_g48", "bf16_g32", "k:int8", "k:int8,v:",
                        "k:int8;v:int4", "INT8", "int8 ", "int2", "int2_kivi_g256", "k:int9,v:int4"}) {
    try {
      (void)parse_kv_cache_dtype(s);
      ADD_FAILURE() << "accepted '" << s << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "kv_cache_dtype") << s;
      EXPECT_NE(std::string(e.what()).find("int4_kivi"), std::string::npos) << "message lists the grammar: " << e.what();
      EXPECT_EQ(e.status(), Status::invalid_argument);
    }
  }
}

TEST(KVFormat, BytesPerFormat) {
  // head_dim 128, page 32
  auto b = [](const char* f, bool key) { return kv_format_bytes(parse_kv_format(f), key, 128, 32); };
  EXPECT_EQ(b("fp32", true).code_bytes_per_token_head, 512);
  EXPECT_EQ(b("bf16", true).code_bytes_per_token_head, 256);
  EXPECT_EQ(b("bf16", true).meta_bytes_per_page_head, 0);
  EXPECT_EQ(b("fp8_e4m3", true).code_bytes_per_token_head, 128);
  EXPECT_EQ(b("fp8_e4m3", true).meta_bytes_per_page_head, 0);
  EXPECT_EQ(b("fp8_e4m3_dynamic", true).meta_bytes_per_page_head, 32 * 4);
  EXPECT_EQ(b("int8", true).code_bytes_per_token_head, 128);
  EXPECT_EQ(b("int8", true).meta_bytes_per_group, 4);
  EXPECT_EQ(b("int4", false).code_bytes_per_token_head, 64);
  EXPECT_EQ(b("int4_g32", false).meta_bytes_per_group, 16);
  EXPECT_EQ(b("int4_g32", false).meta_bytes_per_page_head, 32 * 16);
  // KIVI K: per channel per 32 tokens fp16 scale + min = 128·4 B per group, 1 group per 32-token page
  EXPECT_EQ(b("int2_kivi", true).code_bytes_per_token_head, 32);
  EXPECT_EQ(b("int2_kivi", true).tokens_per_group, 32);
  EXPECT_EQ(b("int2_kivi", true).meta_bytes_per_page_head, 512);
  // KIVI V: per token, 4 groups of 32 channels
  EXPECT_EQ(b("int2_kivi", false).tokens_per_group, 1);
  EXPECT_EQ(b("int2_kivi", false).meta_bytes_per_group, 16);
  // int2 KIVI at G=32: (32 + 512/32 + 32 + 16) B per token-head pair of K and V = 96 B = 3 bits per element
  const auto k = b("int2_kivi", true), v = b("int2_kivi", false);
  const double bits = (k.code_bytes_per_token_head + v.code_bytes_per_token_head +
                       static_cast<double>(k.meta_bytes_per_group) / 32 + v.meta_bytes_per_group) * 8 / 256;
  EXPECT_DOUBLE_EQ(bits, 3.0);
}

namespace {
KVCacheConfig base() {
  KVCacheConfig c;
  c.num_layers = 2;
  c.num_heads_kv = 2;
  c.head_dim = 64;
  c.page_size = 32;
  c.capacity_pages = 4;
  return c;
}
void expect_config_error(const KVCacheConfig& c, const std::string& arg) {
  try {
    c.validate();
    ADD_FAILURE() << "accepted config, expected error on " << arg;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), arg) << e.what();
  }
  EXPECT_THROW(PagedKVCache{c}, Error);
}
}  // namespace

TEST(KVConfig, Validation) {
  EXPECT_NO_THROW(base().validate());
  KVCacheConfig c = base();
  c.num_layers = 0;
  expect_config_error(c, "num_layers");
  c = base();
  c.num_heads_kv = 0;
  expect_config_error(c, "num_heads_kv");
  c = base();
  c.head_dim = 300;
  expect_config_error(c, "head_dim");
  c = base();
  c.page_size = 24;
  expect_config_error(c, "page_size");
  c = base();
  c.page_size = 512;
  expect_config_error(c, "page_size");
  c = base();
  c.residual_tokens = -1;
  expect_config_error(c, "residual_tokens");
  c = base();
  c.sink_tokens = -2;
  expect_config_error(c, "sink_tokens");
  c = base();
  c.capacity_bytes = 1000;
  expect_config_error(c, "capacity_pages/capacity_bytes");
  c = base();
  c.capacity_pages = -1;
  expect_config_error(c, "capacity_pages");
  c = base();
  c.device_index = -1;
  expect_config_error(c, "device_index");
  // page size not a multiple of the KIVI group
  c = base();
  c.page_size = 32;
  c.with_kv_cache_dtype("int4_kivi_g64");
  expect_config_error(c, "page_size");
  c = base();
  c.with_kv_cache_dtype("k:bf16,v:int2_kivi_g64");
  expect_config_error(c, "page_size");
  // head_dim not divisible by the group
  c = base();
  c.head_dim = 96;
  c.with_kv_cache_dtype("int4_g64");
  expect_config_error(c, "head_dim");
  c = base();
  c.head_dim = 48;
  c.with_kv_cache_dtype("int2_kivi");
  expect_config_error(c, "head_dim");
  c = base();
  c.head_dim = 6;
  c.with_kv_cache_dtype("k:bf16,v:int2_kivi_g16");
  expect_config_error(c, "head_dim");
  // rotation needs a power-of-two head_dim
  c = base();
  c.head_dim = 96;
  c.with_kv_cache_dtype("int8");
  c.rotation = KVRotation::hadamard;
  expect_config_error(c, "head_dim");
  // fp8 static scales
  c = base();
  c.with_kv_cache_dtype("fp8");
  c.k_scales = {1.0f, 2.0f, 3.0f};
  expect_config_error(c, "k_scales");
  c.k_scales = {0.0f};
  expect_config_error(c, "k_scales");
  c = base();
  c.with_kv_cache_dtype("fp8");
  c.v_scales = {std::numeric_limits<float>::quiet_NaN()};
  expect_config_error(c, "v_scales");
  // capacity in bytes smaller than one page
  c = base();
  c.capacity_pages = 0;
  c.capacity_bytes = 10;
  EXPECT_NO_THROW(c.validate());
  try {
    PagedKVCache cache(c);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "capacity_bytes");
  }
}

TEST(KVConfig, CapacityBytesRoundsDownToPages) {
  KVCacheConfig c = base();
  c.with_kv_cache_dtype("int4");
  PagedKVCache probe(c);
  const int64_t pb = probe.page_bytes();
  c.capacity_pages = 0;
  c.capacity_bytes = 3 * pb + pb - 1;
  PagedKVCache cache(c);
  EXPECT_EQ(cache.free_pages(), 3);
  EXPECT_EQ(cache.memory_report().pool_bytes, 3 * pb);
}
