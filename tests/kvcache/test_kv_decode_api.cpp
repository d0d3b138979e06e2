// The public decode API on the CPU (include/flashkv/decode.hpp): paged_decode over cache tensors against the float64
// reference (every dtype, paged and contiguous, append, GQA, softcap, window), its capacity and argument errors
// (nothing written), the non-finite contract (NaN / inf rows, masked keys exactly absent, NaN splits propagate), and
// plan_decode / run_decode over a PagedKVCache (one plan for every layer, stale plans rejected, the recorded path).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "flashkv/diagnostics.hpp"
#include "flashkv/error.hpp"
#include "kv_test_util.hpp"
#include "paged_decode_case.hpp"

using namespace flashkv;
using namespace flashkv::decodetest;

TEST(PagedDecodeCpu, MatchesReferenceEveryDtypeLayoutAndVariant) {
  HostMemory mem;
  for (DType t : {DType::float32, DType::bfloat16, DType::float16}) {
    for (int page : {16, 64, 0}) {
      DecodeCase c;
      c.dtype = t, c.page_size = page, c.max_pages = page == 0 ? 6 : 10, c.heads = 8, c.heads_kv = 2, c.head_dim = 64;
      check_decode(c, mem);
    }
  }
  DecodeCase c;
  c.head_dim = 32, c.seqlen_q = 4, c.heads = 6, c.heads_kv = 3, c.page_size = 16, c.max_pages = 12;  // generic tiles
  check_decode(c, mem);
  c.head_dim = 128, c.heads = 8, c.heads_kv = 1, c.softcap = 20.f, c.append = false;  // MQA, softcap
  check_decode(c, mem);
  c.softcap = 0, c.window = 37, c.append = true, c.seqlen_q = 3;  // sliding window
  check_decode(c, mem);
}

TEST(PagedDecodeCpu, PastCapacityIsACapacityErrorAndWritesNothing) {
  HostMemory mem;
  DecodeSetup s = check_capacity_error(mem);
  // a page id out of range is an argument error on the CPU (the device checks the ids it reads)
  static_cast<int32_t*>(const_cast<void*>(s.tv.data))[s.c.max_pages] = 100000;
  expect_error<Error>([&] { paged_decode(s.qv, s.kcv, s.vcv, &s.tv, s.sv, nullptr, nullptr, s.ov, &s.lv, {}); },
                      "page_table");
}

TEST(PagedDecodeCpu, TypedArgumentErrors) {
  HostMemory mem;
  DecodeCase c;
  c.batch = 2, c.heads = 4, c.heads_kv = 2, c.head_dim = 64, c.page_size = 16, c.max_pages = 4;
  std::mt19937_64 rng(flashkv::testing::test_seed());
  DecodeSetup s = make_setup(c, mem, rng);
  TensorView bad = s.kcv;
  bad.shape[1] = 24;  // page_size 24
  expect_error<Error>([&] { paged_decode(s.qv, bad, bad, &s.tv, s.sv, nullptr, nullptr, s.ov, nullptr, {}); }, "k_cache",
                      {"page_size"});
  expect_error<Error>([&] { paged_decode(s.qv, s.kcv, s.vcv, &s.tv, s.sv, &s.knv, nullptr, s.ov, nullptr, {}); }, "v_new");
  TensorView s64 = s.sv;
  s64.dtype = DType::float32;
  expect_error<TypeError>([&] { paged_decode(s.qv, s.kcv, s.vcv, &s.tv, s64, nullptr, nullptr, s.ov, nullptr, {}); },
                          "cache_seqlens");
  DecodeOptions o;
  o.num_splits = 2000;
  expect_error<Error>([&] { paged_decode(s.qv, s.kcv, s.vcv, &s.tv, s.sv, nullptr, nullptr, s.ov, nullptr, o); },
                      "options.num_splits");
  o = {};
  o.max_seqlen_k = -1;
  expect_error<Error>([&] { paged_decode(s.qv, s.kcv, s.vcv, &s.tv, s.sv, nullptr, nullptr, s.ov, nullptr, o); },
                      "options.max_seqlen_k");
  TensorView cuda_q = s.qv;
  cuda_q.device = Device::cuda;
  expect_error<TypeError>([&] { paged_decode(cuda_q, s.kcv, s.vcv, &s.tv, s.sv, nullptr, nullptr, s.ov, nullptr, {}); },
                          "k_cache");
}

TEST(PagedDecodeCpu, NonFiniteInputsFollowTheContract) {
  HostMemory mem;
  for (DType t : {DType::bfloat16, DType::float32}) check_non_finite(mem, t);
}

TEST(PagedDecodeCpu, EmptyRowsAndAllNegativeInfinityScores) {
  HostMemory mem;
  for (DType t : {DType::float32, DType::float16}) check_empty_rows(mem, t);
}

