// Every error path of PagedKVCache, each checked to name its argument, and the cache left bit-identical (memory
// report + dequantized contents of every sequence and layer) after every rejected call.
#include <gtest/gtest.h>

#include <functional>

#include "kv_test_util.hpp"

using namespace flashkv;

namespace {

struct Fixture {
  PagedKVCache cache;
  std::vector<float> k, v;
  static constexpr int64_t H = 2, d = 32;
  Fixture() : cache(kvtest::make_config("k:int8,v:int4_kivi", 2, 2, 32, 32, 8, 2, 2)) {
    auto g = kvtest::rng(3);
    k = kvtest::randn(g, 200 * H * d);
    v = kvtest::randn(g, 200 * H * d);
    cache.add_sequence(5);
    cache.add_sequence(9);
    cache.append(5, 0, kvtest::view3(k, 40, H, d), kvtest::view3(v, 40, H, d));
    cache.append(5, 1, kvtest::view3(k, 7, H, d), kvtest::view3(v, 7, H, d));
    cache.append(9, 1, kvtest::view3(k, 77, H, d), kvtest::view3(v, 77, H, d));
  }
};

/// Runs fn, expects an Error (of type E) naming `arg` (empty: any), and the cache unchanged.
template <class E = Error>
void expect_rejected(Fixture& f, const std::string& arg, const std::function<void()>& fn, Status status) {
  const kvtest::Snapshot before = kvtest::snapshot(f.cache);
  try {
    fn();
    ADD_FAILURE() << "call accepted; expected error on '" << arg << "'";
  } catch (const E& e) {
    if (!arg.empty()) {
      EXPECT_EQ(e.argument(), arg) << e.what();
    }
    EXPECT_EQ(e.status(), status) << e.what();
    EXPECT_NE(std::string(e.what()).find("flashkv"), std::string::npos);
  }
  EXPECT_TRUE(kvtest::snapshot(f.cache) == before) << "cache modified by a rejected call (" << arg << ")";
}

}  // namespace

TEST(KVCacheErrors, SequenceErrors) {
  Fixture f;
  auto kv1 = [&] { return std::pair{kvtest::view3(f.k, 1, 2, 32), kvtest::view3(f.v, 1, 2, 32)}; };
  expect_rejected(f, "seq_id", [&] { f.cache.add_sequence(5); }, Status::invalid_argument);
  expect_rejected(f, "seq_id", [&] { f.cache.add_sequence(-1); }, Status::invalid_argument);
  expect_rejected(f, "seq_id", [&] { f.cache.remove_sequence(6); }, Status::invalid_argument);
  expect_rejected(f, "seq_id", [&] { (void)f.cache.seq_len(6); }, Status::invalid_argument);
  expect_rejected(f, "seq_id", [&] { auto [a, b] = kv1(); f.cache.append(77, 0, a, b); }, Status::invalid_argument);
  expect_rejected(f, "layer", [&] { auto [a, b] = kv1(); f.cache.append(5, 2, a, b); }, Status::invalid_argument);
  expect_rejected(f, "layer", [&] { auto [a, b] = kv1(); f.cache.append(5, -1, a, b); }, Status::invalid_argument);
  expect_rejected(f, "layer", [&] { (void)f.cache.seq_len(5, 3); }, Status::invalid_argument);
}

