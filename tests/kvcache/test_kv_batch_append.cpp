// PagedKVCache::append(seq_ids, layer, k, v), the batched append (flashkv/kvcache.hpp): the cache it leaves is byte for
// byte the one the per-sequence appends in seq_ids order leave (pools, windows, pages, lengths, free list), for every
// host format incl. windows, KIVI and rotation, over rounds that cross page boundaries; every error leaves the cache
// unchanged.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kv_bytes.hpp"
#include "kv_test_util.hpp"

using namespace flashkv;

namespace {

struct Case {
  const char* dtype;
  int32_t residual, sinks;
  bool rotate;
};

KVCacheConfig config_of(const Case& k, int64_t pages) {
  KVCacheConfig c = kvtest::make_config(k.dtype, 2, 2, 64, 16, k.residual, k.sinks, pages);
  c.rotation = k.rotate ? KVRotation::hadamard : KVRotation::none;
  c.rotation_seed = 3;
  return c;
}

TensorView view4(std::vector<float>& v, int64_t b, int64_t n, int64_t h, int64_t d) {
  return TensorView::contiguous(v.data(), DType::float32, {b, n, h, d});
}

}  // namespace

TEST(KVCacheBatchAppend, EqualsPerSequenceAppendsByteForByte) {
  const Case cases[] = {{"fp32", 0, 0, false},     {"bf16", 0, 0, false},    {"int8", 0, 0, false},
                        {"int4_g32", 0, 0, false}, {"fp8_e4m3", 0, 0, false}, {"int4_kivi_g16", 16, 0, false},
                        {"k:int8,v:int4", 8, 2, true}};
  auto g = kvtest::rng(71);
  const std::vector<int64_t> ids = {4, 0, 7, 2};  // not sorted: the batch order decides the page order
  for (const Case& k : cases) {
    PagedKVCache one(config_of(k, 64)), batched(config_of(k, 64));
    for (int64_t id : {0, 2, 4, 7}) one.add_sequence(id), batched.add_sequence(id);
    const int64_t H = 2, d = 64;
    for (int n : {5, 1, 1, 12, 3, 1, 17}) {  // rounds: every sequence grows by n in both layers
      for (int32_t layer = 0; layer < 2; ++layer) {
        std::vector<float> kk = kvtest::randn(g, ids.size() * n * H * d), vv = kvtest::randn(g, ids.size() * n * H * d);
        batched.append(ids, layer, view4(kk, static_cast<int64_t>(ids.size()), n, H, d),
                       view4(vv, static_cast<int64_t>(ids.size()), n, H, d));
        const size_t block = static_cast<size_t>(n * H * d);
        for (size_t b = 0; b < ids.size(); ++b) {
          std::vector<float> kb(kk.begin() + b * block, kk.begin() + (b + 1) * block);
          std::vector<float> vb(vv.begin() + b * block, vv.begin() + (b + 1) * block);
          one.append(ids[b], layer, kvtest::view3(kb, n, H, d), kvtest::view3(vb, n, H, d));
        }
      }
      const kvtest::CacheBytes a = kvtest::cache_bytes(one), b = kvtest::cache_bytes(batched);
      ASSERT_TRUE(a == b) << k.dtype << " after a round of " << n << ": " << a.diff(b);
    }
  }
}

TEST(KVCacheBatchAppend, ErrorsLeaveTheCacheUnchanged) {
  auto g = kvtest::rng(72);
  const int64_t H = 2, d = 64;
  for (const char* dtype : {"bf16", "int4"}) {
    PagedKVCache c(kvtest::make_config(dtype, 2, 2, 64, 16, 0, 0, /*pages=*/6));
    for (int64_t id : {0, 1, 2}) c.add_sequence(id);
    std::vector<float> kk = kvtest::randn(g, 3 * 20 * H * d), vv = kvtest::randn(g, 3 * 20 * H * d);
    const std::vector<int64_t> ids = {0, 1, 2};
    c.append(ids, 0, view4(kk, 3, 20, H, d), view4(vv, 3, 20, H, d));  // 2 pages each: the pool is full
    const kvtest::CacheBytes before = kvtest::cache_bytes(c);
    auto expect_unchanged = [&](const char* what) {
      const kvtest::CacheBytes now = kvtest::cache_bytes(c);
      EXPECT_TRUE(now == before) << dtype << ", " << what << ": " << now.diff(before);
    };
    // a repeated id, an unknown id, a batch that does not match
    const std::vector<int64_t> twice = {0, 1, 1}, unknown = {0, 9, 2}, two = {0, 1};
    EXPECT_THROW(c.append(twice, 1, view4(kk, 3, 20, H, d), view4(vv, 3, 20, H, d)), Error);
    expect_unchanged("repeated id");
    EXPECT_THROW(c.append(unknown, 1, view4(kk, 3, 20, H, d), view4(vv, 3, 20, H, d)), Error);
    expect_unchanged("unknown id");
    EXPECT_THROW(c.append(two, 1, view4(kk, 3, 20, H, d), view4(vv, 3, 20, H, d)), Error);
    expect_unchanged("batch != seq_ids.size()");
    // a non-finite value in the last block: nothing appended to the first two either
    std::vector<float> bad = kk;
    bad[static_cast<size_t>(2 * 20 * H * d + 5)] = NAN;
    try {
      c.append(ids, 1, view4(bad, 3, 20, H, d), view4(vv, 3, 20, H, d));
      ADD_FAILURE() << "NaN accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "k") << e.what();
    }
    expect_unchanged("NaN in block 2");
    // one more token each needs 3 pages, none is free: CapacityError before any block is written
    EXPECT_THROW(c.append(ids, 0, view4(kk, 3, 13, H, d), view4(vv, 3, 13, H, d)), CapacityError);
    expect_unchanged("pool full");
  }
}