TEST(DecodePlan, OnePlanForEveryLayerAndStalePlansAreRejected) {
  for (const char* f : {"int4", "bf16", "k:int8,v:int2_kivi"}) {
    SCOPED_TRACE(f);
    PagedKVCache cache(kvtest::make_config(f, 3, 2, 64, 32, 0, 0, 64));
    auto g = kvtest::rng(600);
    const int64_t ids[] = {3, 4};
    const int32_t cu[] = {0, 1, 3};
    for (int64_t id : ids) cache.add_sequence(id);
    std::vector<float> k = kvtest::randn(g, 300 * 128), v = kvtest::randn(g, k.size());
    for (int32_t l = 0; l < 3; ++l) {
      cache.append(3, l, kvtest::view3(k, 300, 2, 64), kvtest::view3(v, 300, 2, 64));
      cache.append(4, l, kvtest::view3(k, 77, 2, 64), kvtest::view3(v, 77, 2, 64));
    }
    std::vector<float> q = kvtest::randn(g, 3 * 8 * 64), o1(q.size()), o2(q.size());
    DecodeOptions opt;
    opt.num_splits = 3;
    DecodePlan plan = plan_decode(cache, ids, cu, 8, 0, opt);
    EXPECT_TRUE(plan.valid());
    EXPECT_EQ(plan.num_splits(), 3);
    for (int32_t l = 0; l < 3; ++l) {
      run_decode(cache, plan, l, kvtest::view3(q, 3, 8, 64), kvtest::view3(o1, 3, 8, 64), nullptr);
      cache.attention(ids, cu, l, kvtest::view3(q, 3, 8, 64), kvtest::view3(o2, 3, 8, 64), nullptr, opt);
      EXPECT_EQ(std::memcmp(o1.data(), o2.data(), o1.size() * 4), 0) << "layer " << l;
    }
    EXPECT_NE(last_kernel_path().find("kv_decode cpu"), std::string::npos) << last_kernel_path();
    EXPECT_NE(last_kernel_path().find("splits3"), std::string::npos) << last_kernel_path();
    EXPECT_EQ(last_kernel_path(), plan.path());
    cache.append(4, 1, kvtest::view3(k, 1, 2, 64), kvtest::view3(v, 1, 2, 64));  // layer 1 grew: the plan is stale
    expect_error<Error>(
        [&] { run_decode(cache, plan, 1, kvtest::view3(q, 3, 8, 64), kvtest::view3(o1, 3, 8, 64), nullptr); }, "plan");
    run_decode(cache, plan, 2, kvtest::view3(q, 3, 8, 64), kvtest::view3(o1, 3, 8, 64), nullptr);  // layer 2 still fits
    expect_error<Error>(
        [&] { run_decode(cache, plan, 0, kvtest::view3(q, 3, 4, 64), kvtest::view3(o1, 3, 4, 64), nullptr); }, "q");
    expect_error<Error>([&] { (void)plan_decode(cache, ids, cu, 3, 0, opt); }, "num_heads");
    // the plan's query dtype: a float type, named when not; a host plan made for bf16 queries still runs any float
    DecodeOptions bad = opt;
    bad.q_dtype = DType::int32;
    expect_error<TypeError>([&] { (void)plan_decode(cache, ids, cu, 8, 0, bad); }, "options.q_dtype");
    DecodeOptions bf = opt;
    bf.q_dtype = DType::bfloat16;
    DecodePlan plan_bf = plan_decode(cache, ids, cu, 8, 2, bf);
    run_decode(cache, plan_bf, 2, kvtest::view3(q, 3, 8, 64), kvtest::view3(o1, 3, 8, 64), nullptr);
    cache.attention(ids, cu, 2, kvtest::view3(q, 3, 8, 64), kvtest::view3(o2, 3, 8, 64), nullptr, opt);
    EXPECT_EQ(std::memcmp(o1.data(), o2.data(), o1.size() * 4), 0);
  }
}

TEST(DecodePlan, PathNamesTheFusedOrGenericTilesAndTheFormats) {
  PagedKVCache cache(kvtest::make_config("k:int4_g32,v:fp16", 1, 1, 64, 16, 0, 0, 8));
  cache.add_sequence(0);
  auto g = kvtest::rng(601);
  std::vector<float> k = kvtest::randn(g, 40 * 64), q = kvtest::randn(g, 64), o(64);
  cache.append(0, 0, kvtest::view3(k, 40, 1, 64), kvtest::view3(k, 40, 1, 64));
  const int64_t ids[] = {0};
  const int32_t cu[] = {0, 1};
  cache.attention(ids, cu, 0, kvtest::view3(q, 1, 1, 64), kvtest::view3(o, 1, 1, 64), nullptr);
  const std::string p = last_kernel_path();
  const bool fused = std::getenv("FLASHKV_NO_FUSED_DECODE") == nullptr && p.find("fused-avx512") != std::string::npos;
  EXPECT_TRUE(fused || p.find("generic") != std::string::npos) << p;
  EXPECT_NE(p.find("k=int4_g32"), std::string::npos) << p;
  EXPECT_NE(p.find("v=fp16"), std::string::npos) << p;
}
