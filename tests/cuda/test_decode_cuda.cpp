// CUDA split-KV paged decode vs the float64 reference over the same pages (gathered), incl. appending new K/V,
// GQA packing, page sizes 16..256, a contiguous cache, num_splits 1 vs auto vs forced, and the typed errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "cuda/decode_cuda.hpp"
#include "cuda_test_util.hpp"
#include "flashkv/error.hpp"

namespace flashkv::cudatest {
namespace {

struct DecodeCase {
  DType dtype = DType::bfloat16;
  int batch = 3, seqlen_q = 1, heads = 32, heads_kv = 8, head_dim = 128;
  int page_size = 64;  ///< 0 = contiguous cache
  int max_pages = 20;
  bool append = true;
  float softcap = 0;
  std::string name() const {
    return std::string(dtype_name(dtype)) + " b=" + std::to_string(batch) + " sq=" + std::to_string(seqlen_q) +
           " h=" + std::to_string(heads) + "/" + std::to_string(heads_kv) + " d=" + std::to_string(head_dim) +
           " page=" + std::to_string(page_size) + (append ? " append" : "") +
           (softcap > 0 ? " softcap" : "");
  }
};

struct DecodeResult {
  std::vector<double> out;
  std::vector<float> lse;
};

void check_decode(const DecodeCase& c) {
  SCOPED_TRACE(c.name());
  std::mt19937_64 rng(test_seed() ^ std::hash<std::string>{}(c.name()));
  const int D = c.head_dim, Hk = c.heads_kv, H = c.heads, B = c.batch, S = c.seqlen_q;
  const bool paged = c.page_size > 0;
  const int tokens_per_seq = paged ? c.max_pages * c.page_size : c.max_pages * 64;  // capacity
  const int num_pages = paged ? B * c.max_pages + 3 : 0;
  // Sequence lengths already in the cache: 0, a page boundary, and random (room left for the append).
  std::vector<int32_t> lens(B);
  for (int b = 0; b < B; ++b) {
    const int room = tokens_per_seq - (c.append ? S : 0);
    lens[b] = b == 0 ? 0 : (b == 1 ? std::min(room, (paged ? c.page_size : 64) * 3) : static_cast<int>(rng() % room));
  }
  // Page table: a random permutation of the pages.
  std::vector<int32_t> perm(std::max(num_pages, 1));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> table(static_cast<size_t>(B) * c.max_pages);
  for (size_t i = 0; i < table.size(); ++i) table[i] = paged ? perm[i] : 0;
  const size_t cache_elems = paged ? static_cast<size_t>(num_pages) * c.page_size * Hk * D
                                   : static_cast<size_t>(B) * tokens_per_seq * Hk * D;
  HostTensor kc = random_tensor(cache_elems, c.dtype, rng), vc = random_tensor(cache_elems, c.dtype, rng);
  HostTensor q = random_tensor(static_cast<size_t>(B) * S * H * D, c.dtype, rng);
  HostTensor kn = random_tensor(static_cast<size_t>(B) * S * Hk * D, c.dtype, rng);
  HostTensor vn = random_tensor(kn.bits.size(), c.dtype, rng);
  auto cache_index = [&](int b, int j) -> size_t {  // element offset of token j of sequence b
    if (!paged) return (static_cast<size_t>(b) * tokens_per_seq + j) * Hk * D;
    return (static_cast<size_t>(table[b * c.max_pages + j / c.page_size]) * c.page_size + j % c.page_size) * Hk * D;
  };
  // Reference: gather every sequence (cache then appended tokens) into packed rows.
  RefVarlenShape rp;
  rp.num_heads = H, rp.num_heads_kv = Hk, rp.head_dim = rp.head_dim_v = D;
  RefOptions ro;
  ro.softmax_scale = 1.0 / std::sqrt(static_cast<double>(D));
  ro.causal = true;  // bottom-right: query i of S sees the cache and the new tokens up to its own
  ro.softcap = c.softcap;
  rp.cu_seqlens_q = {0}, rp.cu_seqlens_k = {0};
  std::vector<double> kref, vref;
  for (int b = 0; b < B; ++b) {
    const int sk = lens[b] + (c.append ? S : 0);
    rp.cu_seqlens_q.push_back(rp.cu_seqlens_q.back() + S);
    rp.cu_seqlens_k.push_back(rp.cu_seqlens_k.back() + sk);
    for (int j = 0; j < sk; ++j) {
      for (int e = 0; e < Hk * D; ++e) {
        if (j < lens[b]) {
          kref.push_back(kc.val[cache_index(b, j) + e]);
          vref.push_back(vc.val[cache_index(b, j) + e]);
        } else {
          kref.push_back(kn.val[(static_cast<size_t>(b) * S + (j - lens[b])) * Hk * D + e]);
          vref.push_back(vn.val[(static_cast<size_t>(b) * S + (j - lens[b])) * Hk * D + e]);
        }
      }
    }
  }
  struct {
    std::vector<double> out, lse;  // out [B·S, H, D], lse [H, B·S]
  } ref, naive;
  reference_forward_varlen(rp, ro, q.val, kref, vref, ref.out, ref.lse, no_rounding());
  reference_forward_varlen(rp, ro, q.val, kref, vref, naive.out, naive.lse, rounding_to(c.dtype));
  const double naive_err = max_abs_diff(naive.out, ref.out);
  const double naive_lse_err = max_abs_diff(naive.lse, ref.lse);  // rows with no key: -inf in both

  auto run = [&](int num_splits, bool check_append) -> DecodeResult {
    DevBuf dq(q.bits.size() * 2), dkc(kc.bits.size() * 2), dvc(vc.bits.size() * 2), dkn(kn.bits.size() * 2),
        dvn(vn.bits.size() * 2), dout(q.bits.size() * 2), dlse(static_cast<size_t>(B) * H * S * 4),
        dtab(table.size() * 4), dlens(lens.size() * 4);
    dq.upload(q.bits), dkc.upload(kc.bits), dvc.upload(vc.bits), dkn.upload(kn.bits), dvn.upload(vn.bits);
    dtab.upload(table), dlens.upload(lens);
    dout.poison(), dlse.poison();
    const TensorView qv = dev_view(dq, c.dtype, {B, S, H, D});
    const TensorView kcv = paged ? dev_view(dkc, c.dtype, {num_pages, c.page_size, Hk, D})
                                 : dev_view(dkc, c.dtype, {B, tokens_per_seq, Hk, D});
    const TensorView vcv = paged ? dev_view(dvc, c.dtype, {num_pages, c.page_size, Hk, D})
                                 : dev_view(dvc, c.dtype, {B, tokens_per_seq, Hk, D});
    const TensorView knv = dev_view(dkn, c.dtype, {B, S, Hk, D}), vnv = dev_view(dvn, c.dtype, {B, S, Hk, D});
    const TensorView ov = dev_view(dout, c.dtype, {B, S, H, D});
    const TensorView lv = dev_view(dlse, DType::float32, {B, H, S});
    const TensorView tv = dev_view(dtab, DType::int32, {B, c.max_pages});
    const TensorView sv = dev_view(dlens, DType::int32, {B});
    cuda::DecodeOptions o;
    o.num_splits = num_splits;
    o.softcap = c.softcap;
    cuda::decode_attention_cuda(qv, kcv, vcv, paged ? &tv : nullptr, sv, c.append ? &knv : nullptr,
                                c.append ? &vnv : nullptr, ov, &lv, o);
    DecodeResult r;
    r.out = decode(dout.download<uint16_t>(q.bits.size()), c.dtype);
    r.lse = dlse.download<float>(static_cast<size_t>(B) * H * S);
    if (check_append && c.append) {  // the new tokens landed in the right pages, nothing else changed
      const auto kc_after = dkc.download<uint16_t>(kc.bits.size());
      std::vector<uint16_t> expect = kc.bits;
      for (int b = 0; b < B; ++b)
        for (int i = 0; i < S; ++i)
          for (int e = 0; e < Hk * D; ++e)
            expect[cache_index(b, lens[b] + i) + e] = kn.bits[(static_cast<size_t>(b) * S + i) * Hk * D + e];
      EXPECT_TRUE(kc_after == expect) << "k_cache after append differs from the expected pages";
    }
    return r;
  };
  const DecodeResult one = run(1, true), autos = run(0, false), forced = run(7, false);
  for (const auto* r : {&one, &autos, &forced}) {
    const double err = max_abs_diff(r->out, ref.out);
    EXPECT_LE(err, 2 * naive_err + 1e-5) << "decode out err " << err << " vs naive " << naive_err;
    double lse_err = 0;  // same rule as the forward tests: <= 2x the naive same-precision lse error
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < S; ++i) {
          const double want = ref.lse[static_cast<size_t>(h * rp.total_q() + rp.cu_seqlens_q[b] + i)];
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
  EXPECT_LE(max_abs_diff(one.out, autos.out), naive_err + 1e-5) << "num_splits 1 vs auto differ beyond rounding";
  EXPECT_LE(max_abs_diff(one.out, forced.out), naive_err + 1e-5) << "num_splits 1 vs 7 differ beyond rounding";
}

TEST(CudaDecode, PagedGqaVsReference) {
  for (DType t : {DType::bfloat16, DType::float16}) {
    for (int page : {16, 64, 256}) {
      DecodeCase c;
      c.dtype = t, c.page_size = page, c.max_pages = page == 256 ? 6 : 24;
      check_decode(c);
    }
  }
}

TEST(CudaDecode, VariantsVsReference) {
  DecodeCase c;
  c.head_dim = 64, c.seqlen_q = 4, c.heads = 8, c.heads_kv = 2;  // 16 packed rows per kv head
  check_decode(c);
  c.seqlen_q = 3, c.heads = 12, c.heads_kv = 1, c.append = false, c.softcap = 20.f;  // MQA, 36 rows -> 3 tiles
  check_decode(c);
  c.page_size = 0, c.append = true, c.softcap = 0, c.dtype = DType::float16;  // contiguous cache
  check_decode(c);
}

TEST(CudaDecode, TypedErrors) {
  DevBuf q(2 * 8 * 64 * 2), kc(4 * 24 * 2 * 64 * 2), out(2 * 8 * 64 * 2), tab(2 * 4 * 4), lens(2 * 4);
  const TensorView qv = dev_view(q, DType::bfloat16, {2, 1, 8, 64});
  const TensorView bad_page = dev_view(kc, DType::bfloat16, {4, 24, 2, 64});
  const TensorView ov = dev_view(out, DType::bfloat16, {2, 1, 8, 64});
  const TensorView tv = dev_view(tab, DType::int32, {2, 4});
  const TensorView sv = dev_view(lens, DType::int32, {2});
  try {
    cuda::decode_attention_cuda(qv, bad_page, bad_page, &tv, sv, nullptr, nullptr, ov, nullptr, {});
    ADD_FAILURE() << "expected an Error for page_size 24";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("page_size"), std::string::npos) << e.what();
  }
  TensorView qf = qv;
  qf.dtype = DType::float32;
  EXPECT_THROW(cuda::decode_attention_cuda(qf, bad_page, bad_page, &tv, sv, nullptr, nullptr, ov, nullptr, {}),
               TypeError);
}

}  // namespace
}  // namespace flashkv::cudatest