TEST(KVCacheErrors, AppendTensorErrors) {
  Fixture f;
  // wrong head count, head_dim, rank, token count mismatch
  expect_rejected(f, "k", [&] { f.cache.append(5, 0, kvtest::view3(f.k, 2, 1, 64), kvtest::view3(f.v, 2, 2, 32)); },
                  Status::invalid_argument);
  expect_rejected(f, "v", [&] { f.cache.append(5, 0, kvtest::view3(f.k, 2, 2, 32), kvtest::view3(f.v, 2, 2, 16)); },
                  Status::invalid_argument);
  expect_rejected(f, "v", [&] { f.cache.append(5, 0, kvtest::view3(f.k, 2, 2, 32), kvtest::view3(f.v, 3, 2, 32)); },
                  Status::invalid_argument);
  expect_rejected(f, "k", [&] {
    TensorView k2 = TensorView::contiguous(f.k.data(), DType::float32, {64, 32});
    f.cache.append(5, 0, k2, kvtest::view3(f.v, 2, 2, 32));
  }, Status::invalid_argument);
  // dtype errors
  expect_rejected<TypeError>(f, "k.dtype", [&] {
    TensorView k2 = TensorView::contiguous(f.k.data(), DType::float64, {1, 2, 32});
    f.cache.append(5, 0, k2, k2);
  }, Status::type_error);
  expect_rejected<TypeError>(f, "v", [&] {
    TensorView v2 = TensorView::contiguous(f.v.data(), DType::bfloat16, {1, 2, 32});
    f.cache.append(5, 0, kvtest::view3(f.k, 1, 2, 32), v2);
  }, Status::type_error);
  // non-contiguous last dim
  expect_rejected(f, "k", [&] {
    TensorView k2 = kvtest::view3(f.k, 2, 2, 16);
    k2.strides[2] = 2;
    f.cache.append(5, 0, k2, k2);
  }, Status::invalid_argument);
  // null data
  expect_rejected(f, "k", [&] {
    TensorView k2 = kvtest::view3(f.k, 2, 2, 32);
    k2.data = nullptr;
    f.cache.append(5, 0, k2, kvtest::view3(f.v, 2, 2, 32));
  }, Status::invalid_argument);
  // NaN / Inf / beyond fp16 range in the LAST token of a multi-token append: nothing of the append may land
  for (float bad : {std::nanf(""), INFINITY, 1e6f}) {
    std::vector<float> kk(f.k.begin(), f.k.begin() + 30 * 64);
    kk[29 * 64 + 63] = bad;
    expect_rejected(f, "k", [&] { f.cache.append(5, 0, kvtest::view3(kk, 30, 2, 32), kvtest::view3(f.v, 30, 2, 32)); },
                    Status::invalid_argument);
    expect_rejected(f, "v", [&] { f.cache.append(9, 1, kvtest::view3(f.k, 30, 2, 32), kvtest::view3(kk, 30, 2, 32)); },
                    Status::invalid_argument);
  }
}

TEST(KVCacheErrors, AppendPastCapacityIsTypedAndAtomic) {
  Fixture f;
  // pool of 2 pages (32 slots; KIVI quantizes whole groups of 32): seq 5 layer 0 holds 40 tokens = 2 sinks + 38 in the
  // ring (40 − 2 − 8 = 30 < 32: no page); seq 9 holds 2 pages (77 − 10 = 67 → 64 quantized). No page is free: an
  // append that needs a new page fails as a whole.
  EXPECT_EQ(f.cache.free_pages(), 0);
  expect_rejected<CapacityError>(f, "", [&] {
    f.cache.append(5, 0, kvtest::view3(f.k, 10, 2, 32), kvtest::view3(f.v, 10, 2, 32));
  }, Status::capacity);
  // an append that fits into existing pages still works afterwards
  f.cache.append(5, 0, kvtest::view3(f.k, 1, 2, 32), kvtest::view3(f.v, 1, 2, 32));
  EXPECT_EQ(f.cache.seq_len(5, 0), 41);
  // freeing a sequence makes room
  f.cache.remove_sequence(9);
  EXPECT_EQ(f.cache.free_pages(), 2);
  f.cache.append(5, 0, kvtest::view3(f.k, 40, 2, 32), kvtest::view3(f.v, 40, 2, 32));
  EXPECT_EQ(f.cache.seq_len(5, 0), 81);
}

