// CUDA quantized paged KV cache (issue #12; label gpu): quantize-on-write appends of CUDA tensors and the split-KV
// decode from packed pages, against the CPU cache and the float64 reference.
//   * codes: the same appends (a prefill chunk, then single tokens) on a host cache (float32 host tensors) and on a
//     device cache (bf16 CUDA tensors, quantized by the device kernel) give bit-identical codes and metadata, compared
//     through dequantize() element for element (exact equality: both run KVHalfFormat::encode_unit);
//   * decode: kernel error against float64 attention on the DEQUANTIZED K / V (explicit causal mask) within 2x the naive
//     same-precision (bf16) computation of the same, lse likewise (−inf for rows with no key); num_splits 1 / auto / 5;
//     the quantization error against the unquantized K / V printed separately per format;
//   * per format x head_dim 64 / 128 x GQA 1 / 4 (8 at head_dim 128) x page_size 16 / 64 x a ragged batch (0, 1, 37, 200 tokens; partly
//     filled pages whose unused slots hold the pool's 0xFF garbage — NaN metadata, maximal codes — which never reaches
//     the output), varlen queries (chunked prefill) in part of the grid, plans reused across layers;
//   * the decode's exact 16-bit code images (Code16: what the MMAs multiply once the scales are folded out) equal
//     (code_value − kOff) · kMul for every code byte, bf16 and fp16; folded scales at extreme K / V magnitudes;
//   * the decode's register conversion (dequant8: 8 codes per thread, int4 / int2 planes by shift and mask, fp8 by
//     moving bits) equals KVHalfFormat::dequant on the host bit for bit, for every code byte and random metadata;
//   * errors: CapacityError before anything is written, non-finite / out-of-range values named with their index and
//     nothing written, KIVI / windows and uncompiled K/V combinations named in an UnsupportedError, affine channel
//     groups the MMA k-slices cannot follow (not a multiple of 16) refused by the plan naming the half, expected and
//     actual group (before any check of the problem's source), packed pages described as cache tensors refused naming
//     the 16-bit pages expected; pages reused after remove_sequence.
#include <algorithm>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/decode_problem.hpp"
#include "cuda/decode_cuda.hpp"
#include "cuda_test_util.hpp"
#include "kv_dequant8_kernels.hpp"
#include "flashkv/decode.hpp"
#include "flashkv/diagnostics.hpp"
#include "flashkv/error.hpp"
#include "flashkv/kvcache.hpp"
#include "kvcache/paged_decode_case.hpp"

