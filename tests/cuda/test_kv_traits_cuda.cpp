// The KV format trait (src/kvcache/format/traits.hpp) compiled by nvcc and run on the device (label gpu): encoding
// units on the GPU gives the CPU codec's codes and metadata bit for bit, and dequantizing on the GPU gives the host
// trait's values bit for bit, for every format, K and V, head_dim 64 / 128 — the foundation of the CUDA quantized
// cache (issue #12).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/reference.hpp"
#include "cuda/sm80/decode_frag.hpp"
#include "cuda_test_util.hpp"
#include "flashkv/kvcache.hpp"
#include "kvcache/format/codec.hpp"
#include "kvcache/format/traits.hpp"
#include "kv_dequant8_kernels.hpp"
#include "kv_traits_kernels.hpp"

namespace {

using flashkv::kv::KVHalfFormat;

void ok(cudaError_t e, const char* what) { ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e); }

template <class T>
T* dev_copy(const std::vector<T>& h) {
  T* p = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(h.size(), 1) * sizeof(T));
  cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  return p;
}
template <class T>
std::vector<T> host_copy(const T* p, size_t n) {
  std::vector<T> h(n);
  cudaDeviceSynchronize();
  cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
  return h;
}

// The device's hardware conversions (fp8 e4m3 / e5m2 with saturation, fp16 rounded down / up) are the portable
// definitions' function on every non-NaN float: all 2^32 bit patterns, so the codes the device append writes do not
// depend on which form ran.
TEST(CudaKVTraits, HardwareConversionsEqualThePortableOnesOnEveryFloat) {
  unsigned long long mismatches[4] = {};
  uint32_t first[4] = {};
  bool hardware = false;
  flashkv::cudatest::conversions_vs_portable(mismatches, first, hardware);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const char* names[4] = {"float_to_fp8_bits e4m3", "float_to_fp8_bits e5m2", "fp16_bits_round_down",
                          "fp16_bits_round_up"};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(mismatches[i], 0ull) << names[i] << ": first differing float bits 0x" << std::hex << first[i];
  }
  std::printf("[kv-traits] hardware fp8 path %s; %llu / %llu / %llu / %llu mismatches over 2^32 floats\n",
              hardware ? "on (sm_89+)" : "off", mismatches[0], mismatches[1], mismatches[2], mismatches[3]);
}

TEST(CudaKVTraits, DeviceEncodeAndDequantMatchTheHostBitForBit) {
  const char* formats[] = {"fp32",     "bf16",     "fp16",      "fp8_e4m3",      "fp8_e5m2",     "fp8_e4m3_dynamic",
                           "fp8_e5m2_dynamic", "int8", "int8_g32", "int4", "int4_g64", "int4_kivi", "int2_kivi",
                           "int2_kivi_g16"};
  uint64_t salt = 900;
  for (const char* name : formats) {
    for (bool key : {true, false}) {
      for (int d : {64, 128}) {
        SCOPED_TRACE(std::string(name) + (key ? " K" : " V") + " d=" + std::to_string(d));
        const flashkv::KVFormatSpec spec = flashkv::parse_kv_format(name);
        const int P = 64;
        flashkv::kv::KVCodec codec(spec, key, d, P, 1, {0.37f});
        const KVHalfFormat f = codec.format();
        std::mt19937_64 rng = flashkv::testing::make_rng(salt++);
        std::normal_distribution<float> n01(0.0f, 2.0f);
        std::vector<float> x(static_cast<size_t>(P) * d);
        for (float& v : x) v = n01(rng);
        x[3] = 0.0f;
        const size_t cb = static_cast<size_t>(f.code_bytes) * P;
        const size_t mb = static_cast<size_t>(std::max<int64_t>(f.meta_bytes_per_page_head(P), 1));
        std::vector<uint8_t> hc(cb, 0xFF), hm(mb, 0xFF);
        codec.encode(0, x.data(), P, hc.data(), hm.data(), 0);
        float* dx = dev_copy(x);
        uint8_t* dc = dev_copy(std::vector<uint8_t>(cb, 0xFF));
        uint8_t* dm = dev_copy(std::vector<uint8_t>(mb, 0xFF));
        uint8_t* scratch = dev_copy(std::vector<uint8_t>(static_cast<size_t>(P) * d, 0));
        flashkv::cudatest::trait_encode_on_device(f, dx, P, dc, dm, codec.head_scale(0), scratch);
        ok(cudaGetLastError(), "encode launch");
        EXPECT_EQ(host_copy(dc, cb), hc) << "codes differ from the CPU codec";
        EXPECT_EQ(host_copy(dm, mb), hm) << "metadata differs from the CPU codec";
        float* dout = nullptr;
        ok(cudaMalloc(reinterpret_cast<void**>(&dout), x.size() * 4), "malloc");
        flashkv::cudatest::trait_dequant_on_device(f, dc, dm, P, codec.head_scale(0), dout);
        ok(cudaGetLastError(), "dequant launch");
        const std::vector<float> got = host_copy(dout, x.size());
        for (int t = 0; t < P; ++t) {
          for (int c = 0; c < d; ++c) {
            const float want = f.dequant(hc.data(), hm.data(), t, c, codec.head_scale(0));
            ASSERT_EQ(flashkv::kv::float_as_u32(got[static_cast<size_t>(t) * d + c]), flashkv::kv::float_as_u32(want))
                << "t=" << t << " c=" << c;
          }
        }
        for (void* p : {static_cast<void*>(dx), static_cast<void*>(dc), static_cast<void*>(dm),
                        static_cast<void*>(scratch), static_cast<void*>(dout)}) {
          cudaFree(p);
        }
      }
    }
  }
}

}  // namespace

