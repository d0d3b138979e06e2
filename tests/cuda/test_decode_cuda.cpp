// CUDA decode (label gpu): flashkv::paged_decode over 16-bit cache tensors against the float64 reference (the shared
// cases of tests/kvcache/paged_decode_case.hpp: GQA, page sizes 16..256, contiguous, append, softcap, window, splits
// 1 / auto / 7), the capacity errors of issue 10 item 1 (nothing written or launched; a broken max_seqlen_k promise
// gives NaN for that sequence only), the non-finite contract (NaN splits propagate, masked keys exactly absent), and
// device-resident PagedKVCaches: filled on the device or on the host, copied between them, decoded on either, plans
// reused across layers, varlen (chunked prefill) queries, the recorded kernel path.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/decode_cuda.hpp"
#include "cuda_test_util.hpp"
#include "flashkv/diagnostics.hpp"
#include "flashkv/error.hpp"
#include "flashkv/kvcache.hpp"
#include "kvcache/paged_decode_case.hpp"

namespace flashkv::cudatest {
namespace {

using decodetest::check_decode;
using decodetest::DecodeCase;
using decodetest::expect_error;

struct CudaMemory final : decodetest::Memory {
  std::vector<void*> blocks;
  CudaMemory() { EXPECT_TRUE(cuda::decode_backend_registered()); }
  ~CudaMemory() override {
    for (void* p : blocks) cudaFree(p);
  }
  Device device() const override { return Device::cuda; }
  void* alloc(size_t bytes) override {
    void* p = nullptr;
    cuda_ok(cudaMalloc(&p, std::max<size_t>(bytes, 16)), "cudaMalloc");
    blocks.push_back(p);
    return p;
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    cuda_ok(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "upload");
    cuda_ok(cudaStreamSynchronize(nullptr), "upload");
  }
  void download(void* dst, const void* src, size_t bytes) override {
    cuda_ok(cudaDeviceSynchronize(), "kernel");
    cuda_ok(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "download");
  }
};

TEST(CudaDecode, PagedGqaVsReference) {
  CudaMemory mem;
  for (DType t : {DType::bfloat16, DType::float16}) {
    for (int page : {16, 64, 256}) {
      DecodeCase c;
      c.dtype = t, c.page_size = page, c.max_pages = page == 256 ? 6 : 24;
      check_decode(c, mem);
    }
  }
  EXPECT_NE(last_kernel_path().find("kv_decode cuda split-kv"), std::string::npos) << last_kernel_path();
}

TEST(CudaDecode, VariantsVsReference) {
  CudaMemory mem;
  DecodeCase c;
  c.head_dim = 64, c.seqlen_q = 4, c.heads = 8, c.heads_kv = 2;  // 16 packed rows per kv head
  check_decode(c, mem);
  c.seqlen_q = 3, c.heads = 12, c.heads_kv = 1, c.append = false, c.softcap = 20.f;  // MQA, 36 rows -> 3 tiles
  check_decode(c, mem);
  c.page_size = 0, c.append = true, c.softcap = 0, c.dtype = DType::float16;  // contiguous cache
  check_decode(c, mem);
  c.page_size = 16, c.max_pages = 40, c.window = 100, c.seqlen_q = 5, c.heads = 8, c.heads_kv = 4;  // sliding window
  check_decode(c, mem);
  c.window = 0;  // only the diagonal
  check_decode(c, mem);
  // head dims the kernel runs padded (the 64 / 128 instantiations: their last chunk columns zero-filled, never read),
  // one query per sequence (the mainloop without the non-finite guard) and four (causal: with it)
  for (int d : {40, 72}) {
    DecodeCase p;
    p.head_dim = d, p.heads = 8, p.heads_kv = 2, p.page_size = 16, p.max_pages = 24;
    check_decode(p, mem);
    p.seqlen_q = 4;
    check_decode(p, mem);
  }
}

TEST(CudaDecode, PastCapacityIsACapacityErrorBeforeAnythingIsWritten) {
  CudaMemory mem;
  decodetest::check_capacity_error(mem);
}

TEST(CudaDecode, BrokenMaxSeqlenPromiseGivesNaNForThatSequenceOnly) {
  // max_seqlen_k = 100 promised but sequence 1 holds 300 (within the capacity): no read-back, so the device sees the
  // broken promise: that sequence's out / lse are NaN and nothing is appended for it; sequence 0 is exact.
  CudaMemory mem;
  DecodeCase c;
  c.batch = 2, c.seqlen_q = 2, c.heads = 4, c.heads_kv = 2, c.head_dim = 64, c.page_size = 64, c.max_pages = 8;
  c.lens = {7, 300};
  std::mt19937_64 rng(flashkv::testing::test_seed() + 1);
  decodetest::DecodeSetup s = decodetest::make_setup(c, mem, rng);
  const decodetest::Result good = decodetest::run_case(s, mem, 1, false);
  for (int splits : {1, 5}) {
    const decodetest::Result r = decodetest::run_case(s, mem, splits, false, /*max_seqlen_k=*/100);
    const size_t per_seq = static_cast<size_t>(c.seqlen_q) * c.heads * c.head_dim;
    for (size_t i = 0; i < per_seq; ++i) {
      ASSERT_LE(std::fabs(r.out[i] - good.out[i]), 1e-2) << i;
      ASSERT_TRUE(std::isnan(r.out[per_seq + i])) << i;
    }
    for (int i = 0; i < c.heads * c.seqlen_q; ++i) {
      EXPECT_TRUE(std::isfinite(r.lse[static_cast<size_t>(i)]));
      EXPECT_TRUE(std::isnan(r.lse[static_cast<size_t>(c.heads * c.seqlen_q + i)]));
    }
    std::vector<uint8_t> kc(s.kc.bytes.size());
    mem.download(kc.data(), s.dkc, kc.size());
    const size_t row = static_cast<size_t>(c.heads_kv) * c.head_dim * 2;
    EXPECT_EQ(std::memcmp(kc.data() + s.cache_index(1, 300) * 2, s.kc.bytes.data() + s.cache_index(1, 300) * 2, row), 0)
        << "appended to a sequence that broke the promise";
    EXPECT_EQ(std::memcmp(kc.data() + s.cache_index(0, 7) * 2, s.kn.bytes.data(), row), 0) << "sequence 0 not appended";
  }
}

TEST(CudaDecode, NonFiniteInputsFollowTheContract) {
  CudaMemory mem;
  for (DType t : {DType::bfloat16, DType::float16}) decodetest::check_non_finite(mem, t);
}

TEST(CudaDecode, EmptyRowsAndAllNegativeInfinityScores) {
  CudaMemory mem;
  for (DType t : {DType::bfloat16, DType::float16}) decodetest::check_empty_rows(mem, t);
}

TEST(CudaDecode, TypedErrors) {
  CudaMemory mem;
  DecodeCase c;
  c.batch = 2, c.heads = 8, c.heads_kv = 2, c.head_dim = 64, c.page_size = 16, c.max_pages = 4;
  std::mt19937_64 rng(flashkv::testing::test_seed() + 2);
  decodetest::DecodeSetup s = decodetest::make_setup(c, mem, rng);
  TensorView bad = s.kcv;
  bad.shape[1] = 24;
  expect_error<Error>([&] { paged_decode(s.qv, bad, bad, &s.tv, s.sv, nullptr, nullptr, s.ov, nullptr, {}); }, "k_cache",
                      {"page_size"});
  TensorView qf = s.qv;
  qf.dtype = DType::float32;
  TensorView kf = s.kcv, vf = s.vcv, of = s.ov;
  kf.dtype = vf.dtype = of.dtype = DType::float32;
  expect_error<TypeError>([&] { paged_decode(qf, kf, vf, &s.tv, s.sv, nullptr, nullptr, of, nullptr, {}); }, "q");
  TensorView host_table = s.tv;
  host_table.device = Device::cpu;
  expect_error<TypeError>([&] { paged_decode(s.qv, s.kcv, s.vcv, &host_table, s.sv, nullptr, nullptr, s.ov, nullptr, {}); },
                          "page_table");
}

// ---- device-resident PagedKVCache --------------------------------------------------------------------------------
KVCacheConfig cache_config(const std::string& fmt, Device device, int64_t pages = 0) {
  KVCacheConfig c;
  c.num_layers = 2;
  c.num_heads_kv = 2;
  c.head_dim = 128;
  c.page_size = 32;
  c.with_kv_cache_dtype(fmt);
  c.capacity_pages = pages;
  c.device = device;
  return c;
}

TensorView kvtest_view(std::vector<float>& x, int64_t n) {
  return TensorView::contiguous(x.data(), DType::float32, {n, 2, 128});
}

std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> b(x.size());
  for (size_t i = 0; i < x.size(); ++i) b[i] = float_to_bf16(x[i]);
  return b;
}

/// q [total_q, 8, 128] bf16 on the device (and its host float copy), out / lse buffers, attention of `cache`.
struct DeviceQuery {
  std::vector<float> q;
  int64_t total_q;
  DevBuf dq, dout, dlse;
  DeviceQuery(std::mt19937_64& rng, int64_t total)
      : q(static_cast<size_t>(total) * 8 * 128), total_q(total), dq(q.size() * 2), dout(q.size() * 2),
        dlse(static_cast<size_t>(total) * 8 * 4) {
    std::normal_distribution<float> n01;
    for (float& x : q) x = bf16_to_float(float_to_bf16(n01(rng)));
    dq.upload(to_bf16(q));
  }
  TensorView qv() const { return dev_view(dq, DType::bfloat16, {total_q, 8, 128}); }
  TensorView ov() const { return dev_view(dout, DType::bfloat16, {total_q, 8, 128}); }
  TensorView lv() const { return dev_view(dlse, DType::float32, {8, total_q}); }
  std::vector<double> out() const { return decode(dout.download<uint16_t>(q.size()), DType::bfloat16); }
  std::vector<float> lse() const { return dlse.download<float>(static_cast<size_t>(total_q) * 8); }
};

/// The same attention on a host cache (float32 q = the bf16 values), as the oracle.
std::pair<std::vector<double>, std::vector<float>> host_attention(const PagedKVCache& host, std::span<const int64_t> ids,
                                                                  std::span<const int32_t> cu, int32_t layer,
                                                                  const std::vector<float>& q) {
  std::vector<float> qq = q, out(q.size()), lse(q.size() / 128);
  const int64_t total = static_cast<int64_t>(q.size() / (8 * 128));
  TensorView lv = TensorView::contiguous(lse.data(), DType::float32, {8, total});
  host.attention(ids, cu, layer, TensorView::contiguous(qq.data(), DType::float32, {total, 8, 128}),
                 TensorView::contiguous(out.data(), DType::float32, {total, 8, 128}), &lv);
  return {std::vector<double>(out.begin(), out.end()), lse};
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, const std::vector<float>& glse,
                  const std::vector<float>& wlse, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  double err = 0, lerr = 0;
  for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::fabs(got[i] - want[i]));
  for (size_t i = 0; i < glse.size(); ++i) {
    if (std::isinf(wlse[i])) {  // a row without visible keys: −inf on both
      EXPECT_TRUE(std::isinf(glse[i]) && glse[i] < 0) << what << ": lse " << glse[i] << " for an empty row";
    } else {
      const double d = std::fabs(glse[i] - wlse[i]);
      lerr = std::isnan(d) ? INFINITY : std::max(lerr, d);
    }
  }
  EXPECT_LE(err, 1.5e-2) << what << ": out vs the host cache";  // bf16 output rounding + bf16 P in the MMA
  EXPECT_LE(lerr, 2e-3) << what << ": lse vs the host cache";
}