namespace flashkv::cudatest {
namespace {

using decodetest::expect_error;

/// The formats the default build compiles (FLASHKV_CUDA_KV_FORMATS; int4_g32 / int8_g64 are the int4 / int8
/// instantiations with groups: the mainloop's 32-channel-group and run-time-group variants), then ones only some builds
/// compile (ALL_INSTANTIATIONS: e5m2; a KFMT/VFMT entry: the mixed pair): their codes are
/// checked always, their decode where compiled (else the UnsupportedError must say "not compiled"; printed);
/// k:bf16,v:int8 takes the one-thread-per-row encode (a 16-bit half), the others the vector encode.
const char* const kFormats[] = {"fp8_e4m3", "fp8_e4m3_dynamic", "int8", "int4", "int4_g32", "int8_g64",
                                "fp8_e5m2", "fp8_e5m2_dynamic", "k:int8,v:int4", "k:bf16,v:int8"};

struct QuantCase {
  std::string fmt;
  int head_dim = 128, heads = 8, heads_kv = 2, page_size = 16;
  DType dtype = DType::bfloat16;  ///< of q / out (and the device appends)
  std::vector<int64_t> lens = {0, 1, 37, 200};
  std::vector<int32_t> nq = {1, 1, 1, 1};  ///< queries per sequence
  float magnitude = 1.f;                   ///< K and V values are magnitude · (N(0, 1) + channel offset)
  std::string name() const {
    return fmt + (magnitude != 1.f ? " x" + std::to_string(magnitude) : std::string()) + " d" + std::to_string(head_dim) + " h" + std::to_string(heads) + "/" + std::to_string(heads_kv) +
           " page" + std::to_string(page_size) + (std::any_of(nq.begin(), nq.end(), [](int32_t x) { return x > 1; }) ? " varlen" : "") +
           (dtype == DType::float16 ? " fp16" : "");
  }
};

KVCacheConfig qconfig(const QuantCase& c, Device device, int64_t pages = 0) {
  KVCacheConfig k;
  k.num_layers = 2;
  k.num_heads_kv = c.heads_kv;
  k.head_dim = c.head_dim;
  k.page_size = c.page_size;
  k.with_kv_cache_dtype(c.fmt);
  if (c.fmt == "fp8_e4m3" || c.fmt == "fp8_e5m2") {  // static scales per kv head (stored code = x / scale)
    for (int h = 0; h < c.heads_kv; ++h) {
      k.k_scales.push_back(0.0125f * static_cast<float>(h + 1));
      k.v_scales.push_back(0.015f * static_cast<float>(h + 1));
    }
  }
  k.capacity_pages = pages;
  k.device = device;
  return k;
}

std::vector<uint16_t> bits_of(const std::vector<float>& x, DType t) {
  std::vector<uint16_t> b(x.size());
  for (size_t i = 0; i < x.size(); ++i) b[i] = to_bits(x[i], t);
  return b;
}
std::vector<uint16_t> bf16_bits(const std::vector<float>& x) { return bits_of(x, DType::bfloat16); }
float round_as(float x, DType t) { return from_bits(to_bits(x, t), t); }

/// n tokens of K or V: N(0, 1) plus a per-channel offset (asymmetric groups), rounded to bf16.
std::vector<float> kv_rows(std::mt19937_64& rng, int64_t n, int hk, int d, DType t = DType::bfloat16, float mag = 1.f) {
  std::normal_distribution<float> n01;
  std::vector<float> x(static_cast<size_t>(n) * hk * d);
  for (size_t i = 0; i < x.size(); ++i) {
    const int c = static_cast<int>(i % static_cast<size_t>(d));
    x[i] = round_as(mag * (n01(rng) + 0.25f * static_cast<float>((c * 7) % 5 - 2)), t);
  }
  return x;
}

/// Appends rows [r0, r1) of x (n tokens) to both caches: host float32 tensors / device bf16 CUDA tensors.
void append_both(PagedKVCache& host, PagedKVCache& dev, int64_t id, int32_t layer, const std::vector<float>& k,
                 const std::vector<float>& v, int64_t r0, int64_t r1, int hk, int d, DType t = DType::bfloat16) {
  const int64_t n = r1 - r0;
  if (n == 0) return;
  const size_t row = static_cast<size_t>(hk) * d;
  std::vector<float> ks(k.begin() + r0 * row, k.begin() + r1 * row), vs(v.begin() + r0 * row, v.begin() + r1 * row);
  host.append(id, layer, TensorView::contiguous(ks.data(), DType::float32, {n, hk, d}),
              TensorView::contiguous(vs.data(), DType::float32, {n, hk, d}));
  DevBuf dk(ks.size() * 2), dv(vs.size() * 2);
  dk.upload(bits_of(ks, t));
  dv.upload(bits_of(vs, t));
  dev.append(id, layer, dev_view(dk, t, {n, hk, d}), dev_view(dv, t, {n, hk, d}));
}

std::vector<float> dequant(const PagedKVCache& c, int64_t id, int32_t layer, int half, int hk, int d) {
  const int64_t n = c.seq_len(id, layer);
  std::vector<float> k(static_cast<size_t>(n) * hk * d), v(k.size());
  if (n > 0) {
    c.dequantize(id, layer, TensorView::contiguous(k.data(), DType::float32, {n, hk, d}),
                 TensorView::contiguous(v.data(), DType::float32, {n, hk, d}));
  }
  return half == 0 ? k : v;
}

/// Max |got − want| over finite wants; lse rows with want = −inf must be −inf.
double lse_error(const std::vector<float>& got, const std::vector<double>& want) {
  double e = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i])) {
      EXPECT_TRUE(std::isinf(got[i]) && got[i] < 0) << "lse " << got[i] << " for a row without keys";
      continue;
    }
    const double d = std::fabs(got[i] - want[i]);
    e = std::isnan(d) ? INFINITY : std::max(e, d);
  }
  return e;
}

