// Batched device appends (issue 14; label gpu): the K / V of several sequences written into a device PagedKVCache by
// one launch per layer must leave the cache byte for byte as the per-sequence appends in the same order do — code and
// metadata pools, page lists, lengths, free list (tests/kvcache/kv_bytes.hpp) — for the 16-bit copy and every
// quantize-on-write path (the vector kernel at head_dim 64 / 128, one thread per row at head_dim 80 and for a 16-bit
// half; the warp kernel at head_dim 96 in the float32 / strided test),
// over rounds that cross page boundaries and batch orders that are not sorted:
//   * the public batched PagedKVCache::append (one page-table upload, values checked inside the write launch: an Error
//     keeps every cached row, the lengths and the pages), also from float32 and strided device rows vs the CPU codec;
//   * the engine's step API (kvcache/api/cache_step.hpp: step_reserve, host tables uploaded once, step_append per layer
//     with the in-kernel value check, step_commit), also captured in a CUDA graph and replayed for later rounds;
//   * the in-kernel check: a non-finite value's flat index is reported for its half, its row is not encoded in packed
//     pages (the slot keeps the 0xFF fill) and every other row is written.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/float16.hpp"
#include "cuda_test_util.hpp"
#include "flashkv/error.hpp"
#include "flashkv/kvcache.hpp"
#include "kvcache/api/cache_step.hpp"
#include "kvcache/kv_bytes.hpp"

namespace flashkv::cudatest {
namespace {

struct StepCase {
  const char* fmt;
  int head_dim;
};
const StepCase kCases[] = {{"bf16", 64},          {"fp16", 128},      {"fp8_e4m3", 64},  {"fp8_e4m3_dynamic", 128},
                           {"int8", 128},         {"int4", 64},       {"int4_g32", 128}, {"k:int8,v:int4", 64},
                           {"k:bf16,v:int8", 64}, {"int8", 80},       {"fp8_e4m3", 80}};

KVCacheConfig config_of(const StepCase& c, int64_t pages) {
  KVCacheConfig k;
  k.num_layers = 2;
  k.num_heads_kv = 3;
  k.head_dim = c.head_dim;
  k.page_size = 16;
  k.capacity_pages = pages;
  k.with_kv_cache_dtype(c.fmt);
  if (std::string(c.fmt) == "fp8_e4m3") k.k_scales = {0.5f, 1.0f, 2.0f}, k.v_scales = {0.25f};  // static scales
  k.device = Device::cuda;
  return k;
}

/// The rows' dtype: the cache's own for a 16-bit cache, bf16 otherwise.
DType rows_dtype(const KVCacheConfig& c) {
  const bool sixteen = c.k_format == c.v_format && (c.k_format.format == KVFormat::bf16 || c.k_format.format == KVFormat::fp16);
  return sixteen && c.k_format.format == KVFormat::fp16 ? DType::float16 : DType::bfloat16;
}

/// n 16-bit values of `dt`, ~N(0, 1) + a per-channel offset (distinct group extremes).
std::vector<uint16_t> random16(std::mt19937_64& g, size_t n, int d, DType dt) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) {
    const float x = nd(g) + 0.05f * static_cast<float>(i % d);
    v[i] = dt == DType::float16 ? float_to_fp16(x) : float_to_bf16(x);
  }
  return v;
}

TensorView dev4(void* p, DType t, int64_t b, int64_t n, int64_t h, int64_t d) {
  return TensorView::contiguous(p, t, {b, n, h, d}, Device::cuda, 0);
}
TensorView dev3(void* p, DType t, int64_t n, int64_t h, int64_t d) {
  return TensorView::contiguous(p, t, {n, h, d}, Device::cuda, 0);
}

