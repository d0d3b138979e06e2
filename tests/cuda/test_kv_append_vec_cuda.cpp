// The vector quantize-on-write append (src/cuda/decode_append_quant_vec.cu; label gpu) against the CPU codec, byte
// for byte (codes and metadata of every cached token, tests/kvcache/kv_bytes.hpp): every lane layout it instantiates
// (16 / 32 channels per lane at head_dim 16 .. 256, 1 .. 8 lanes per row; which one ran is asserted), float32 / bf16 / fp16 rows, a kv-head count
// and chunk lengths that are not powers of two (its multiply-high row split), batched appends crossing pages, and
// rows chosen to break a careless encoder: constant rows (zero scale), ±0 extremes of either sign first (the only
// ties whose bits differ), all-zero rows, repeated extremes, magnitudes near the fp16 limit, tiny values (subnormal fp16 scales), static fp8 scales
// that saturate; page sizes 16 .. 256. The in-kernel value check: the smallest bad element of a row is named, the first
// value past each limit is refused and the limit itself is encoded as the CPU encodes it.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/float16.hpp"
#include "cuda/decode_append.hpp"
#include "cuda_test_util.hpp"
#include "flashkv/error.hpp"
#include "flashkv/kvcache.hpp"
#include "kvcache/kv_bytes.hpp"
#include "kvcache/paged_decode_case.hpp"

namespace flashkv::cudatest {
namespace {

using decodetest::expect_error;

constexpr int kHeads = 3;  // not a power of two: the row -> (token, head) split is a real division

KVCacheConfig append_config(const std::string& fmt, int d, Device dev, int32_t page_size = 16) {
  KVCacheConfig k;
  k.num_layers = 1;
  k.num_heads_kv = kHeads;
  k.head_dim = d;
  k.page_size = page_size;
  k.with_kv_cache_dtype(fmt);
  if (fmt == "fp8_e4m3" || fmt == "fp8_e5m2") {  // static scales; the large rows saturate
    k.k_scales = {0.0125f, 0.5f, 3.0f};
    k.v_scales = {0.02f, 1.0f, 0.25f};
  }
  k.device = dev;
  return k;
}

float round_to(float x, DType t) {
  if (t == DType::float32) return x;
  return t == DType::bfloat16 ? bf16_to_float(float_to_bf16(x)) : fp16_to_float(float_to_fp16(x));
}

/// One token-head row of d values, of pattern `kind` (see the file comment), representable in t.
void fill_row(std::mt19937_64& g, int kind, int d, DType t, float* x) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> coin(0, 1);
  for (int c = 0; c < d; ++c) {
    float v = 0.f;
    switch (kind) {
      case 0: v = nd(g) + 0.25f * static_cast<float>((c * 7) % 5 - 2); break;
      case 1: v = 1.375f; break;                                              // constant: scale 0
      case 2: v = c % 3 == 0 ? (coin(g) ? -0.f : 0.f) : std::fabs(nd(g)); break;  // ±0 minima, either sign first
      case 3: v = coin(g) ? -0.f : 0.f; break;                                // only zeros
      case 4: v = std::fmax(-60000.f, std::fmin(60000.f, 2e4f * nd(g))); break;  // near the fp16 limit
      case 5: v = 1e-6f * nd(g); break;                                       // subnormal fp16 scales
      default: v = c % 5 == 0 ? -3.5f : (c % 5 == 1 ? 2.25f : nd(g)); break;  // repeated extremes in every group
    }
    x[c] = round_to(v, t);
  }
}

void upload_as(DevBuf& b, const std::vector<float>& x, DType t) {
  if (t == DType::float32) {
    b.upload(x);
    return;
  }
  std::vector<uint16_t> bits(x.size());
  for (size_t i = 0; i < x.size(); ++i) bits[i] = t == DType::bfloat16 ? float_to_bf16(x[i]) : float_to_fp16(x[i]);
  b.upload(bits);
}

const char* rows_name(DType t) { return t == DType::float32 ? "float32" : t == DType::bfloat16 ? "bf16" : "fp16"; }

}  // namespace