void check_case(const QuantCase& c) {
  SCOPED_TRACE(c.name());
  EXPECT_TRUE(cuda::decode_backend_registered());
  std::mt19937_64 rng(flashkv::testing::test_seed() ^ std::hash<std::string>{}(c.name()));
  const int hk = c.heads_kv, d = c.head_dim, H = c.heads;
  PagedKVCache host(qconfig(c, Device::cpu)), dev(qconfig(c, Device::cuda));
  const int B = static_cast<int>(c.lens.size());
  std::vector<int64_t> ids;
  for (int b = 0; b < B; ++b) ids.push_back(100 + b);
  for (int64_t id : ids) host.add_sequence(id), dev.add_sequence(id);
  std::vector<std::vector<float>> korig(2 * B), vorig(2 * B);  // [layer * B + b], unquantized (bf16 values)
  for (int32_t layer = 0; layer < 2; ++layer) {
    for (int b = 0; b < B; ++b) {
      const int64_t n = c.lens[static_cast<size_t>(b)];
      std::vector<float> k = kv_rows(rng, n, hk, d, c.dtype, c.magnitude), v = kv_rows(rng, n, hk, d, c.dtype, c.magnitude);
      const int64_t chunk = std::max<int64_t>(0, n - 2);  // a prefill chunk, then single-token decode appends
      append_both(host, dev, ids[b], layer, k, v, 0, chunk, hk, d, c.dtype);
      for (int64_t t = chunk; t < n; ++t) append_both(host, dev, ids[b], layer, k, v, t, t + 1, hk, d, c.dtype);
      korig[layer * B + b] = k, vorig[layer * B + b] = v;
    }
  }
  EXPECT_EQ(dev.memory_report().pages_used, host.memory_report().pages_used);

  // codes: the device kernel's codes and metadata equal the CPU codec's (dequantized values bit for bit)
  for (int32_t layer = 0; layer < 2; ++layer)
    for (int b = 0; b < B; ++b)
      for (int half = 0; half < 2; ++half) {
        const std::vector<float> a = dequant(dev, ids[b], layer, half, hk, d), w = dequant(host, ids[b], layer, half, hk, d);
        ASSERT_EQ(a.size(), w.size());
        size_t diff = 0, first = a.size();
        for (size_t i = 0; i < a.size(); ++i)
          if (std::memcmp(&a[i], &w[i], 4) != 0) diff += 1, first = std::min(first, i);
        EXPECT_EQ(diff, 0u) << (half ? "V" : "K") << " layer " << layer << " seq " << b << ": " << diff
                            << " elements differ, first " << first << " (" << (first < a.size() ? a[first] : 0.f)
                            << " vs " << (first < a.size() ? w[first] : 0.f) << ")";
      }

  // decode on the device vs float64 attention over the dequantized values
  std::vector<int32_t> cu = {0};
  for (int32_t x : c.nq) cu.push_back(cu.back() + x);
  const int64_t total_q = cu.back();
  std::normal_distribution<float> n01;
  std::vector<float> q(static_cast<size_t>(total_q) * H * d);
  for (float& x : q) x = round_as(n01(rng), c.dtype);
  DevBuf dq(q.size() * 2), dout(q.size() * 2), dlse(static_cast<size_t>(total_q) * H * 4);
  dq.upload(bits_of(q, c.dtype));
  const TensorView qv = dev_view(dq, c.dtype, {total_q, H, d}), ov = dev_view(dout, c.dtype, {total_q, H, d});
  const TensorView lv = dev_view(dlse, DType::float32, {H, total_q});
  testing::RefVarlenShape shape;
  shape.num_heads = H, shape.num_heads_kv = hk, shape.head_dim = shape.head_dim_v = d;
  shape.cu_seqlens_q = {0}, shape.cu_seqlens_k = {0};
  for (int b = 0; b < B; ++b) {
    shape.cu_seqlens_q.push_back(cu[b + 1]);
    shape.cu_seqlens_k.push_back(shape.cu_seqlens_k.back() + c.lens[static_cast<size_t>(b)]);
  }
  testing::RefOptions ro;
  ro.softmax_scale = 1.0 / std::sqrt(static_cast<double>(d));
  ro.causal = true;
  const std::vector<double> qd(q.begin(), q.end());
  std::unique_ptr<DecodePlan> planp;
  try {
    DecodeOptions po;
    po.q_dtype = c.dtype;  // a CUDA plan is made for one query dtype (bf16 by default)
    planp = std::make_unique<DecodePlan>(plan_decode(dev, ids, cu, H, 0, po));
  } catch (const UnsupportedError& e) {  // a format this build does not compile: named, never a silent fallback
    EXPECT_NE(std::string(e.what()).find("not compiled"), std::string::npos) << e.what();
    std::printf("[quant-decode] %-40s decode not compiled in this build (codes checked)\n", c.name().c_str());
    return;
  }
  DecodePlan& plan = *planp;
  EXPECT_NE(plan.path().find("kv_decode cuda split-kv sm80 k="), std::string::npos) << plan.path();
  for (int32_t layer = 0; layer < 2; ++layer) {
    std::vector<double> kq, vq, kn, vn, ku, vu;  // dequantized, dequantized rounded to bf16 (naive), unquantized
    for (int b = 0; b < B; ++b) {
      const std::vector<float> k = dequant(host, ids[b], layer, 0, hk, d), v = dequant(host, ids[b], layer, 1, hk, d);
      for (size_t i = 0; i < k.size(); ++i) {
        kq.push_back(k[i]), vq.push_back(v[i]);
        kn.push_back(round_as(k[i], c.dtype)), vn.push_back(round_as(v[i], c.dtype));
        ku.push_back(korig[layer * B + b][i]), vu.push_back(vorig[layer * B + b][i]);
      }
    }
    std::vector<double> ref, ref_lse, naive, naive_lse, unq, unq_lse;
    testing::reference_forward_varlen(shape, ro, qd, kq, vq, ref, ref_lse, testing::no_rounding());
    testing::reference_forward_varlen(shape, ro, qd, kn, vn, naive, naive_lse, testing::rounding_to(c.dtype));
    testing::reference_forward_varlen(shape, ro, qd, ku, vu, unq, unq_lse, testing::no_rounding());
    const double naive_err = testing::max_abs_diff(naive, ref), naive_lse_err = testing::max_abs_diff(naive_lse, ref_lse);
    for (int splits : {1, 0, 5}) {
      DecodeOptions o;
      o.num_splits = splits, o.q_dtype = c.dtype;
      dout.poison();
      dlse.poison();
      if (splits == 0) {
        run_decode(dev, plan, layer, qv, ov, &lv);  // the plan of layer 0, reused
      } else {
        dev.attention(ids, cu, layer, qv, ov, &lv, o);
      }
      const std::vector<double> out = decode(dout.download<uint16_t>(q.size()), c.dtype);
      const std::vector<float> lse = dlse.download<float>(static_cast<size_t>(total_q) * H);
      for (double x : out) ASSERT_TRUE(std::isfinite(x)) << "non-finite output (garbage page slots read?)";
      const double err = testing::max_abs_diff(out, ref), lerr = lse_error(lse, ref_lse);
      EXPECT_LE(err, 2 * naive_err + 1e-5) << "layer " << layer << " splits " << splits << ": out err " << err
                                           << " vs naive " << naive_err;
      EXPECT_LE(lerr, 2 * naive_lse_err + 1e-4) << "layer " << layer << " splits " << splits << ": lse err " << lerr
                                                << " vs naive " << naive_lse_err;
      if (splits == 1 && layer == 1) {
        std::printf("[quant-decode] %-40s kernel err %.2e (naive bf16 %.2e) | quantization err vs unquantized: "
                    "format %.2e, device %.2e\n",
                    c.name().c_str(), err, naive_err, testing::max_abs_diff(ref, unq), testing::max_abs_diff(out, unq));
      }
    }
  }
  const KVCacheConfig names = qconfig(c, Device::cpu);
  EXPECT_NE(last_kernel_path().find("k=" + names.k_format.name() + " v=" + names.v_format.name()), std::string::npos)
      << last_kernel_path();
}