namespace flashkv {

TEST(CudaQuantKVCache, FragCodeOnTheDeviceEqualsItsHostEmulation) {
  // the register-direct fragments' PRMT / LOP3 / paired-fma conversions: device bits == the host emulation's, which
  // tests/kvcache/test_kv_decode_frag.cpp checks against the code values (so: the exact images on the GPU)
  namespace frag = cuda::sm80::frag;
  auto host = [](kv::KVCode c, bool bf16, bool centered, uint32_t w, uint32_t (&r)[4]) {
    r[0] = r[1] = r[2] = r[3] = 0;
    if (!centered) return frag::FragCode<kv::KVCode::u4, true, false>::pairs4(w, r);
    if (c == kv::KVCode::u4) return bf16 ? frag::FragCode<kv::KVCode::u4, true>::pairs4(w, r) : frag::FragCode<kv::KVCode::u4, false>::pairs4(w, r);
    if (c == kv::KVCode::u8) return bf16 ? frag::FragCode<kv::KVCode::u8, true>::pairs8(w, r[0], r[1]) : frag::FragCode<kv::KVCode::u8, false>::pairs8(w, r[0], r[1]);
    if (c == kv::KVCode::e4m3) return bf16 ? frag::FragCode<kv::KVCode::e4m3, true>::pairs8(w, r[0], r[1]) : frag::FragCode<kv::KVCode::e4m3, false>::pairs8(w, r[0], r[1]);
    return bf16 ? frag::FragCode<kv::KVCode::e5m2, true>::pairs8(w, r[0], r[1]) : frag::FragCode<kv::KVCode::e5m2, false>::pairs8(w, r[0], r[1]);
  };
  for (kv::KVCode c : {kv::KVCode::e4m3, kv::KVCode::e5m2, kv::KVCode::u8, kv::KVCode::u4})
    for (bool bf16 : {true, false})
      for (bool centered : {true, false}) {
        if (!centered && !(c == kv::KVCode::u4 && bf16)) continue;
        SCOPED_TRACE(std::to_string(static_cast<int>(c)) + (bf16 ? " bf16" : " fp16") + (centered ? "" : " uncentred"));
        cudatest::DevBuf dout(1024 * 4);
        ASSERT_TRUE(cudatest::frag_code_on_device(c, bf16, centered, static_cast<uint32_t*>(dout.p)));
        const std::vector<uint32_t> got = dout.download<uint32_t>(1024);
        int bad = 0;
        for (uint32_t b = 0; b < 256; ++b) {
          const uint32_t w = b | ((b + 37) & 255u) << 8 | ((b + 101) & 255u) << 16 | ((b + 203) & 255u) << 24;
          uint32_t r[4];
          host(c, bf16, centered, w, r);
          for (int k = 0; k < 4; ++k)
            if (got[4 * b + k] != r[k] && bad++ < 5) ADD_FAILURE() << "word " << b << " reg " << k << ": " << got[4 * b + k] << " vs " << r[k];
        }
        EXPECT_EQ(bad, 0);
      }
}

}  // namespace flashkv