TEST(CudaKVAppend, VectorKernelEqualsTheCpuCodecAtEveryLaneWidth) {
  const uint64_t seed = flashkv::testing::test_seed() + 41;
  std::mt19937_64 g(seed);
  const char* const formats[] = {"fp8_e4m3", "fp8_e5m2", "fp8_e4m3_dynamic", "fp8_e5m2_dynamic", "int8", "int4",
                                 "int4_g32", "int8_g32", "int8_g64", "k:int8,v:int4_g32", "k:fp8_e4m3_dynamic,v:int4"};
  const std::vector<int64_t> ids = {7, 2, 4};  // batched appends in a non-sorted order
  const int64_t B = static_cast<int64_t>(ids.size());
  int cases = 0;
  std::set<std::string> kernels;
  const int32_t page_sizes[] = {16, 32, 64, 128, 256};  // the slot / page split by shifts at every page size
  for (int d : {16, 32, 64, 128, 256})
    for (const char* fmt : formats)
      for (DType t : {DType::bfloat16, DType::float16, DType::float32}) {
        KVCacheConfig dcfg, hcfg;
        const int32_t page = page_sizes[cases % 5];
        try {
          dcfg = append_config(fmt, d, Device::cuda, page), hcfg = append_config(fmt, d, Device::cpu, page);
          PagedKVCache probe(hcfg);
        } catch (const Error&) {
          continue;  // a group wider than head_dim
        }
        SCOPED_TRACE(std::string(fmt) + " d" + std::to_string(d) + " " + rows_name(t) + " page" + std::to_string(page));
        PagedKVCache dev(dcfg), host(hcfg);
        for (int64_t id : ids) dev.add_sequence(id), host.add_sequence(id);
        int kind = 0;
        for (int n : {21, 1, 1, 9, 3}) {  // chunk lengths: a prefill, decode steps, page crossings
          const size_t per_seq = static_cast<size_t>(n) * kHeads * d;
          std::vector<float> k(B * per_seq), v(B * per_seq);
          for (size_t r = 0; r < k.size() / d; ++r) {
            fill_row(g, kind % 7, d, t, k.data() + r * d);
            fill_row(g, (kind + 3) % 7, d, t, v.data() + r * d);
            ++kind;
          }
          for (int64_t b = 0; b < B; ++b)
            host.append(ids[static_cast<size_t>(b)], 0, TensorView::contiguous(k.data() + b * per_seq, DType::float32, {n, kHeads, d}),
                        TensorView::contiguous(v.data() + b * per_seq, DType::float32, {n, kHeads, d}));
          const size_t es = t == DType::float32 ? 4 : 2;
          DevBuf dk(k.size() * es), dv(v.size() * es);
          upload_as(dk, k, t), upload_as(dv, v, t);
          dev.append(ids, 0, TensorView::contiguous(dk.p, t, {B, n, kHeads, d}, Device::cuda, 0),
                     TensorView::contiguous(dv.p, t, {B, n, kHeads, d}, Device::cuda, 0));
        }
        // the vector kernel took it, except where no lane layout fits (int4 at head_dim 16: 8-channel nibble rows)
        const std::string kernel = cuda::quant_append_last_kernel();
        const bool int4_16 = d == 16 && std::string(fmt).find("int4") != std::string::npos;
        EXPECT_EQ(kernel.rfind("vector", 0) == 0, !int4_16) << kernel;
        kernels.insert(kernel);
        const kvtest::CacheBytes got = kvtest::visible_cache_bytes(dev), want = kvtest::visible_cache_bytes(host);
        EXPECT_TRUE(got == want) << got.diff(want) << " (seed " << seed << ")";
        ++cases;
      }
  std::string seen;
  for (const std::string& k : kernels) seen += " [" + k + "]";
  std::printf("[append-vec] %d format x head_dim x dtype cases, seed %llu, kernels%s\n", cases,
              static_cast<unsigned long long>(seed), seen.c_str());
  EXPECT_GE(cases, 120);
  for (const char* k : {"vector C32 L1", "vector C32 L2", "vector C32 L4", "vector C32 L8", "vector C16 L1", "vector C16 L2"})
    EXPECT_EQ(kernels.count(k), 1u) << k << " never ran;" << seen;
}