TEST(CudaQuantKVCache, RegisterConversionEqualsTheTraitsDequant) {
  std::mt19937_64 rng(flashkv::testing::test_seed() + 30);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.f, 0.1f), mn(-3.f, 3.f);
  struct F {
    kv::KVFormatId id;
    bool dynamic;
    int group;
    bool key;
  };
  const F fmts[] = {{kv::KVFormatId::int8, false, 0, true},       {kv::KVFormatId::int4, false, 0, true},
                    {kv::KVFormatId::int4, false, 32, true},      {kv::KVFormatId::int2_kivi, false, 16, false},
                    {kv::KVFormatId::int4_kivi, false, 32, false}, {kv::KVFormatId::fp8_e4m3, false, 0, true},
                    {kv::KVFormatId::fp8_e4m3, true, 0, true},    {kv::KVFormatId::fp8_e5m2, false, 0, true},
                    {kv::KVFormatId::fp8_e5m2, true, 0, true}};
  const int rows = 64;
  for (const F& fm : fmts) {
    for (int d : {64, 128}) {
      const kv::KVHalfFormat f = kv::describe(fm.id, fm.dynamic, fm.group, fm.key, d);
      SCOPED_TRACE("format id " + std::to_string(static_cast<int>(fm.id)) + (fm.dynamic ? " dynamic" : "") + " g" +
                   std::to_string(fm.group) + " d" + std::to_string(d));
      std::vector<uint8_t> codes(static_cast<size_t>(rows) * f.code_bytes), meta(std::max<size_t>(1, static_cast<size_t>(rows) * f.meta_bytes_per_unit));
      for (uint8_t& b : codes) b = static_cast<uint8_t>(byte(rng));
      for (int r = 0; r < rows; ++r) {
        uint8_t* m = meta.data() + static_cast<size_t>(r) * f.meta_bytes_per_unit;
        if (f.scaling == kv::KVScaling::token_f32) {
          const float s = scale(rng);
          std::memcpy(m, &s, 4);
        } else if (f.scaling == kv::KVScaling::token_affine) {
          for (int g = 0; g < f.meta_bytes_per_unit / 4; ++g) {
            const uint16_t sc = kv::float_to_fp16_bits(scale(rng)), z = kv::float_to_fp16_bits(mn(rng));
            std::memcpy(m + 4 * g, &sc, 2), std::memcpy(m + 4 * g + 2, &z, 2);
          }
        }
      }
      DevBuf dc(codes.size()), dm(meta.size()), dout(static_cast<size_t>(rows) * d * 4);
      dc.upload(codes), dm.upload(meta);
      const float hs = 0.037f;
      ASSERT_TRUE(dequant8_on_device(f, static_cast<const uint8_t*>(dc.p), static_cast<const uint8_t*>(dm.p), rows, hs,
                                     static_cast<float*>(dout.p)));
      const std::vector<float> got = dout.download<float>(static_cast<size_t>(rows) * d);
      int bad = 0;
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < d; ++c) {
          const float want = f.dequant(codes.data(), meta.data(), r, c, hs), g = got[static_cast<size_t>(r) * d + c];
          const bool same = std::isnan(want) ? std::isnan(g) : std::memcmp(&want, &g, 4) == 0;
          if (!same && bad++ < 5) ADD_FAILURE() << "row " << r << " channel " << c << ": " << g << " vs trait " << want;
        }
      EXPECT_EQ(bad, 0);
    }
  }
}