TEST(KVCacheErrors, AttentionErrors) {
  Fixture f;
  const int64_t ids[] = {5, 9};
  const int32_t cu[] = {0, 1, 2};
  std::vector<float> q(2 * 4 * 32, 0.5f), out(2 * 4 * 32), lse(8);
  auto Q = [&](int64_t n, int64_t h, int64_t d) { return kvtest::view3(q, n, h, d); };
  auto O = [&](int64_t n, int64_t h, int64_t d) { return kvtest::view3(out, n, h, d); };
  std::span<const int64_t> sids(ids);
  std::span<const int32_t> scu(cu);
  expect_rejected(f, "layer", [&] { f.cache.attention(sids, scu, 2, Q(2, 4, 32), O(2, 4, 32), nullptr); },
                  Status::invalid_argument);
  expect_rejected(f, "cu_seqlens_q", [&] { f.cache.attention(sids, scu.first(2), 1, Q(2, 4, 32), O(2, 4, 32), nullptr); },
                  Status::invalid_argument);
  const int32_t cu_bad0[] = {1, 1, 2}, cu_dec[] = {0, 2, 1}, cu_sum[] = {0, 1, 3};
  expect_rejected(f, "cu_seqlens_q", [&] { f.cache.attention(sids, cu_bad0, 1, Q(2, 4, 32), O(2, 4, 32), nullptr); },
                  Status::invalid_argument);
  expect_rejected(f, "cu_seqlens_q", [&] { f.cache.attention(sids, cu_dec, 1, Q(2, 4, 32), O(2, 4, 32), nullptr); },
                  Status::invalid_argument);
  expect_rejected(f, "cu_seqlens_q", [&] { f.cache.attention(sids, cu_sum, 1, Q(2, 4, 32), O(2, 4, 32), nullptr); },
                  Status::invalid_argument);
  const int64_t ids_bad[] = {5, 6};
  expect_rejected(f, "seq_ids", [&] { f.cache.attention(ids_bad, scu, 1, Q(2, 4, 32), O(2, 4, 32), nullptr); },
                  Status::invalid_argument);
  expect_rejected(f, "q", [&] { f.cache.attention(sids, scu, 1, Q(2, 3, 32), O(2, 3, 32), nullptr); },
                  Status::invalid_argument);
  expect_rejected(f, "q", [&] { f.cache.attention(sids, scu, 1, Q(2, 4, 16), O(2, 4, 16), nullptr); },
                  Status::invalid_argument);
  expect_rejected(f, "out", [&] { f.cache.attention(sids, scu, 1, Q(2, 4, 32), O(2, 2, 32), nullptr); },
                  Status::invalid_argument);
  expect_rejected<TypeError>(f, "q.dtype", [&] {
    TensorView q2 = TensorView::contiguous(q.data(), DType::int32, {2, 4, 32});
    f.cache.attention(sids, scu, 1, q2, O(2, 4, 32), nullptr);
  }, Status::type_error);
  expect_rejected<TypeError>(f, "out", [&] {
    TensorView o2 = TensorView::contiguous(out.data(), DType::bfloat16, {2, 4, 32});
    f.cache.attention(sids, scu, 1, Q(2, 4, 32), o2, nullptr);
  }, Status::type_error);
  TensorView lbad = TensorView::contiguous(lse.data(), DType::float32, {4, 1});
  expect_rejected(f, "lse", [&] { f.cache.attention(sids, scu, 1, Q(2, 4, 32), O(2, 4, 32), &lbad); },
                  Status::invalid_argument);
  KVAttentionOptions o;
  o.softmax_scale = -1.0f;
  expect_rejected(f, "options.softmax_scale", [&] { f.cache.attention(sids, scu, 1, Q(2, 4, 32), O(2, 4, 32), nullptr, o); },
                  Status::invalid_argument);
  o = {};
  o.softmax_scale = std::nanf("");
  expect_rejected(f, "options.softmax_scale", [&] { f.cache.attention(sids, scu, 1, Q(2, 4, 32), O(2, 4, 32), nullptr, o); },
                  Status::invalid_argument);
  o = {};
  o.window_size_left = -2;
  expect_rejected(f, "options.window_size_left", [&] { f.cache.attention(sids, scu, 1, Q(2, 4, 32), O(2, 4, 32), nullptr, o); },
                  Status::invalid_argument);
  o = {};
  o.softcap = -1.0f;
  expect_rejected(f, "options.softcap", [&] { f.cache.attention(sids, scu, 1, Q(2, 4, 32), O(2, 4, 32), nullptr, o); },
                  Status::invalid_argument);
  o = {};
  o.num_splits = 5000;
  expect_rejected(f, "options.num_splits", [&] { f.cache.attention(sids, scu, 1, Q(2, 4, 32), O(2, 4, 32), nullptr, o); },
                  Status::invalid_argument);
  o = {};
  o.num_threads = -3;
  expect_rejected(f, "options.num_threads", [&] { f.cache.attention(sids, scu, 1, Q(2, 4, 32), O(2, 4, 32), nullptr, o); },
                  Status::invalid_argument);
}

TEST(KVCacheErrors, DequantizeErrors) {
  Fixture f;
  std::vector<float> a(40 * 64), b(40 * 64);
  expect_rejected(f, "k_out", [&] { f.cache.dequantize(5, 0, kvtest::view3(a, 39, 2, 32), kvtest::view3(b, 40, 2, 32)); },
                  Status::invalid_argument);
  expect_rejected(f, "v_out", [&] { f.cache.dequantize(5, 0, kvtest::view3(a, 40, 2, 32), kvtest::view3(b, 40, 1, 64)); },
                  Status::invalid_argument);
  expect_rejected(f, "seq_id", [&] { f.cache.dequantize(4, 0, kvtest::view3(a, 40, 2, 32), kvtest::view3(b, 40, 2, 32)); },
                  Status::invalid_argument);
}

TEST(KVCacheErrors, EmptyAppendAndEmptyQueryAreNoOps) {
  Fixture f;
  const kvtest::Snapshot before = kvtest::snapshot(f.cache);
  f.cache.append(5, 0, kvtest::view3(f.k, 0, 2, 32), kvtest::view3(f.v, 0, 2, 32));
  const int64_t ids[] = {5};
  const int32_t cu[] = {0, 0};
  std::vector<float> q(1);
  f.cache.attention(ids, cu, 0, kvtest::view3(q, 0, 2, 32), kvtest::view3(q, 0, 2, 32), nullptr);
  EXPECT_TRUE(kvtest::snapshot(f.cache) == before);
}
