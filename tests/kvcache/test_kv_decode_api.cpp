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

namespace {
/// An Error of type E naming `arg` (empty: any) whose message contains every string of `parts`.
template <class E, class F>
void expect_error(F&& fn, const std::string& arg, std::initializer_list<const char*> parts = {}) {
  try {
    fn();
    ADD_FAILURE() << "accepted; expected an error on '" << arg << "'";
  } catch (const E& e) {
    if (!arg.empty()) {
      EXPECT_EQ(e.argument(), arg) << e.what();
    }
    for (const char* p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}
}  // namespace

TEST(PagedDecodeCpu, PastCapacityIsACapacityErrorAndWritesNothing) {
  // issue 10 item 1: cached 500 + 20 new tokens on a page table of 512 slots
  HostMemory mem;
  DecodeCase c;
  c.batch = 2, c.seqlen_q = 20, c.heads = 4, c.heads_kv = 2, c.head_dim = 64, c.page_size = 64, c.max_pages = 8;
  c.lens = {7, 500};
  std::mt19937_64 rng(flashkv::testing::test_seed());
  DecodeSetup s = make_setup(c, mem, rng);
  reset(s, mem);
  const std::vector<uint8_t> out_before(static_cast<uint8_t*>(s.dout), static_cast<uint8_t*>(s.dout) + s.q.bytes.size());
  for (int64_t promise : {0, 600, 500}) {
    DecodeOptions o;
    o.max_seqlen_k = promise;
    expect_error<CapacityError>(
        [&] { paged_decode(s.qv, s.kcv, s.vcv, &s.tv, s.sv, &s.knv, &s.vnv, s.ov, &s.lv, o); }, "",
        {promise ? "max_seqlen_k" : "500", "512", "nothing written"});
    EXPECT_EQ(std::memcmp(s.dkc, s.kc.bytes.data(), s.kc.bytes.size()), 0) << "k_cache modified";
    EXPECT_EQ(std::memcmp(s.dout, out_before.data(), out_before.size()), 0) << "out modified";
  }
  // without the append the same lengths fit
  paged_decode(s.qv, s.kcv, s.vcv, &s.tv, s.sv, nullptr, nullptr, s.ov, &s.lv, {});
  // a negative length and a page id out of range are argument errors
  s.lens = {-1, 3};
  std::memcpy(const_cast<void*>(s.sv.data), s.lens.data(), 8);
  expect_error<Error>([&] { paged_decode(s.qv, s.kcv, s.vcv, &s.tv, s.sv, nullptr, nullptr, s.ov, &s.lv, {}); },
                      "cache_seqlens");
  s.lens = {0, 3};
  std::memcpy(const_cast<void*>(s.sv.data), s.lens.data(), 8);
  static_cast<int32_t*>(const_cast<void*>(s.tv.data))[c.max_pages] = 100000;
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

namespace {
/// Classification of a value: 0 finite, 1 NaN, 2 +inf, 3 -inf.
int cls(double x) { return std::isnan(x) ? 1 : (std::isinf(x) ? (x > 0 ? 2 : 3) : 0); }
}  // namespace

TEST(PagedDecodeCpu, NonFiniteInputsFollowTheContract) {
  // /work notes nan-semantics: a NaN / +inf score of a visible key makes the row NaN (out and lse); a non-finite value
  // makes the output channels non-finite, lse unaffected; rows that do not see the bad key are bit-for-bit unchanged;
  // a split whose lse is NaN propagates (num_splits 7); page slots past the lengths never matter.
  HostMemory mem;
  DecodeCase c;
  c.batch = 2, c.seqlen_q = 4, c.heads = 4, c.heads_kv = 2, c.head_dim = 64, c.page_size = 16, c.max_pages = 16;
  c.lens = {100, 37};
  std::mt19937_64 rng(flashkv::testing::test_seed() + 5);
  DecodeSetup s = make_setup(c, mem, rng);
  const int H = c.heads, S = c.seqlen_q, D = c.head_dim, Hk = c.heads_kv;
  for (int splits : {1, 7}) {
    SCOPED_TRACE("num_splits " + std::to_string(splits));
    const Result clean = run_case(s, mem, splits, false);
    auto row = [&](const Result& r, int b, int i, int h) { return &r.out[((static_cast<size_t>(b) * S + i) * H + h) * D]; };
    auto lse = [&](const Result& r, int b, int i, int h) { return r.lse[(static_cast<size_t>(b) * H + h) * S + i]; };
    // (a) NaN in the key of the last appended token of sequence 0, kv head 1: with causal only query 3 sees it
    const size_t kidx = (static_cast<size_t>(0) * S + 3) * Hk * D + 1 * D + 5;
    Values kn_saved = s.kn;
    s.kn.set(kidx, std::numeric_limits<double>::quiet_NaN());
    mem.upload(const_cast<void*>(s.knv.data), s.kn.bytes.data(), s.kn.bytes.size());
    const Result r = run_case(s, mem, splits, false);
    for (int b = 0; b < 2; ++b)
      for (int i = 0; i < S; ++i)
        for (int h = 0; h < H; ++h) {
          const bool bad = b == 0 && i == 3 && h / (H / Hk) == 1;
          for (int e = 0; e < D; ++e) {
            if (bad) {
              ASSERT_TRUE(std::isnan(row(r, b, i, h)[e])) << b << " " << i << " " << h;
            } else {
              ASSERT_EQ(row(r, b, i, h)[e], row(clean, b, i, h)[e]) << b << " " << i << " " << h;
            }
          }
          EXPECT_EQ(cls(lse(r, b, i, h)), bad ? 1 : 0);
        }
    s.kn = kn_saved;
    mem.upload(const_cast<void*>(s.knv.data), s.kn.bytes.data(), s.kn.bytes.size());
    // (b) +inf in the value of token 2 of sequence 1, kv head 0, channel 7: queries 2, 3 see it; channel 7 becomes
    //     +inf (all p > 0), the other channels and lse are unchanged
    Values vn_saved = s.vn;
    s.vn.set((static_cast<size_t>(1) * S + 2) * Hk * D + 7, std::numeric_limits<double>::infinity());
    mem.upload(const_cast<void*>(s.vnv.data), s.vn.bytes.data(), s.vn.bytes.size());
    const Result rv = run_case(s, mem, splits, false);
    for (int i = 0; i < S; ++i)
      for (int h = 0; h < H; ++h) {
        const bool sees = i >= 2 && h / (H / Hk) == 0;
        for (int e = 0; e < D; ++e) {
          if (sees && e == 7) {
            EXPECT_EQ(cls(row(rv, 1, i, h)[e]), 2);
          } else {
            ASSERT_EQ(row(rv, 1, i, h)[e], row(clean, 1, i, h)[e]) << i << " " << h << " " << e;
          }
        }
        EXPECT_EQ(lse(rv, 1, i, h), lse(clean, 1, i, h));
      }
    s.vn = vn_saved;
    mem.upload(const_cast<void*>(s.vnv.data), s.vn.bytes.data(), s.vn.bytes.size());
    // (c) NaN in every cache slot past the lengths (and the unused pages): nothing changes
    std::vector<uint8_t> kpois = s.kc.bytes, vpois = s.vc.bytes;
    std::vector<bool> used(s.kc.size() / (Hk * D), false);
    for (int b = 0; b < 2; ++b)
      for (int j = 0; j < s.lens[b] + S; ++j) used[s.cache_index(b, j) / (Hk * D)] = true;
    for (size_t t = 0; t < used.size(); ++t) {
      if (used[t]) continue;
      std::memset(kpois.data() + t * Hk * D * 2, 0xFF, Hk * D * 2);
      std::memset(vpois.data() + t * Hk * D * 2, 0xFF, Hk * D * 2);
    }
    std::swap(s.kc.bytes, kpois);
    std::swap(s.vc.bytes, vpois);
    const Result rg = run_case(s, mem, splits, false);
    EXPECT_EQ(rg.out, clean.out);
    EXPECT_EQ(rg.lse, clean.lse);
    std::swap(s.kc.bytes, kpois);
    std::swap(s.vc.bytes, vpois);
    // (d) NaN in q of one head: that head's rows only
    Values q_saved = s.q;
    s.q.set(((static_cast<size_t>(1) * S + 0) * H + 2) * D + 3, std::numeric_limits<double>::quiet_NaN());
    mem.upload(const_cast<void*>(s.qv.data), s.q.bytes.data(), s.q.bytes.size());
    const Result rq = run_case(s, mem, splits, false);
    for (int b = 0; b < 2; ++b)
      for (int i = 0; i < S; ++i)
        for (int h = 0; h < H; ++h) {
          const bool bad = b == 1 && i == 0 && h == 2;
          EXPECT_EQ(cls(row(rq, b, i, h)[0]), bad ? 1 : 0);
          EXPECT_EQ(cls(lse(rq, b, i, h)), bad ? 1 : 0);
        }
    s.q = q_saved;
    mem.upload(const_cast<void*>(s.qv.data), s.q.bytes.data(), s.q.bytes.size());
  }
}

TEST(PagedDecodeCpu, EmptyRowsAndAllNegativeInfinityScores) {
  // A sequence with no cached and no new keys: out 0, lse −inf. A row whose visible scores are all −inf: NaN
  // (exp(−inf − (−inf)) is NaN, the IEEE definition; only "no visible key" is −inf).
  HostMemory mem;
  DecodeCase c;
  c.dtype = DType::float32, c.batch = 2, c.seqlen_q = 1, c.heads = 2, c.heads_kv = 1, c.head_dim = 64;
  c.page_size = 16, c.max_pages = 4, c.append = false;
  c.lens = {0, 20};
  std::mt19937_64 rng(flashkv::testing::test_seed() + 9);
  DecodeSetup s = make_setup(c, mem, rng);
  // sequence 1: every cached key has channel 0 > 0; head 1 of its query has q[0] = −inf: all its scores are −inf
  for (int j = 0; j < 20; ++j) s.kc.set(s.cache_index(1, j), 1.0 + j);
  s.q.set((static_cast<size_t>(1) * 2 + 1) * 64 + 0, -std::numeric_limits<double>::infinity());
  mem.upload(const_cast<void*>(s.qv.data), s.q.bytes.data(), s.q.bytes.size());
  for (int splits : {1, 3}) {
    const Result r = run_case(s, mem, splits, false);
    for (int h = 0; h < 2; ++h) {
      for (int e = 0; e < 64; ++e) EXPECT_EQ(r.out[static_cast<size_t>(h) * 64 + e], 0.0);
      EXPECT_TRUE(std::isinf(r.lse[h]) && r.lse[h] < 0);
    }
    EXPECT_TRUE(std::isnan(r.out[(2 + 1) * 64])) << "all −inf visible scores must give NaN";
    EXPECT_TRUE(std::isnan(r.lse[2 + 1]));
    EXPECT_TRUE(std::isfinite(r.out[2 * 64]) && std::isfinite(r.lse[2]));  // head 0 of sequence 1 is normal
  }
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
  EXPECT_NE(p.find("k=u4/token-group32"), std::string::npos) << p;
  EXPECT_NE(p.find("v=fp16"), std::string::npos) << p;
}