TEST(CudaQuantKVCache, Code16EqualsTheCodeValues) {
  // the decode's MMAs see (code_value − kOff) · kMul exactly, for every valid code of every kind, both query dtypes
  struct C {
    kv::KVCode code;
    kv::KVFormatId id;
  };
  const C codes[] = {{kv::KVCode::e4m3, kv::KVFormatId::fp8_e4m3}, {kv::KVCode::e5m2, kv::KVFormatId::fp8_e5m2},
                     {kv::KVCode::u8, kv::KVFormatId::int8}, {kv::KVCode::u4, kv::KVFormatId::int4}};
  for (const C& c : codes)
    for (bool bf16 : {true, false}) {
      SCOPED_TRACE(std::string("code ") + std::to_string(static_cast<int>(c.code)) + (bf16 ? " bf16" : " fp16"));
      const kv::KVHalfFormat f = kv::describe(c.id, false, 0, true, 128);
      DevBuf dout(512 * 4);
      float mul = 0, off = 0;
      ASSERT_TRUE(code16_on_device(c.code, bf16, static_cast<float*>(dout.p), &mul, &off));
      const std::vector<float> got = dout.download<float>(512);
      int bad = 0;
      for (int b = 0; b < 256; ++b)
        for (int plane = 0; plane < (c.code == kv::KVCode::u4 ? 2 : 1); ++plane) {
          const uint32_t raw = c.code == kv::KVCode::u4 ? (plane ? b >> 4 : b & 15) : static_cast<uint32_t>(b);
          const float cv = f.code_value(raw);
          const float g = got[static_cast<size_t>(256 * plane + b)];
          if (!std::isfinite(cv)) continue;  // fp8 NaN / inf codes never occur in appended pages: any image
          const double want = (static_cast<double>(cv) - off) * mul;
          if (static_cast<double>(g) != want && bad++ < 5) ADD_FAILURE() << "byte " << b << " plane " << plane << ": " << g << " vs " << want;
        }
      EXPECT_EQ(bad, 0);
    }
}

TEST(CudaQuantKVCache, FoldedScalesAtExtremeMagnitudes) {
  // scales folded into the scores and into P: tiny and large K / V (per-token fp8 scales, int8 / int4 groups), bf16
  // and fp16 queries (fp16: P · scale kept in range by the per-block power of two)
  for (const char* fmt : {"fp8_e4m3_dynamic", "int8", "int4_g32", "fp8_e4m3"})
    for (float mag : {1e-3f, 300.f})
      for (DType t : {DType::bfloat16, DType::float16}) {
        QuantCase c;
        c.fmt = fmt, c.magnitude = mag, c.dtype = t, c.heads = 8, c.heads_kv = 2, c.page_size = 64;
        check_case(c);
      }
}

TEST(CudaQuantKVCache, DeviceCodesEqualTheCpuCodecAndDecodeMatchesTheReference) {
  for (const char* fmt : kFormats)
    for (int d : {64, 128})
      for (int gqa : {1, 4})
        for (int page : {16, 64}) {
          QuantCase c;
          c.fmt = fmt, c.head_dim = d, c.heads_kv = 2, c.heads = 2 * gqa, c.page_size = page;
          if (gqa == 4 && page == 16) c.nq = {1, 1, 3, 2};  // varlen queries (chunked prefill), causal bottom-right
          check_case(c);
          if (d == 128 && gqa == 4 && page == 64) {  // float16 queries / appends (the fp16 instantiations)
            c.dtype = DType::float16;
            check_case(c);
          }
          if (d == 128 && gqa == 4 && page == 64) {  // GQA 8: a decode step's CTA with all 8 query columns of the
            QuantCase c8;                             // keys-as-M loop (sm80/decode_keys_m.cuh) in use
            c8.fmt = fmt, c8.head_dim = d, c8.heads_kv = 2, c8.heads = 16, c8.page_size = page;
            check_case(c8);
          }
        }
}

