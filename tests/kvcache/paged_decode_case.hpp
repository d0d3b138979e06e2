// One paged-decode test case (flashkv::paged_decode over cache tensors) for any device: random pages (a shuffled page
// table), cached lengths (0, a page boundary, random), optional append of the new tokens, GQA, softcap, sliding window
// — checked against the float64 reference over the gathered keys (explicit mask) with the 2× naive-same-precision
// rule, lse included, for num_splits 1 / auto / 7 / 1024, and the pages after the append (only the new rows changed).
// Used by the CPU tests (tests/kvcache/test_kv_decode_api.cpp) and the CUDA tests (tests/cuda/test_decode_cuda.cpp)
// through a small Memory interface.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/reference.hpp"
#include "core/float16.hpp"
#include "flashkv/decode.hpp"
#include "flashkv/error.hpp"
#include "flashkv/types.hpp"

namespace flashkv::decodetest {

/// Runs fn, expects an Error of type E naming `arg` (empty: any) whose message contains every string of `parts`.
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

/// Memory of the device under test.
struct Memory {
  virtual ~Memory() = default;
  virtual Device device() const = 0;
  virtual void* alloc(size_t bytes) = 0;  ///< owned by the Memory until it is destroyed
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;
  virtual void download(void* dst, const void* src, size_t bytes) = 0;  ///< waits for the device
  void* put(const void* src, size_t bytes) {
    void* p = alloc(bytes);
    upload(p, src, bytes);
    return p;
  }
};

/// Host memory (the CPU decode).
struct HostMemory final : Memory {
  std::vector<std::unique_ptr<uint8_t[]>> blocks;
  Device device() const override { return Device::cpu; }
  void* alloc(size_t bytes) override {
    blocks.emplace_back(new uint8_t[std::max<size_t>(bytes, 16) + 64]);
    uint8_t* p = blocks.back().get();
    return p + (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64;  // 64-byte aligned like device allocations
  }
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
};

/// Values of a tensor of `dtype` as stored bytes (bits) and as the exact doubles they hold.
struct Values {
  DType dtype = DType::bfloat16;
  std::vector<uint8_t> bytes;
  std::vector<double> val;
  size_t size() const { return val.size(); }
  void set(size_t i, double x) {
    if (dtype == DType::float32) {
      const float f = static_cast<float>(x);
      std::memcpy(bytes.data() + 4 * i, &f, 4);
      val[i] = f;
    } else {
      const uint16_t h = dtype == DType::bfloat16 ? float_to_bf16(static_cast<float>(x)) : float_to_fp16(static_cast<float>(x));
      std::memcpy(bytes.data() + 2 * i, &h, 2);
      val[i] = dtype == DType::bfloat16 ? bf16_to_float(h) : fp16_to_float(h);
    }
  }
};
inline size_t esize(DType t) { return t == DType::float32 ? 4 : 2; }
inline Values random_values(size_t n, DType t, std::mt19937_64& rng, double sd = 1.0) {
  Values v;
  v.dtype = t;
  v.bytes.assign(n * esize(t), 0);
  v.val.assign(n, 0.0);
  std::normal_distribution<double> dist(0.0, sd);
  for (size_t i = 0; i < n; ++i) v.set(i, dist(rng));
  return v;
}
inline std::vector<double> decode_bytes(const std::vector<uint8_t>& b, DType t) {
  std::vector<double> v(b.size() / esize(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::float32) {
      float f;
      std::memcpy(&f, b.data() + 4 * i, 4);
      v[i] = f;
    } else {
      uint16_t h;
      std::memcpy(&h, b.data() + 2 * i, 2);
      v[i] = t == DType::bfloat16 ? bf16_to_float(h) : fp16_to_float(h);
    }
  }
  return v;
}

struct DecodeCase {
  DType dtype = DType::bfloat16;
  int batch = 3, seqlen_q = 1, heads = 32, heads_kv = 8, head_dim = 128;
  int page_size = 64;  ///< 0 = contiguous cache
  int max_pages = 20;
  bool append = true;
  float softcap = 0;
  int window = -1;
  std::vector<int32_t> lens;  ///< cached lengths (default: 0, a page boundary, random)
  std::string name() const {
    return std::string(dtype_name(dtype)) + " b=" + std::to_string(batch) + " sq=" + std::to_string(seqlen_q) +
           " h=" + std::to_string(heads) + "/" + std::to_string(heads_kv) + " d=" + std::to_string(head_dim) +
           " page=" + std::to_string(page_size) + (append ? " append" : "") + (softcap > 0 ? " softcap" : "") +
           (window >= 0 ? " window" + std::to_string(window) : "");
  }
};

/// The tensors of one case on the device under test plus their host copies.
struct DecodeSetup {
  DecodeCase c;
  int capacity = 0, num_pages = 0;
  std::vector<int32_t> lens, table;
  Values kc, vc, q, kn, vn;
  // device views
  TensorView qv, kcv, vcv, knv, vnv, ov, lv, tv, sv;
  void* dkc = nullptr;
  void* dout = nullptr;
  void* dlse = nullptr;