TEST(CudaKVCache, FilledOnEitherDeviceDecodesOnTheOther) {
  std::mt19937_64 rng(flashkv::testing::test_seed() + 10);
  std::normal_distribution<float> n01;
  PagedKVCache dev(cache_config("bf16", Device::cuda)), host(cache_config("bf16", Device::cpu));
  EXPECT_EQ(dev.device(), Device::cuda);
  const int64_t ids[] = {1, 2, 3};
  for (PagedKVCache* c : {&dev, &host})
    for (int64_t id : ids) c->add_sequence(id);
  // sequence 1: host float32 appends (rounded to bf16 on the host, uploaded); 2 and 3: CUDA bf16 appends
  const int64_t lens[] = {300, 77, 1};
  for (int32_t layer = 0; layer < 2; ++layer) {
    for (int b = 0; b < 3; ++b) {
      std::vector<float> k(static_cast<size_t>(lens[b]) * 256), v(k.size());
      for (float& x : k) x = bf16_to_float(float_to_bf16(n01(rng)));
      for (float& x : v) x = bf16_to_float(float_to_bf16(n01(rng)));
      host.append(ids[b], layer, kvtest_view(k, lens[b]), kvtest_view(v, lens[b]));
      if (b == 0) {
        dev.append(ids[b], layer, kvtest_view(k, lens[b]), kvtest_view(v, lens[b]));
      } else {
        DevBuf dk(k.size() * 2), dv(v.size() * 2);
        dk.upload(to_bf16(k)), dv.upload(to_bf16(v));
        dev.append(ids[b], layer, dev_view(dk, DType::bfloat16, {lens[b], 2, 128}),
                   dev_view(dv, DType::bfloat16, {lens[b], 2, 128}));
      }
    }
  }
  EXPECT_EQ(dev.memory_report().pages_used, host.memory_report().pages_used);
  // the device pages hold exactly the host cache's bytes
  const PagedKVCache back = dev.to(Device::cpu);
  for (int64_t id : ids) {
    std::vector<float> a(static_cast<size_t>(back.seq_len(id, 1)) * 256), b(a.size()), c2(a.size()), d(a.size());
    const int64_t n = back.seq_len(id, 1);
    back.dequantize(id, 1, kvtest_view(a, n), kvtest_view(b, n));
    host.dequantize(id, 1, kvtest_view(c2, n), kvtest_view(d, n));
    EXPECT_EQ(a, c2) << id;
    EXPECT_EQ(b, d) << id;
  }
  // decode on the device (plan once, both layers; varlen: 1, 3 and 2 queries) vs the host cache
  const int32_t cu[] = {0, 1, 4, 6};
  DeviceQuery q(rng, 6);
  DecodePlan plan = plan_decode(dev, ids, cu, 8, 0);
  EXPECT_NE(plan.path().find("kv_decode cuda split-kv"), std::string::npos) << plan.path();
  for (int32_t layer = 0; layer < 2; ++layer) {
    run_decode(dev, plan, layer, q.qv(), q.ov(), nullptr);
    const auto [want, wlse] = host_attention(host, ids, cu, layer, q.q);
    const TensorView lv = q.lv();
    dev.attention(ids, cu, layer, q.qv(), q.ov(), &lv);
    expect_close(q.out(), want, q.lse(), wlse, "device cache");
  }
  // a host cache copied to the device decodes there the same way
  const PagedKVCache moved = host.to(Device::cuda);
  const auto [want, wlse] = host_attention(host, ids, cu, 1, q.q);
  const TensorView lv = q.lv();
  moved.attention(ids, cu, 1, q.qv(), q.ov(), &lv);
  expect_close(q.out(), want, q.lse(), wlse, "host cache copied to the device");
  EXPECT_NE(last_kernel_path().find("varlen"), std::string::npos) << last_kernel_path();
}