TEST(CudaQuantKVCache, PagesReusedAfterRemoveSequence) {
  QuantCase c;
  c.fmt = "int4", c.lens = {150, 70}, c.nq = {1, 1};
  check_case(c);  // fills pages, then a fresh pair of caches below reuses freed ones
  std::mt19937_64 rng(flashkv::testing::test_seed() + 31);
  PagedKVCache host(qconfig(c, Device::cpu)), dev(qconfig(c, Device::cuda));
  for (PagedKVCache* p : {&host, &dev}) p->add_sequence(1), p->add_sequence(2);
  const std::vector<float> k = kv_rows(rng, 150, 2, 128), v = kv_rows(rng, 150, 2, 128);
  append_both(host, dev, 1, 0, k, v, 0, 150, 2, 128);
  append_both(host, dev, 1, 1, k, v, 0, 150, 2, 128);
  for (PagedKVCache* p : {&host, &dev}) p->remove_sequence(1), p->add_sequence(3);
  append_both(host, dev, 3, 0, k, v, 0, 21, 2, 128);  // reuses sequence 1's (refilled) pages, last one partly
  append_both(host, dev, 2, 0, k, v, 0, 5, 2, 128);
  const int64_t ids[] = {3, 2};
  const int32_t cu[] = {0, 1, 2};
  std::vector<float> q(2 * 8 * 128, 0.5f);
  DevBuf dq(q.size() * 2), dout(q.size() * 2);
  dq.upload(bf16_bits(q));
  dev.attention(ids, cu, 0, dev_view(dq, DType::bfloat16, {2, 8, 128}), dev_view(dout, DType::bfloat16, {2, 8, 128}),
                nullptr);
  std::vector<float> hout(q.size());
  host.attention(ids, cu, 0, TensorView::contiguous(q.data(), DType::float32, {2, 8, 128}),
                 TensorView::contiguous(hout.data(), DType::float32, {2, 8, 128}), nullptr);
  const std::vector<double> out = decode(dout.download<uint16_t>(q.size()), DType::bfloat16);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], hout[i], 2e-2) << i;
}

TEST(CudaQuantKVCache, AppendErrorsChangeNothing) {
  QuantCase c;
  c.fmt = "int8";
  // capacity: 40 tokens need 3 pages of 16, the pool has 2
  PagedKVCache dev(qconfig(c, Device::cuda, /*pages=*/2));
  dev.add_sequence(0);
  std::mt19937_64 rng(flashkv::testing::test_seed() + 32);
  std::vector<float> k = kv_rows(rng, 40, 2, 128);
  DevBuf dk(k.size() * 2);
  dk.upload(bf16_bits(k));
  const TensorView k40 = dev_view(dk, DType::bfloat16, {40, 2, 128});
  expect_error<CapacityError>([&] { dev.append(0, 0, k40, k40); }, "", {"needs", "pages"});
  EXPECT_EQ(dev.seq_len(0, 0), 0);
  EXPECT_EQ(dev.free_pages(), 2);
  // a NaN at [5, 1, 7] of v, and 70000 (past fp16, the scale / min type) at [3, 0, 2] of k: named, nothing written
  std::vector<float> bad = k;
  bad[(5 * 2 + 1) * 128 + 7] = NAN;
  DevBuf dbad(bad.size() * 2);
  dbad.upload(bf16_bits(bad));
  const TensorView k20 = dev_view(dk, DType::bfloat16, {20, 2, 128}), bad20 = dev_view(dbad, DType::bfloat16, {20, 2, 128});
  expect_error<Error>([&] { dev.append(0, 0, k20, bad20); }, "v", {"[5, 1, 7]"});
  bad[(5 * 2 + 1) * 128 + 7] = 0.f;
  bad[(3 * 2 + 0) * 128 + 2] = 70000.f;
  dbad.upload(bf16_bits(bad));
  expect_error<Error>([&] { dev.append(0, 0, bad20, k20); }, "k", {"65504", "[3, 0, 2]"});
  EXPECT_EQ(dev.seq_len(0, 0), 0);
  EXPECT_EQ(dev.free_pages(), 2);
  dev.append(0, 0, k20, k20);
  EXPECT_EQ(dev.seq_len(0, 0), 20);
  EXPECT_EQ(dev.free_pages(), 0);
}