/// The engine's step on `c`: pages, one upload of the tables, one step_append per layer (flags checked), commit.
/// `graph`: capture the appends into a CUDA graph and replay it instead of launching them.
void step_append_all(PagedKVCache& c, const std::vector<int64_t>& ids, int n, const std::vector<DevBuf*>& k,
                     const std::vector<DevBuf*>& v, DType dt, bool graph, std::vector<unsigned long long>* flags) {
  const int64_t B = static_cast<int64_t>(ids.size()), H = c.config().num_heads_kv, d = c.config().head_dim;
  const int64_t stride = kv::step_reserve(c, ids, n) + 1;  // a wider stride than needed: rows are read by it
  std::vector<int32_t> host(static_cast<size_t>(2 * B + 1 + B * stride));
  kv::step_host_tables(c, ids, n, stride, host.data(), host.data() + B, host.data() + 2 * B + 1);
  DevBuf tables(host.size() * 4), bad(2 * 2 * sizeof(unsigned long long));
  tables.upload(host);
  cudaStream_t s = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  const auto* t = static_cast<const int32_t*>(tables.p);
  const kv::StepTables st{t, t + B, t + 2 * B + 1, stride};
  cuda_ok(cudaMemsetAsync(bad.p, 0xFF, bad.bytes, s), "reset flags");
  auto issue = [&] {
    for (int32_t l = 0; l < c.config().num_layers; ++l) {
      kv::StepRows r;
      r.k = k[static_cast<size_t>(l)]->p, r.v = v[static_cast<size_t>(l)]->p, r.dtype = dt;
      r.batch_stride = n * H * d, r.row_stride = H * d, r.head_stride = d;
      kv::step_append(c, st, B, n, l, r, static_cast<unsigned long long*>(bad.p) + 2 * l, s);
    }
  };
  if (graph) {
    cudaGraph_t gr = nullptr;
    cudaGraphExec_t ex = nullptr;
    cuda_ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture");
    issue();
    cuda_ok(cudaStreamEndCapture(s, &gr), "end capture");
    cuda_ok(cudaGraphInstantiate(&ex, gr, 0), "instantiate");
    cuda_ok(cudaGraphLaunch(ex, s), "launch");
    cuda_ok(cudaStreamSynchronize(s), "graph");
    cudaGraphExecDestroy(ex);
    cudaGraphDestroy(gr);
  } else {
    issue();
  }
  cuda_ok(cudaStreamSynchronize(s), "step");
  cudaStreamDestroy(s);
  kv::step_commit(c, ids, n);
  std::vector<unsigned long long> f = bad.download<unsigned long long>(4);
  if (flags != nullptr) {
    *flags = f;
  } else {
    for (unsigned long long x : f) EXPECT_EQ(x, ~0ull) << "a finite row was flagged";
  }
}

}  // namespace

TEST(CudaKVStep, BatchedAppendsEqualPerSequenceAppendsByteForByte) {
  std::mt19937_64 g(test_seed() + 14);
  const std::vector<int64_t> ids = {3, 0, 5, 1};  // the batch order decides the page order
  for (const StepCase& sc : kCases) {
    const KVCacheConfig cfg = config_of(sc, 80);
    PagedKVCache one(cfg), batched(cfg), stepped(cfg), graphed(cfg);
    for (PagedKVCache* c : {&one, &batched, &stepped, &graphed})
      for (int64_t id : {0, 1, 3, 5}) c->add_sequence(id);
    const DType dt = rows_dtype(cfg);
    const int64_t B = static_cast<int64_t>(ids.size()), H = cfg.num_heads_kv, d = cfg.head_dim;
    for (int n : {7, 1, 1, 9, 1, 16, 3, 1}) {  // page boundaries crossed at different steps per sequence
      std::vector<std::unique_ptr<DevBuf>> kb, vb;
      std::vector<DevBuf*> kp, vp;
      for (int32_t l = 0; l < 2; ++l) {
        kb.push_back(std::make_unique<DevBuf>(static_cast<size_t>(B * n * H * d) * 2));
        vb.push_back(std::make_unique<DevBuf>(static_cast<size_t>(B * n * H * d) * 2));
        kb.back()->upload(random16(g, static_cast<size_t>(B * n * H * d), static_cast<int>(d), dt));
        vb.back()->upload(random16(g, static_cast<size_t>(B * n * H * d), static_cast<int>(d), dt));
        kp.push_back(kb.back().get()), vp.push_back(vb.back().get());
        // per sequence, in batch order
        for (int64_t b = 0; b < B; ++b) {
          const size_t off = static_cast<size_t>(b * n * H * d) * 2;
          one.append(ids[static_cast<size_t>(b)], l, dev3(static_cast<char*>(kb.back()->p) + off, dt, n, H, d),
                     dev3(static_cast<char*>(vb.back()->p) + off, dt, n, H, d));
        }
        batched.append(ids, l, dev4(kb.back()->p, dt, B, n, H, d), dev4(vb.back()->p, dt, B, n, H, d));
      }
      step_append_all(stepped, ids, n, kp, vp, dt, /*graph=*/false, nullptr);
      step_append_all(graphed, ids, n, kp, vp, dt, /*graph=*/true, nullptr);
      const kvtest::CacheBytes want = kvtest::cache_bytes(one);
      const std::string what = std::string(sc.fmt) + " d" + std::to_string(d) + " after +" + std::to_string(n);
      const kvtest::CacheBytes b1 = kvtest::cache_bytes(batched), b2 = kvtest::cache_bytes(stepped),
                               b3 = kvtest::cache_bytes(graphed);
      ASSERT_TRUE(b1 == want) << what << ", PagedKVCache::append(seq_ids, ...): " << b1.diff(want);
      ASSERT_TRUE(b2 == want) << what << ", kv::step_append: " << b2.diff(want);
      ASSERT_TRUE(b3 == want) << what << ", kv::step_append in a CUDA graph: " << b3.diff(want);
    }
    std::printf("[kv-step] %-16s d%-3d: batched, step and graph-captured appends == per-sequence appends (bytes)\n",
                sc.fmt, sc.head_dim);
  }
}