TEST(CudaKVAppend, VectorKernelValueCheckNamesTheSmallestBadElement) {
  std::mt19937_64 g(flashkv::testing::test_seed() + 43);
  const float bf16_max = bf16_to_float(0x7f7f), bf16_past = bf16_to_float(0x4780);  // 3.39e38; 65536
  const float f32_past = std::nextafter(65504.f, 1e9f);                             // the first float32 above 65504
  for (int d : {64, 256})
    for (DType t : {DType::bfloat16, DType::float16, DType::float32})
      for (const char* fmt : {"int8", "int4_g32", "fp8_e4m3_dynamic"}) {
        SCOPED_TRACE(std::string(fmt) + " d" + std::to_string(d) + " " + rows_name(t));
        const bool fp16_meta = std::string(fmt).rfind("int", 0) == 0;
        PagedKVCache dev(append_config(fmt, d, Device::cuda)), host(append_config(fmt, d, Device::cpu));
        dev.add_sequence(0), host.add_sequence(0);
        const int n = 11;
        std::vector<float> k(static_cast<size_t>(n) * kHeads * d), v(k.size());
        for (size_t r = 0; r < k.size() / d; ++r) fill_row(g, 0, d, t, k.data() + r * d), fill_row(g, 0, d, t, v.data() + r * d);
        // at the limits, accepted and encoded as on the CPU: fp16's largest finite value where the half stores fp16
        // metadata (bf16 rows: 65280, the largest bf16 <= 65504); fp8 halves take any finite value (the row dtype's
        // largest: bf16 3.39e38, float32 FLT_MAX, fp16 65504)
        const float limit = !fp16_meta && t == DType::bfloat16 ? bf16_max
                            : !fp16_meta && t == DType::float32 ? std::numeric_limits<float>::max()
                            : t == DType::bfloat16              ? 65280.f
                                                                : 65504.f;
        k[static_cast<size_t>((2 * kHeads + 1) * d + 5)] = limit;
        v[static_cast<size_t>((4 * kHeads + 2) * d + d - 1)] = -limit;
        const size_t es = t == DType::float32 ? 4 : 2;
        DevBuf dk(k.size() * es), dv(v.size() * es);
        upload_as(dk, k, t), upload_as(dv, v, t);
        const TensorView kt = TensorView::contiguous(dk.p, t, {n, kHeads, d}, Device::cuda, 0),
                         vt = TensorView::contiguous(dv.p, t, {n, kHeads, d}, Device::cuda, 0);
        dev.append(0, 0, kt, vt);
        EXPECT_EQ(cuda::quant_append_last_kernel().rfind("vector", 0), 0u) << cuda::quant_append_last_kernel();
        host.append(0, 0, TensorView::contiguous(k.data(), DType::float32, {n, kHeads, d}),
                    TensorView::contiguous(v.data(), DType::float32, {n, kHeads, d}));
        const kvtest::CacheBytes got = kvtest::visible_cache_bytes(dev), want = kvtest::visible_cache_bytes(host);
        EXPECT_TRUE(got == want) << got.diff(want);
        EXPECT_EQ(dev.seq_len(0, 0), n);
        // two bad values in ONE row of v, in its last and first lanes: the smaller channel c2 is named; a third in a
        // later row is not
        const int c1 = d - 2, c2 = 1;
        std::vector<float> bad = v;
        bad[static_cast<size_t>((3 * kHeads + 1) * d + c1)] = NAN;
        bad[static_cast<size_t>((3 * kHeads + 1) * d + c2)] = INFINITY;
        bad[static_cast<size_t>((5 * kHeads + 0) * d + 0)] = -INFINITY;
        upload_as(dv, bad, t);
        const std::string want_v = "[3, 1, " + std::to_string(c2) + "]";
        expect_error<Error>([&] { dev.append(0, 0, kt, vt); }, "v", {want_v.c_str()});
        EXPECT_EQ(dev.seq_len(0, 0), n);
        if (fp16_meta && t != DType::float16) {  // the first value past fp16's range: 65536 (bf16), nextafter(65504)
          upload_as(dv, v, t);
          std::vector<float> big = k;
          big[static_cast<size_t>((9 * kHeads + 0) * d + 3)] = t == DType::bfloat16 ? bf16_past : f32_past;
          upload_as(dk, big, t);
          expect_error<Error>([&] { dev.append(0, 0, kt, vt); }, "k", {"65504", "[9, 0, 3]"});
          EXPECT_EQ(dev.seq_len(0, 0), n);
        }
      }
}

}  // namespace flashkv::cudatest