TEST(CudaQuantKVCache, UnsupportedCombinationsNameThemselves) {
  std::mt19937_64 rng(flashkv::testing::test_seed() + 33);
  std::vector<float> k = kv_rows(rng, 40, 2, 128);
  DevBuf dk(k.size() * 2);
  dk.upload(bf16_bits(k));
  const TensorView k40 = dev_view(dk, DType::bfloat16, {40, 2, 128});
  {
    QuantCase c;
    c.fmt = "int4_kivi";  // KIVI keys quantize G tokens at once out of the bf16 tail: not on the device yet
    c.page_size = 32;     // a multiple of the key group (32), else the page_size error comes first
    PagedKVCache dev(qconfig(c, Device::cuda));
    dev.add_sequence(0);
    expect_error<UnsupportedError>([&] { dev.append(0, 0, k40, k40); }, "", {"int4_kivi"});
    EXPECT_EQ(dev.seq_len(0, 0), 0);
  }
  {
    QuantCase c;
    c.fmt = "k:int8,v:int4";  // appends on the device (any token-granular pair); decode only if compiled
    PagedKVCache dev(qconfig(c, Device::cuda)), host(qconfig(c, Device::cpu));
    dev.add_sequence(0), host.add_sequence(0);
    std::vector<float> v = kv_rows(rng, 40, 2, 128);
    append_both(host, dev, 0, 0, k, v, 0, 40, 2, 128);
    for (int half = 0; half < 2; ++half) EXPECT_EQ(dequant(dev, 0, 0, half, 2, 128), dequant(host, 0, 0, half, 2, 128));
    const int64_t ids[] = {0};
    const int32_t cu[] = {0, 1};
    DevBuf dq(8 * 128 * 2), dout(8 * 128 * 2);
    dq.upload(std::vector<uint16_t>(8 * 128, float_to_bf16(0.25f)));
    try {
      dev.attention(ids, cu, 0, dev_view(dq, DType::bfloat16, {1, 8, 128}), dev_view(dout, DType::bfloat16, {1, 8, 128}),
                    nullptr);
      std::printf("[quant-decode] k:int8,v:int4 is compiled in this build (FLASHKV_CUDA_KV_FORMATS has int8/int4)\n");
    } catch (const UnsupportedError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("k=int8 v=int4"), std::string::npos) << m;
      EXPECT_NE(m.find("not compiled"), std::string::npos) << m;
    }
  }
}

/// A core::DecodeProblem over int4 pages in real device buffers, for the CUDA plan's checks: batch 1 (20 keys), 8 query
/// heads over 2 kv heads, head_dim 64 (in every CUDA build, gpu-ci's too), 2 pages of 16 tokens. group[half] is the
/// half's channel group (0: one group of head_dim channels, the grammar's int4). `source` says where the problem comes
/// from: 0 = flash-attn style cache tensors (paged_cache false, no host lengths: the tensor API on a CUDA device),
/// 1 = a PagedKVCache decode (paged_cache, host lengths), 2 = an engine step over device tables (paged_cache, no host
/// lengths).
struct Int4PlanProblem {
  static constexpr int d = 64, hk = 2, h = 8, page = 16, pages = 2;
  const int64_t lens[1] = {20};
  DevBuf dt{pages * 4}, dlen{4}, dq{h * d * 2}, dout{h * d * 2};
  std::vector<std::unique_ptr<DevBuf>> bufs;
  std::string names[2];
  core::DecodeProblem p;

  Int4PlanProblem(const int (&group)[2], int source) {
    dt.upload(std::vector<int32_t>{0, 1});
    dlen.upload(std::vector<int32_t>{20});
    p.batch = 1, p.num_heads = h, p.num_heads_kv = hk, p.head_dim = d;
    p.seqlen_q = p.max_seqlen_q = 1, p.max_seqlen_k = lens[0];
    p.dtype = DType::bfloat16, p.device = Device::cuda;
    p.q = dq.p, p.out = dout.p;
    p.q_strides = {h * d, h * d, d}, p.out_strides = p.q_strides;
    core::DecodeKV& pkv = p.kv;
    pkv.device = Device::cuda, pkv.page_size = page;
    for (int half = 0; half < 2; ++half) {
      const kv::KVHalfFormat f = kv::describe(kv::KVFormatId::int4, false, group[half], half == 0, d);
      EXPECT_EQ(f.group, group[half] > 0 ? group[half] : d);
      pkv.format[half] = f;
      names[half] = group[half] > 0 ? "int4_g" + std::to_string(group[half]) : std::string("int4");
      pkv.format_name[half] = names[half].c_str();
      bufs.push_back(std::make_unique<DevBuf>(static_cast<size_t>(pages) * page * hk * f.code_bytes));
      bufs.push_back(std::make_unique<DevBuf>(static_cast<size_t>(pages) * page * hk * f.meta_bytes_per_unit));
      kv::HalfPages& hp = pkv.pages[half];
      hp.codes = static_cast<const uint8_t*>(bufs[bufs.size() - 2]->p);
      hp.meta = static_cast<const uint8_t*>(bufs.back()->p);
      hp.slot_stride = f.code_bytes, hp.head_stride = static_cast<int64_t>(page) * f.code_bytes;
      hp.page_stride = hk * hp.head_stride;
      hp.meta_head_stride = static_cast<int64_t>(page) * f.meta_bytes_per_unit;
      hp.meta_page_stride = hk * hp.meta_head_stride;
    }
    pkv.page_table = static_cast<const int32_t*>(dt.p), pkv.page_table_stride = pages, pkv.max_pages = pages;
    pkv.capacity = pages * page;
    pkv.seqlens = static_cast<const int32_t*>(dlen.p);
    pkv.paged_cache = source != 0;
    pkv.host_seqlens_k = source == 1 ? lens : nullptr;
  }
};