TEST(CudaKVStep, InKernelCheckFlagsTheFirstBadValueAndSkipsOnlyItsRow) {
  for (const StepCase& sc : {StepCase{"int8", 64}, StepCase{"fp8_e4m3_dynamic", 128}, StepCase{"bf16", 64},
                             StepCase{"int8", 80}}) {
    const KVCacheConfig cfg = config_of(sc, 16);
    const DType dt = rows_dtype(cfg);
    PagedKVCache c(cfg), ref(cfg);
    const std::vector<int64_t> ids = {0, 1, 2};
    for (int64_t id : ids) c.add_sequence(id), ref.add_sequence(id);
    const int64_t B = 3, n = 2, H = cfg.num_heads_kv, d = cfg.head_dim;
    std::mt19937_64 g(test_seed() + 15);
    std::vector<uint16_t> kh = random16(g, static_cast<size_t>(B * n * H * d), static_cast<int>(d), dt);
    const std::vector<uint16_t> vh = random16(g, kh.size(), static_cast<int>(d), dt);
    // layer 1, K: sequence row 2, token 1, head 1: an inf at channel 9 and a NaN at channel 5 (the smaller index wins)
    const int64_t row = (2 * n + 1) * H + 1;
    const uint16_t inf = dt == DType::float16 ? 0x7c00 : 0x7f80, nan = dt == DType::float16 ? 0x7e00 : 0x7fc0;
    std::vector<uint16_t> kbad = kh;
    kbad[static_cast<size_t>(row * d + 9)] = inf;
    kbad[static_cast<size_t>(row * d + 5)] = nan;
    DevBuf k0(kh.size() * 2), k1(kh.size() * 2), v0(kh.size() * 2), v1(kh.size() * 2);
    k0.upload(kh), k1.upload(kbad), v0.upload(vh), v1.upload(vh);
    std::vector<unsigned long long> flags;
    step_append_all(c, ids, static_cast<int>(n), {&k0, &k1}, {&v0, &v1}, dt, false, &flags);
    EXPECT_EQ(flags[0], ~0ull);
    EXPECT_EQ(flags[1], ~0ull);
    EXPECT_EQ(flags[2], static_cast<unsigned long long>(row * d + 5)) << sc.fmt << " d" << d << ": layer 1, K";
    EXPECT_EQ(flags[3], ~0ull);
    // The reference: the same appends with the bad row's values replaced by finite ones, so every other row must
    // match it; in packed pages the flagged row must still hold the 0xFF fill.
    const bool packed = !(cfg.k_format.format == KVFormat::bf16 || cfg.k_format.format == KVFormat::fp16);
    std::vector<uint16_t> kfix = kbad;
    for (int64_t e = 0; e < d; ++e) kfix[static_cast<size_t>(row * d + e)] = kh[static_cast<size_t>(row * d + e)];
    DevBuf kf(kh.size() * 2);
    kf.upload(kfix);
    step_append_all(ref, ids, static_cast<int>(n), {&k0, &kf}, {&v0, &v1}, dt, false, nullptr);
    kvtest::CacheBytes got = kvtest::cache_bytes(c), want = kvtest::cache_bytes(ref);
    const PagedKVCache::Impl& m = kv::CacheAccess::impl(c);
    const int32_t page = m.seqs.at(2).pages[0];
    const int64_t code = m.geom.code_offset(page, 1, 0, 1, 1);  // layer 1, K, head 1, slot 1
    const int64_t cb = m.geom.code_bytes[0];
    for (int64_t i = 0; i < cb; ++i) {
      if (packed) {
        EXPECT_EQ(got.codes[static_cast<size_t>(code + i)], 0xFF) << sc.fmt << ": the bad row was encoded";
      }
      got.codes[static_cast<size_t>(code + i)] = want.codes[static_cast<size_t>(code + i)];
    }
    if (packed && m.geom.meta_bytes_per_page_head[0] > 0) {  // its metadata unit too
      const kv::KVHalfFormat& f = m.codec(0).format();
      const int64_t mo = m.geom.meta_offset(page, 1, 0, 1) + f.meta_offset(1);
      for (int64_t i = 0; i < f.meta_bytes_per_unit; ++i) {
        EXPECT_EQ(got.meta[static_cast<size_t>(mo + i)], 0xFF) << sc.fmt << ": the bad row's metadata was written";
        got.meta[static_cast<size_t>(mo + i)] = want.meta[static_cast<size_t>(mo + i)];
      }
    }
    EXPECT_TRUE(got == want) << sc.fmt << " d" << d << ": rows other than the flagged one differ: " << got.diff(want);
  }
}