  size_t cache_index(int b, int j) const {  // element offset of token j of sequence b
    const int Hk = c.heads_kv, D = c.head_dim;
    if (c.page_size == 0) return (static_cast<size_t>(b) * capacity + j) * Hk * D;
    return (static_cast<size_t>(table[b * c.max_pages + j / c.page_size]) * c.page_size + j % c.page_size) * Hk * D;
  }
};

inline DecodeSetup make_setup(const DecodeCase& c, Memory& mem, std::mt19937_64& rng) {
  DecodeSetup s;
  s.c = c;
  const int D = c.head_dim, Hk = c.heads_kv, H = c.heads, B = c.batch, S = c.seqlen_q;
  const bool paged = c.page_size > 0;
  s.capacity = paged ? c.max_pages * c.page_size : c.max_pages * 64;
  s.num_pages = paged ? B * c.max_pages + 3 : 0;
  s.lens = c.lens;
  if (s.lens.empty()) {
    for (int b = 0; b < B; ++b) {
      const int room = s.capacity - (c.append ? S : 0);
      s.lens.push_back(b == 0 ? 0 : (b == 1 ? std::min(room, (paged ? c.page_size : 64) * 3) : static_cast<int>(rng() % room)));
    }
  }
  std::vector<int32_t> perm(std::max(s.num_pages, 1));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  s.table.resize(static_cast<size_t>(B) * c.max_pages);
  for (size_t i = 0; i < s.table.size(); ++i) s.table[i] = paged ? perm[i] : 0;
  const size_t cache_elems = paged ? static_cast<size_t>(s.num_pages) * c.page_size * Hk * D
                                   : static_cast<size_t>(B) * s.capacity * Hk * D;
  s.kc = random_values(cache_elems, c.dtype, rng);
  s.vc = random_values(cache_elems, c.dtype, rng);
  s.q = random_values(static_cast<size_t>(B) * S * H * D, c.dtype, rng);
  s.kn = random_values(static_cast<size_t>(B) * S * Hk * D, c.dtype, rng);
  s.vn = random_values(s.kn.size(), c.dtype, rng);
  const Device dev = mem.device();
  auto view = [&](void* p, DType t, std::initializer_list<int64_t> shape) { return TensorView::contiguous(p, t, shape, dev, 0); };
  s.qv = view(mem.put(s.q.bytes.data(), s.q.bytes.size()), c.dtype, {B, S, H, D});
  s.dkc = mem.put(s.kc.bytes.data(), s.kc.bytes.size());
  void* dvc = mem.put(s.vc.bytes.data(), s.vc.bytes.size());
  s.kcv = paged ? view(s.dkc, c.dtype, {s.num_pages, c.page_size, Hk, D}) : view(s.dkc, c.dtype, {B, s.capacity, Hk, D});
  s.vcv = paged ? view(dvc, c.dtype, {s.num_pages, c.page_size, Hk, D}) : view(dvc, c.dtype, {B, s.capacity, Hk, D});
  s.knv = view(mem.put(s.kn.bytes.data(), s.kn.bytes.size()), c.dtype, {B, S, Hk, D});
  s.vnv = view(mem.put(s.vn.bytes.data(), s.vn.bytes.size()), c.dtype, {B, S, Hk, D});
  s.dout = mem.alloc(s.q.bytes.size());
  s.ov = view(s.dout, c.dtype, {B, S, H, D});
  s.dlse = mem.alloc(static_cast<size_t>(B) * H * S * 4);
  s.lv = view(s.dlse, DType::float32, {B, H, S});
  s.tv = view(mem.put(s.table.data(), s.table.size() * 4), DType::int32, {B, c.max_pages});
  s.sv = view(mem.put(s.lens.data(), s.lens.size() * 4), DType::int32, {B});
  return s;
}

/// Re-uploads the original cache (before an append) and poisons the outputs.
inline void reset(DecodeSetup& s, Memory& mem) {
  mem.upload(s.dkc, s.kc.bytes.data(), s.kc.bytes.size());
  mem.upload(const_cast<void*>(s.vcv.data), s.vc.bytes.data(), s.vc.bytes.size());
  const std::vector<uint8_t> poison(s.q.bytes.size(), 0x7f);
  mem.upload(s.dout, poison.data(), poison.size());
  const std::vector<float> lpoison(static_cast<size_t>(s.c.batch) * s.c.heads * s.c.seqlen_q, 12345.0f);
  mem.upload(s.dlse, lpoison.data(), lpoison.size() * 4);
}

/// Issue 10 item 1 on any device: cached 500 + 20 new tokens on a page table of 512 slots is a CapacityError naming
/// the lengths and the capacity (with the lengths read back, a promise past the capacity, and one exactly at 500), and
/// neither the cache nor out is written; without the append the lengths fit; a negative length is an argument error.
/// Returns the setup (lengths {0, 3} uploaded) for device-specific checks after it.
inline DecodeSetup check_capacity_error(Memory& mem) {
  DecodeCase c;
  c.batch = 2, c.seqlen_q = 20, c.heads = 4, c.heads_kv = 2, c.head_dim = 64, c.page_size = 64, c.max_pages = 8;
  c.lens = {7, 500};
  std::mt19937_64 rng(testing::test_seed());
  DecodeSetup s = make_setup(c, mem, rng);
  reset(s, mem);
  std::vector<uint8_t> out_before(s.q.bytes.size());
  mem.download(out_before.data(), s.dout, out_before.size());
  for (int64_t promise : {0, 600, 500}) {
    DecodeOptions o;
    o.max_seqlen_k = promise;
    expect_error<CapacityError>(
        [&] { paged_decode(s.qv, s.kcv, s.vcv, &s.tv, s.sv, &s.knv, &s.vnv, s.ov, &s.lv, o); }, "",
        {promise ? "max_seqlen_k" : "500", "512", "nothing written"});
    std::vector<uint8_t> kc(s.kc.bytes.size()), out(out_before.size());
    mem.download(kc.data(), s.dkc, kc.size());
    mem.download(out.data(), s.dout, out.size());
    EXPECT_TRUE(kc == s.kc.bytes) << "k_cache written by a rejected call (max_seqlen_k " << promise << ")";
    EXPECT_TRUE(out == out_before) << "out written by a rejected call (max_seqlen_k " << promise << ")";
  }
  paged_decode(s.qv, s.kcv, s.vcv, &s.tv, s.sv, nullptr, nullptr, s.ov, &s.lv, {});
  s.lens = {-1, 3};
  mem.upload(const_cast<void*>(s.sv.data), s.lens.data(), 8);
  expect_error<Error>([&] { paged_decode(s.qv, s.kcv, s.vcv, &s.tv, s.sv, nullptr, nullptr, s.ov, &s.lv, {}); },
                      "cache_seqlens");
  s.lens = {0, 3};
  mem.upload(const_cast<void*>(s.sv.data), s.lens.data(), 8);
  return s;
}

/// float64 reference (and its naive same-precision twin) over the gathered keys: cache, then the appended tokens.
struct Reference {
  testing::RefVarlenShape shape;
  std::vector<double> out, lse, naive_out, naive_lse;
};
inline Reference reference(const DecodeSetup& s) {
  const DecodeCase& c = s.c;
  const int D = c.head_dim, Hk = c.heads_kv, B = c.batch, S = c.seqlen_q;
  Reference r;
  r.shape.num_heads = c.heads, r.shape.num_heads_kv = Hk, r.shape.head_dim = r.shape.head_dim_v = D;
  testing::RefOptions ro;
  ro.softmax_scale = 1.0 / std::sqrt(static_cast<double>(D));
  ro.causal = true;
  ro.window_size_left = c.window;
  ro.softcap = c.softcap;
  r.shape.cu_seqlens_q = {0}, r.shape.cu_seqlens_k = {0};
  std::vector<double> kref, vref;
  for (int b = 0; b < B; ++b) {
    const int sk = s.lens[b] + (c.append ? S : 0);
    r.shape.cu_seqlens_q.push_back(r.shape.cu_seqlens_q.back() + S);
    r.shape.cu_seqlens_k.push_back(r.shape.cu_seqlens_k.back() + sk);
    for (int j = 0; j < sk; ++j) {
      for (int e = 0; e < Hk * D; ++e) {
        if (j < s.lens[b]) {
          kref.push_back(s.kc.val[s.cache_index(b, j) + e]);
          vref.push_back(s.vc.val[s.cache_index(b, j) + e]);
        } else {
          kref.push_back(s.kn.val[(static_cast<size_t>(b) * S + (j - s.lens[b])) * Hk * D + e]);
          vref.push_back(s.vn.val[(static_cast<size_t>(b) * S + (j - s.lens[b])) * Hk * D + e]);
        }
      }
    }
  }
  testing::reference_forward_varlen(r.shape, ro, s.q.val, kref, vref, r.out, r.lse, testing::no_rounding());
  if (c.dtype == DType::float32) {
    r.naive_out = r.out, r.naive_lse = r.lse;
  } else {
    testing::reference_forward_varlen(r.shape, ro, s.q.val, kref, vref, r.naive_out, r.naive_lse,
                                      testing::rounding_to(c.dtype));
  }
  return r;
}

/// Runs paged_decode once; returns (out as doubles, lse) and checks the append when asked.
struct Result {
  std::vector<double> out;
  std::vector<float> lse;
};
inline Result run_case(DecodeSetup& s, Memory& mem, int num_splits, bool check_append, int64_t max_seqlen_k = 0) {
  reset(s, mem);
  DecodeOptions o;
  o.num_splits = num_splits;
  o.softcap = s.c.softcap;
  o.window_size_left = s.c.window;
  o.max_seqlen_k = max_seqlen_k;
  paged_decode(s.qv, s.kcv, s.vcv, s.c.page_size > 0 ? &s.tv : nullptr, s.sv, s.c.append ? &s.knv : nullptr,
               s.c.append ? &s.vnv : nullptr, s.ov, &s.lv, o);
  Result r;
  std::vector<uint8_t> ob(s.q.bytes.size());
  mem.download(ob.data(), s.dout, ob.size());
  r.out = decode_bytes(ob, s.c.dtype);
  r.lse.resize(static_cast<size_t>(s.c.batch) * s.c.heads * s.c.seqlen_q);
  mem.download(r.lse.data(), s.dlse, r.lse.size() * 4);
  if (check_append && s.c.append) {  // the new tokens landed in the right pages, nothing else changed
    std::vector<uint8_t> after(s.kc.bytes.size());
    mem.download(after.data(), s.dkc, after.size());
    std::vector<uint8_t> expect = s.kc.bytes;
    const size_t es = esize(s.c.dtype), row = static_cast<size_t>(s.c.heads_kv) * s.c.head_dim;
    for (int b = 0; b < s.c.batch; ++b)
      for (int i = 0; i < s.c.seqlen_q; ++i)
        std::memcpy(expect.data() + s.cache_index(b, s.lens[b] + i) * es,
                    s.kn.bytes.data() + (static_cast<size_t>(b) * s.c.seqlen_q + i) * row * es, row * es);
    EXPECT_TRUE(after == expect) << "k_cache after append differs from the expected pages";
  }
  return r;
}

/// The whole check of one case: num_splits 1 (+ append check), auto, 7; out within 2× naive; lse likewise (−inf for
/// rows without keys); the split counts agree within rounding.
inline void check_decode(const DecodeCase& c, Memory& mem) {
  SCOPED_TRACE(c.name());
  std::mt19937_64 rng(testing::test_seed() ^ std::hash<std::string>{}(c.name()));
  DecodeSetup s = make_setup(c, mem, rng);
  const Reference ref = reference(s);
  const double naive_err = testing::max_abs_diff(ref.naive_out, ref.out);
  const double naive_lse_err = testing::max_abs_diff(ref.naive_lse, ref.lse);
  const Result one = run_case(s, mem, 1, true), autos = run_case(s, mem, 0, false), forced = run_case(s, mem, 7, false);
  // 1024 splits (the most allowed; most of them empty): on CUDA more partials than the fused combine's shared memory
  // holds below head_dim 256, so the separate combine kernel merges them (src/cuda/decode_params.hpp)
  const Result many = run_case(s, mem, 1024, false);
  const int H = c.heads, S = c.seqlen_q;
  for (const Result* r : {&one, &autos, &forced, &many}) {
    const double err = testing::max_abs_diff(r->out, ref.out);
    EXPECT_LE(err, 2 * naive_err + 1e-5) << "decode out err " << err << " vs naive " << naive_err;
    double lse_err = 0;
    for (int b = 0; b < c.batch; ++b)
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < S; ++i) {
          const double want = ref.lse[static_cast<size_t>(h * ref.shape.total_q() + ref.shape.cu_seqlens_q[b] + i)];
          const double got = r->lse[(static_cast<size_t>(b) * H + h) * S + i];
          if (std::isinf(want)) {
            EXPECT_TRUE(std::isinf(got) && got < 0) << "lse of an empty row must be -inf, got " << got;
          } else {
            const double d = std::fabs(got - want);
            lse_err = std::isnan(d) ? INFINITY : std::max(lse_err, d);
          }
        }
    EXPECT_LE(lse_err, 2 * naive_lse_err + 1e-4) << "decode lse err " << lse_err << " vs naive " << naive_lse_err;
  }
  // Each result is rounded to the output dtype on its own, so two accurate ones may sit a full output ulp apart where
  // the naive computation's error is half of one (run11 call 3: fp16 2.44e-4 vs naive 2.28e-4): 2x the naive error.
  EXPECT_LE(testing::max_abs_diff(one.out, autos.out), 2 * naive_err + 1e-5) << "num_splits 1 vs auto differ";
  EXPECT_LE(testing::max_abs_diff(one.out, forced.out), 2 * naive_err + 1e-5) << "num_splits 1 vs 7 differ";
  EXPECT_LE(testing::max_abs_diff(one.out, many.out), 2 * naive_err + 1e-5) << "num_splits 1 vs 1024 differ";
}

/// Classification of a value: 0 finite, 1 NaN, 2 +inf, 3 -inf.
inline int cls(double x) { return std::isnan(x) ? 1 : (std::isinf(x) ? (x > 0 ? 2 : 3) : 0); }

/// The non-finite contract on any device (/work notes nan-semantics): a NaN / +inf score of a visible key makes the
/// row NaN (out and lse); a non-finite value makes the output channels non-finite, lse unaffected; rows that do not see
/// the bad key are bit-for-bit unchanged (on CUDA too: masked pairs are selected out, never 0 · value); a split whose
/// lse is NaN propagates (num_splits 7); page slots past the lengths never matter.
inline void check_non_finite(Memory& mem, DType dtype) {
  DecodeCase c;
  c.dtype = dtype;
  c.batch = 2, c.seqlen_q = 4, c.heads = 4, c.heads_kv = 2, c.head_dim = 64, c.page_size = 16, c.max_pages = 16;
  c.lens = {100, 37};
  SCOPED_TRACE(std::string("non-finite ") + dtype_name(dtype));
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
      std::memset(kpois.data() + t * Hk * D * esize(dtype), 0xFF, Hk * D * esize(dtype));
      std::memset(vpois.data() + t * Hk * D * esize(dtype), 0xFF, Hk * D * esize(dtype));
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

/// A sequence with no cached and no new keys: out 0, lse −inf. A row whose visible scores are all −inf: NaN
/// (exp(−inf − (−inf)) is NaN, the IEEE definition; only "no visible key" is −inf).
inline void check_empty_rows(Memory& mem, DType dtype) {
  DecodeCase c;
  SCOPED_TRACE(std::string("empty rows ") + dtype_name(dtype));
  c.dtype = dtype, c.batch = 2, c.seqlen_q = 1, c.heads = 2, c.heads_kv = 1, c.head_dim = 64;
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

}  // namespace flashkv::decodetest