const char* const kPlanSources[3] = {"cache tensors", "PagedKVCache", "engine step"};

/// token_affine K / V (int8 / int4) whose channel groups are not a multiple of 16 (or below 32 channels, whose metadata
/// the decode does not stage): the decode folds one group per MMA k-slice (16 channels), so the plan refuses them with an UnsupportedError naming the half (k_cache / v_cache), its
/// format, the expected and the actual group size, before any metadata is read or anything is launched — and before
/// any check of the problem's source, so the same error answers a PagedKVCache, an engine step and cache tensors. The
/// kv_cache_dtype grammar only offers int8 / int4 groups of 32..256 channels (and KIVI, whose V groups are 16..128 and
/// which the device refuses earlier), so the description — an int4 half with groups of 8 channels — is handed to the
/// CUDA backend's plan as a core::DecodeProblem directly, with real device buffers.
TEST(CudaQuantKVCache, AffineGroupsNotAMultipleOf16AreUnsupported) {
  EXPECT_TRUE(cuda::decode_backend_registered());
  const std::vector<uint16_t> out_before(Int4PlanProblem::h * Int4PlanProblem::d, 0x7fc0);  // bf16 NaN: untouched
  for (int source = 0; source < 3; ++source) {
    for (int bad_half = 0; bad_half < 2; ++bad_half) {
      const char* name = bad_half == 0 ? "k_cache" : "v_cache";
      SCOPED_TRACE(std::string(kPlanSources[source]) + ", " + name);
      // groups of 8: not a multiple of 16; groups of 16: below the 32 channels whose metadata the decode stages
      for (int bad_group : {8, 16}) {
        SCOPED_TRACE("groups of " + std::to_string(bad_group));
        const int group[2] = {bad_half == 0 ? bad_group : 0, bad_half == 1 ? bad_group : 0};
        Int4PlanProblem t(group, source);
        t.dout.upload(out_before);
        const std::string bad_name = "int4_g" + std::to_string(bad_group);
        const std::string got = "got groups of " + std::to_string(bad_group);
        expect_error<UnsupportedError>([&] { (void)core::require_decode_backend(Device::cuda).plan(t.p); }, "",
                                       {name, bad_name.c_str(),
                                        bad_group == 8 ? "multiple of 16" : "of at least 32 channels", "expected",
                                        got.c_str()});
        EXPECT_EQ(t.dout.download<uint16_t>(out_before.size()), out_before);
      }
    }
  }
}

/// Flash-attn style cache tensors are 16-bit pages of the query dtype by definition (the tensor API describes them so):
/// a cache-tensor problem whose halves are packed, in a format the kernels do read (int4, one group of head_dim
/// channels), is refused by the plan with an UnsupportedError naming the pages it expected, while the same pages as a
/// PagedKVCache or an engine step plan.
TEST(CudaQuantKVCache, PackedPagesAsCacheTensorsAreUnsupported) {
  EXPECT_TRUE(cuda::decode_backend_registered());
  const int group[2] = {0, 0};
  for (int source = 0; source < 3; ++source) {
    SCOPED_TRACE(kPlanSources[source]);
    Int4PlanProblem t(group, source);
    if (source == 0) {
      expect_error<UnsupportedError>([&] { (void)core::require_decode_backend(Device::cuda).plan(t.p); }, "",
                                     {"over cache tensors", "bfloat16 pages for bfloat16 queries"});
    } else {
      std::unique_ptr<core::DecodeWork> w;
      EXPECT_NO_THROW(w = core::require_decode_backend(Device::cuda).plan(t.p));
      if (w != nullptr) {
        EXPECT_NE(w->path().find("k=int4 v=int4"), std::string::npos) << w->path();
      }
    }
  }
}

}  // namespace
}  // namespace flashkv::cudatest