/// The public batched append checks the values inside its one write launch: a bad value is an Error naming the half
/// and the value's [b, i, h, c], the lengths, pages, free list and every cached row stay as they were (the rejected
/// rows may sit in slots past the lengths: not readable, visible_cache_bytes leaves them out), and the next append
/// leaves the cache exactly as if the rejected one had never happened.
TEST(CudaKVStep, PublicBatchedAppendRejectsNonFiniteValuesAndKeepsEveryCachedRow) {
  for (const StepCase& sc : {StepCase{"int4", 64}, StepCase{"bf16", 64}, StepCase{"fp8_e4m3_dynamic", 128},
                             StepCase{"int8", 128}, StepCase{"int8", 80}}) {
    const KVCacheConfig cfg = config_of(sc, 16);
    const DType dt = rows_dtype(cfg);
    PagedKVCache c(cfg), ref(cfg);
    const std::vector<int64_t> ids = {0, 1};
    for (int64_t id : ids) c.add_sequence(id), ref.add_sequence(id);
    std::mt19937_64 g(test_seed() + 16);
    const int64_t B = 2, n = 3, H = cfg.num_heads_kv, d = cfg.head_dim;
    std::vector<uint16_t> kh = random16(g, static_cast<size_t>(B * n * H * d), static_cast<int>(d), dt);
    const std::vector<uint16_t> kh2 = random16(g, kh.size(), static_cast<int>(d), dt);
    DevBuf k(kh.size() * 2), v(kh.size() * 2), k2(kh.size() * 2);
    k.upload(kh), v.upload(kh), k2.upload(kh2);
    const TensorView k4 = dev4(k.p, dt, B, n, H, d), v4 = dev4(v.p, dt, B, n, H, d), k24 = dev4(k2.p, dt, B, n, H, d);
    c.append(ids, 0, k4, v4), ref.append(ids, 0, k4, v4);
    const kvtest::CacheBytes before = kvtest::visible_cache_bytes(c);
    std::vector<uint16_t> bad = kh;
    bad[static_cast<size_t>((1 * n + 2) * H * d + 7)] = dt == DType::float16 ? 0x7c00 : 0x7f80;  // +inf: [1, 2, 0, 7]
    DevBuf vb(bad.size() * 2);
    vb.upload(bad);
    try {
      c.append(ids, 0, k4, dev4(vb.p, dt, B, n, H, d));
      ADD_FAILURE() << sc.fmt << ": inf accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "v") << e.what();
      EXPECT_NE(std::string(e.what()).find("[1, 2, 0, 7]"), std::string::npos) << e.what();
    }
    const kvtest::CacheBytes after = kvtest::visible_cache_bytes(c);
    EXPECT_TRUE(after == before) << sc.fmt << ": the rejected append changed the cache: " << after.diff(before);
    {  // the pages it had taken are back in the free list, refilled with 0xFF
      const PagedKVCache::Impl& m = kv::CacheAccess::impl(c);
      const kvtest::CacheBytes raw = kvtest::cache_bytes(c);
      for (int32_t page : m.free_list) {
        const int64_t pcb = m.geom.page_code_bytes(), off = page * pcb;
        for (int64_t j = 0; j < pcb; ++j) {
          ASSERT_EQ(raw.codes[static_cast<size_t>(off + j)], 0xFF) << sc.fmt << ": free page " << page << " byte " << j;
        }
      }
    }
    c.append(ids, 0, k24, v4), ref.append(ids, 0, k24, v4);
    const kvtest::CacheBytes got = kvtest::visible_cache_bytes(c), want = kvtest::visible_cache_bytes(ref);
    EXPECT_TRUE(got == want) << sc.fmt << ": the append after a rejected one differs: " << got.diff(want);
  }
}