TEST(CudaKVCache, QuantizedDeviceCacheIsUnsupportedUntilIssue12AndCopiesBack) {
  std::mt19937_64 rng(flashkv::testing::test_seed() + 11);
  std::normal_distribution<float> n01;
  PagedKVCache host(cache_config("int4_kivi", Device::cpu));
  host.add_sequence(0);
  std::vector<float> k(100 * 256), v(k.size());
  for (float& x : k) x = n01(rng);
  for (float& x : v) x = n01(rng);
  host.append(0, 0, kvtest_view(k, 100), kvtest_view(v, 100));
  PagedKVCache dev = host.to(Device::cuda);
  dev.append(0, 0, kvtest_view(k, 5), kvtest_view(v, 5));  // host tensors: quantized on the host, uploaded
  host.append(0, 0, kvtest_view(k, 5), kvtest_view(v, 5));
  const int64_t ids[] = {0};
  const int32_t cu[] = {0, 1};
  DeviceQuery q(rng, 1);
  expect_error<UnsupportedError>([&] { dev.attention(ids, cu, 0, q.qv(), q.ov(), nullptr); }, "",
                                 {"int4_kivi", "#12"});
  const PagedKVCache back = dev.to(Device::cpu);
  std::vector<float> a(105 * 256), b(a.size()), c(a.size()), d(a.size());
  back.dequantize(0, 0, kvtest_view(a, 105), kvtest_view(b, 105));
  host.dequantize(0, 0, kvtest_view(c, 105), kvtest_view(d, 105));
  EXPECT_EQ(a, c);
  EXPECT_EQ(b, d);
}

TEST(CudaKVCache, AppendPastAFixedPoolIsACapacityErrorAndChangesNothing) {
  PagedKVCache dev(cache_config("bf16", Device::cuda, /*pages=*/2));
  dev.add_sequence(0);
  DevBuf dk(70 * 256 * 2);
  const TensorView k70 = dev_view(dk, DType::bfloat16, {70, 2, 128});
  expect_error<CapacityError>([&] { dev.append(0, 0, k70, k70); }, "", {"needs", "pages"});
  EXPECT_EQ(dev.seq_len(0, 0), 0);
  EXPECT_EQ(dev.free_pages(), 2);
  const TensorView k64 = dev_view(dk, DType::bfloat16, {64, 2, 128});
  dev.append(0, 0, k64, k64);
  EXPECT_EQ(dev.seq_len(0, 0), 64);
}

}  // namespace
}  // namespace flashkv::cudatest