/// float32 device rows (the vector kernel's float4 loads) and rows whose strides rule out 16-byte loads (the general
/// kernels) give the CPU codec's codes, metadata and 16-bit copies byte for byte: the same appends into a host cache.
TEST(CudaKVStep, Float32AndStridedDeviceRowsEqualTheCpuCodec) {
  for (const StepCase& sc : {StepCase{"int4", 128}, StepCase{"int4_g32", 64}, StepCase{"int8", 64},
                             StepCase{"fp8_e4m3_dynamic", 128}, StepCase{"fp8_e4m3", 64}, StepCase{"bf16", 128},
                             StepCase{"int8", 96}, StepCase{"fp8_e4m3_dynamic", 96}}) {
    KVCacheConfig dcfg = config_of(sc, 16), hcfg = dcfg;
    hcfg.device = Device::cpu;
    const bool sixteen = std::string(sc.fmt) == "bf16";
    for (int layout = 0; layout < 2; ++layout) {  // 0: float32 contiguous (16-bit caches: skipped), 1: bf16, padded rows
      if (layout == 0 && sixteen) continue;
      PagedKVCache dev(dcfg), host(hcfg);
      dev.add_sequence(0), host.add_sequence(0);
      std::mt19937_64 g(test_seed() + 17 + static_cast<uint64_t>(layout));
      const int64_t n = 37, H = dcfg.num_heads_kv, d = dcfg.head_dim, pad = layout == 1 ? 4 : 0;
      const int64_t row = H * d + pad;  // elements between tokens
      std::normal_distribution<float> nd(0.f, 1.f);
      std::vector<float> kf(static_cast<size_t>(n * row)), vf(kf.size());
      for (size_t i = 0; i < kf.size(); ++i) {
        // bf16-representable values, so that the host (float32) and device (bf16) rows are the same numbers
        kf[i] = bf16_to_float(float_to_bf16(nd(g) + 0.03f * static_cast<float>(i % d)));
        vf[i] = bf16_to_float(float_to_bf16(nd(g)));
      }
      std::vector<float> kc, vc;  // the logical [n, H, d] rows for the host cache
      for (int64_t t = 0; t < n; ++t)
        for (int64_t e = 0; e < H * d; ++e) kc.push_back(kf[static_cast<size_t>(t * row + e)]), vc.push_back(vf[static_cast<size_t>(t * row + e)]);
      host.append(0, 0, TensorView::contiguous(kc.data(), DType::float32, {n, H, d}),
                  TensorView::contiguous(vc.data(), DType::float32, {n, H, d}));
      const DType dt = layout == 0 ? DType::float32 : DType::bfloat16;
      const size_t es = layout == 0 ? 4 : 2;
      DevBuf dk(kf.size() * es), dv(vf.size() * es);
      if (layout == 0) {
        dk.upload(kf), dv.upload(vf);
      } else {
        std::vector<uint16_t> kb(kf.size()), vb(vf.size());
        for (size_t i = 0; i < kf.size(); ++i) kb[i] = float_to_bf16(kf[i]), vb[i] = float_to_bf16(vf[i]);
        dk.upload(kb), dv.upload(vb);
      }
      TensorView kt = dev3(dk.p, dt, n, H, d), vt = dev3(dv.p, dt, n, H, d);
      kt.strides[0] = row, vt.strides[0] = row;
      dev.append(0, 0, kt, vt);
      const kvtest::CacheBytes got = kvtest::visible_cache_bytes(dev), want = kvtest::visible_cache_bytes(host);
      EXPECT_TRUE(got == want) << sc.fmt << (layout == 0 ? " float32 rows" : " bf16 rows, row stride H d + 4") << ": "
                               << got.diff(want);
    }
  }
}

}  // namespace flashkv::cudatest
