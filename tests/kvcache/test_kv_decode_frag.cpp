// The CUDA quantized decode's register-direct fragments (src/cuda/sm80/decode_frag.hpp), emulated on the host: the
// in-register conversions give the exact Code16 images of every code, the staged-row swizzle keeps ldmatrix
// conflict-free, and one warp's K / V fragments — staged with the swizzle, read by an emulated ldmatrix(.trans) at the
// lanes' addresses, converted, multiplied by an emulated mma.m16n8k16 with the permuted Q / the scores' P — give
// exactly Q · image(K)ᵀ and P · image(V) at the channels the kernel's epilogue writes them to — in the 16-row layout
// and in the keys-as-M one (sm80/decode_keys_m.cuh: Sᵀ = K · Qᵀ, Oᵀ = Vᵀ · Pᵀ, Pᵀ by an emulated movmatrix). The GPU runs the same
// functions (CudaQuantKVCache.* / CudaDecode.* check the whole decode on the H200).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/float16.hpp"
#include "cuda/sm80/decode_frag.hpp"
#include "kv_test_util.hpp"
#include "kvcache/format/traits.hpp"

using namespace flashkv;
namespace frag = flashkv::cuda::sm80::frag;

namespace {

float half_value(uint32_t reg, int hi, bool bf16) {
  const auto h = static_cast<uint16_t>(reg >> (16 * hi));
  return bf16 ? bf16_to_float(h) : fp16_to_float(h);
}

kv::KVFormatId format_of(kv::KVCode c) {
  switch (c) {
    case kv::KVCode::e4m3: return kv::KVFormatId::fp8_e4m3;
    case kv::KVCode::e5m2: return kv::KVFormatId::fp8_e5m2;
    case kv::KVCode::u8: return kv::KVFormatId::int8;
    default: return kv::KVFormatId::int4;
  }
}

/// (code_value − kOff) · kMul: the image the decode's MMAs must see.
template <kv::KVCode C, bool kBf16, bool kCentered = true>
double image(uint32_t raw) {
  using Code = frag::FragCode<C, kBf16, kCentered>;
  const kv::KVHalfFormat f = kv::describe(format_of(C), false, 0, true, 128);
  return (static_cast<double>(f.code_value(raw)) - Code::kOff) * Code::kMul;
}

template <kv::KVCode C, bool kBf16, bool kCentered = true>
void check_codes() {
  SCOPED_TRACE(std::string("code ") + std::to_string(static_cast<int>(C)) + (kBf16 ? " bf16" : " fp16") +
               (kCentered ? "" : " uncentred"));
  using Code = frag::FragCode<C, kBf16, kCentered>;
  const kv::KVHalfFormat f = kv::describe(format_of(C), false, 0, true, 128);
  int bad = 0;
  for (uint32_t b = 0; b < 256; ++b) {
    const uint32_t bytes[4] = {b, (b + 37) & 255u, (b + 101) & 255u, (b + 203) & 255u};
    const uint32_t w = bytes[0] | bytes[1] << 8 | bytes[2] << 16 | bytes[3] << 24;
    auto expect = [&](uint32_t reg, int hi, uint32_t raw) {
      if (!std::isfinite(f.code_value(raw))) return;  // fp8 NaN / inf codes never occur in appended pages
      const double want = image<C, kBf16, kCentered>(raw), got = half_value(reg, hi, kBf16);
      if (got != want && bad++ < 5) ADD_FAILURE() << "raw " << raw << ": " << got << " vs " << want;
    };
    if constexpr (kv::code_bits(C) == 8) {
      uint32_t x02 = 0, x13 = 0;
      Code::pairs8(w, x02, x13);
      expect(x02, 0, bytes[0]), expect(x02, 1, bytes[2]), expect(x13, 0, bytes[1]), expect(x13, 1, bytes[3]);
    } else {
      uint32_t x[4];
      Code::pairs4(w, x);
      for (int plane = 0; plane < 2; ++plane) {
        auto nib = [&](int i) { return (bytes[i] >> (4 * plane)) & 15u; };
        expect(x[2 * plane], 0, nib(0)), expect(x[2 * plane], 1, nib(2));
        expect(x[2 * plane + 1], 0, nib(1)), expect(x[2 * plane + 1], 1, nib(3));
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

}  // namespace

TEST(DecodeFrag, ConversionsGiveTheExactCodeImages) {
  check_codes<kv::KVCode::e4m3, true>();
  check_codes<kv::KVCode::e4m3, false>();
  check_codes<kv::KVCode::e5m2, true>();
  check_codes<kv::KVCode::e5m2, false>();
  check_codes<kv::KVCode::u8, true>();
  check_codes<kv::KVCode::u8, false>();
  check_codes<kv::KVCode::u4, true>();
  check_codes<kv::KVCode::u4, false>();
  check_codes<kv::KVCode::u4, true, false>();  // K images of int4 under bf16 queries (KvQuantSource::kCenteredK)
}

TEST(DecodeFrag, SwizzleIsABijectionAndLdmatrixIsConflictFree) {
  for (int chunks : {2, 4, 8, 16}) {
    SCOPED_TRACE("chunks " + std::to_string(chunks));
    for (int r = 0; r < 64; ++r) {
      std::vector<int> seen(chunks, 0);
      for (int c = 0; c < chunks; ++c) {
        const int p = frag::swizzled_chunk(r, c, chunks);
        ASSERT_TRUE(p >= 0 && p < chunks);
        ++seen[p];
      }
      for (int c = 0; c < chunks; ++c) EXPECT_EQ(seen[c], 1) << "row " << r;
    }
    // one ldmatrix matrix: 8 consecutive rows (8-aligned), one logical chunk -> 8 different 16-byte bank groups
    for (int r0 = 0; r0 < 64; r0 += 8)
      for (int c = 0; c < chunks; ++c) {
        int groups = 0;
        for (int r = r0; r < r0 + 8; ++r) groups |= 1 << ((r * chunks + frag::swizzled_chunk(r, c, chunks)) % 8);
        EXPECT_EQ(groups, 0xff) << "rows " << r0 << " chunk " << c;
      }
    // the lanes' addresses: ldmatrix #i = lane offset ^ 32 i is row ldsm_row, logical chunk ldsm_chunk, swizzled
    for (int warp = 0; warp < 4; ++warp)
      for (int lane = 0; lane < 32; ++lane)
        for (int i = 0; i < chunks / 2; ++i) {
          const int r = frag::ldsm_row(warp, lane);
          EXPECT_EQ(frag::ldsm_lane_offset(warp, lane, chunks) ^ (32u * i),
                    static_cast<uint32_t>(r * chunks * 16 + frag::swizzled_chunk(r, frag::ldsm_chunk(i, lane), chunks) * 16));
        }
  }
}

TEST(DecodeFrag, QPermutationIsTheKChannelOrder) {
  uint32_t w[8], n[8];
  for (int i = 0; i < 8; ++i) w[i] = static_cast<uint32_t>(2 * i) | static_cast<uint32_t>(2 * i + 1) << 16;  // channel ids
  frag::permute_q_words(w, n);
  for (int j = 0; j < 16; ++j) EXPECT_EQ((n[j / 2] >> (16 * (j % 2))) & 0xffffu, static_cast<uint32_t>(frag::k_channel(j)));
  std::vector<int> seen(16, 0);
  for (int j = 0; j < 16; ++j) ++seen[frag::k_channel(j)];
  for (int c = 0; c < 16; ++c) EXPECT_EQ(seen[c], 1);
}

namespace {

// PTX mma.m16n8k16 fragment layouts (lane = 4g + t), independent of decode_frag.hpp
double a_elem(const uint32_t (&a)[32][4], int row, int k, bool bf16) {  // A 16 x 16
  const int g = row % 8, t = (k % 8) / 2, reg = (row / 8) + 2 * (k / 8);
  return half_value(a[4 * g + t][reg], k % 2, bf16);
}
double b_elem(const uint32_t (&b)[32][2], int k, int n, bool bf16) {  // B 16 x 8
  const int t = (k % 8) / 2;
  return half_value(b[4 * n + t][k / 8], k % 2, bf16);
}
/// ldmatrix.x4 (.trans): lane l's register m from the 8 rows of matrix m (16 bytes each at the addresses of lanes
/// 8m .. 8m + 7); not trans: row l / 4, b16 elements 2 (l % 4), + 1; trans: element l / 4 of rows 2 (l % 4), + 1.
void ldmatrix(const std::vector<uint8_t>& smem, const uint32_t (&addr)[32], bool trans, uint32_t (&out)[32][4]) {
  auto elem = [&](int m, int row, int e) {
    const uint8_t* p = smem.data() + addr[8 * m + row] + 2 * e;
    return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8;
  };
  for (int l = 0; l < 32; ++l)
    for (int m = 0; m < 4; ++m)
      out[l][m] = trans ? elem(m, 2 * (l % 4), l / 4) | elem(m, 2 * (l % 4) + 1, l / 4) << 16
                        : elem(m, l / 4, 2 * (l % 4)) | elem(m, l / 4, 2 * (l % 4) + 1) << 16;
}

uint32_t pack(double lo, double hi, bool bf16) {
  auto h = [&](double x) -> uint32_t { return bf16 ? float_to_bf16(static_cast<float>(x)) : float_to_fp16(static_cast<float>(x)); };
  return h(lo) | h(hi) << 16;
}

/// One block of 64 keys of random codes (head_dim d), staged as KvQuantSource::load stages it, and each warp's
/// scores / P·V through the fragments against the direct products of the images.
template <kv::KVCode C, bool kBf16, int kHeadDim, bool kCenteredK = true>
void check_block(uint64_t salt) {
  constexpr int kBits = kv::code_bits(C), kRow = kHeadDim * kBits / 8, kChunks = kRow / 16;
  static_assert(frag::shape_ok(kChunks), "a register-direct shape");
  SCOPED_TRACE("code " + std::to_string(static_cast<int>(C)) + (kBf16 ? " bf16" : " fp16") + " head_dim " +
               std::to_string(kHeadDim) + (kCenteredK ? "" : " uncentred K"));
  auto g = kvtest::rng(salt);
  std::uniform_int_distribution<int> byte(0, 255), small(-4, 4), prob(0, 3);
  std::vector<uint8_t> codes(64 * kRow), staged(64 * kRow);
  for (auto& c : codes) {
    c = static_cast<uint8_t>(byte(g));
    if (C == kv::KVCode::e4m3 && (c & 0x7f) == 0x7f) c &= 0xfe;  // no NaN codes (never appended)
    if (C == kv::KVCode::e5m2 && (c & 0x7f) > 0x7b) c &= 0xf3;   // no inf / NaN codes
  }
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < kChunks; ++c)
      for (int b = 0; b < 16; ++b)
        staged[r * kRow + frag::swizzled_chunk(r, c, kChunks) * 16 + b] = codes[r * kRow + c * 16 + b];
  auto img = [&](int key, int ch, bool k_half) {  // the image of channel ch of block row key
    uint32_t raw = codes[key * kRow + ch];
    if (kBits == 4) raw = (codes[key * kRow + ch % (kHeadDim / 2)] >> (4 * (ch / (kHeadDim / 2)))) & 15u;
    return k_half ? image<C, kBf16, kCenteredK>(raw) : image<C, kBf16>(raw);
  };
  std::vector<double> q(16 * kHeadDim), p(16 * 64);
  for (auto& x : q) x = small(g);
  for (auto& x : p) x = prob(g);
  for (int warp = 0; warp < 4; ++warp) {
    uint32_t kw[kChunks / 2][32][4], vw[kChunks / 2][32][4];
    for (int i = 0; i < kChunks / 2; ++i) {
      uint32_t addr[32];
      for (int l = 0; l < 32; ++l) addr[l] = frag::ldsm_lane_offset(warp, l, kChunks) ^ (32u * i);
      ldmatrix(staged, addr, false, kw[i]);
      ldmatrix(staged, addr, true, vw[i]);
    }
    // scores: per 16-channel slice, A = the permuted Q slice, B = k_fragment
    std::vector<double> s(16 * 16, 0.0);
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t a[32][4], b[2][32][2];
      for (int l = 0; l < 32; ++l) {
        const int gg = l / 4, t = l % 4;
        for (int hh = 0; hh < 2; ++hh) {
          uint32_t w[8], n[8];
          for (int i = 0; i < 8; ++i) {
            const double* row = &q[(gg + 8 * hh) * kHeadDim + 16 * kk];
            w[i] = pack(row[2 * i], row[2 * i + 1], kBf16);
          }
          frag::permute_q_words(w, n);  // the kernel's permute_q_tile, per row and slice
          a[l][hh] = n[t], a[l][hh + 2] = n[4 + t];
        }
        uint32_t lane_w[kChunks / 2][4], bk[4];
        for (int i = 0; i < kChunks / 2; ++i)
          for (int m = 0; m < 4; ++m) lane_w[i][m] = kw[i][l][m];
        frag::k_fragment<C, kBf16, kChunks, kCenteredK>(lane_w, kk, bk);
        b[0][l][0] = bk[0], b[0][l][1] = bk[1], b[1][l][0] = bk[2], b[1][l][1] = bk[3];
      }
      for (int nt = 0; nt < 2; ++nt)
        for (int row = 0; row < 16; ++row)
          for (int n = 0; n < 8; ++n)
            for (int k = 0; k < 16; ++k) s[row * 16 + nt * 8 + n] += a_elem(a, row, k, kBf16) * b_elem(b[nt], k, n, kBf16);
    }
    int bad = 0;
    for (int row = 0; row < 16; ++row)
      for (int key = 0; key < 16; ++key) {
        double want = 0;
        for (int c = 0; c < kHeadDim; ++c) want += q[row * kHeadDim + c] * img(warp * 16 + key, c, true);
        if (s[row * 16 + key] != want && bad++ < 5)
          ADD_FAILURE() << "warp " << warp << " score (" << row << ", " << key << "): " << s[row * 16 + key] << " vs " << want;
      }
    // P·V: A = P of the warp's 16 keys (natural order, the scores' layout), B = v_fragment; o[dt][e] at v_channel
    uint32_t a[32][4];
    for (int l = 0; l < 32; ++l) {
      const int gg = l / 4, t = l % 4;
      for (int reg = 0; reg < 4; ++reg) {
        const int row = gg + 8 * (reg % 2), key = warp * 16 + 2 * t + 8 * (reg / 2);
        a[l][reg] = pack(p[row * 64 + key], p[row * 64 + key + 1], kBf16);
      }
    }
    for (int sl = 0; sl < kHeadDim / 16; ++sl) {
      uint32_t b[2][32][2];
      for (int l = 0; l < 32; ++l) {
        uint32_t lane_w[kChunks / 2][4], bv[4];
        for (int i = 0; i < kChunks / 2; ++i)
          for (int m = 0; m < 4; ++m) lane_w[i][m] = vw[i][l][m];
        frag::v_fragment<C, kBf16, kChunks>(lane_w, sl, bv);
        b[0][l][0] = bv[0], b[0][l][1] = bv[1], b[1][l][0] = bv[2], b[1][l][1] = bv[3];
      }
      for (int par = 0; par < 2; ++par)
        for (int l = 0; l < 32; ++l)
          for (int e = 0; e < 4; ++e) {
            const int row = l / 4 + 8 * (e / 2), n = 2 * (l % 4) + (e % 2), dt = 2 * sl + par;
            double o = 0;
            for (int k = 0; k < 16; ++k) o += a_elem(a, row, k, kBf16) * b_elem(b[par], k, n, kBf16);
            const int ch = frag::v_channel(dt, e, l % 4);
            double want = 0;
            for (int key = 0; key < 16; ++key) want += p[row * 64 + warp * 16 + key] * img(warp * 16 + key, ch, false);
            if (o != want && bad++ < 5)
              ADD_FAILURE() << "warp " << warp << " o[" << dt << "][" << e << "] lane " << l << " (channel " << ch
                            << "): " << o << " vs " << want;
          }
    }
    // keys as M (sm80/decode_keys_m.cuh, CTAs of <= 8 query rows; the kernel's own frag::keys_m_* helpers): Sᵀ = K · Qᵀ with A = {bk0, bk2, bk1, bk3} (the
    // B fragments of keys 0..7 / 8..15 as rows g / g + 8) and B = the Q fragment's rows 0..7 {a0, a2}; Pᵀ's B
    // fragment = movmatrix.trans of the scores' C-layout halves; Oᵀ = Vᵀ · Pᵀ with A = {bv0, bv2, bv1, bv3}, whose
    // rows g / g + 8 of slice s are channels 16s + 2g / 16s + 2g + 1
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t at[32][4], bt[32][2];
      for (int l = 0; l < 32; ++l) {
        uint32_t w[8], n[8];
        for (int i = 0; i < 8; ++i) {
          const double* row = &q[(l / 4) * kHeadDim + 16 * kk];
          w[i] = pack(row[2 * i], row[2 * i + 1], kBf16);
        }
        frag::permute_q_words(w, n);
        const uint32_t qa[4] = {n[l % 4], 0u, n[4 + l % 4], 0u};  // the Q A fragment's rows 0..7 (a0, a2)
        frag::keys_m_q_operand(qa, bt[l]);
        uint32_t lane_w[kChunks / 2][4], bk[4];
        for (int i = 0; i < kChunks / 2; ++i)
          for (int m = 0; m < 4; ++m) lane_w[i][m] = kw[i][l][m];
        frag::k_fragment<C, kBf16, kChunks, kCenteredK>(lane_w, kk, bk);
        frag::keys_m_operand(bk, at[l]);
      }
      for (int key = 0; key < 16; ++key)
        for (int n = 0; n < 8; ++n) {
          double st = 0;
          for (int k = 0; k < 16; ++k) st += a_elem(at, key, k, kBf16) * b_elem(bt, k, n, kBf16);
          double want = 0;
          for (int k = 0; k < 16; ++k) {
            const int c = 16 * kk + frag::k_channel(k);
            want += q[n * kHeadDim + c] * img(warp * 16 + key, c, true);
          }
          if (st != want && bad++ < 5)
            ADD_FAILURE() << "warp " << warp << " keys-as-M slice " << kk << " score (" << n << ", " << key << "): " << st
                          << " vs " << want;
        }
    }
    uint32_t pc[2][32], pt[32][2];  // P's C-layout halves (keys g + 8h, queries 2t, 2t + 1), then transposed
    for (int l = 0; l < 32; ++l)
      for (int h = 0; h < 2; ++h) {
        const int key = warp * 16 + l / 4 + 8 * h, qr = 2 * (l % 4);
        pc[h][l] = pack(p[qr * 64 + key], p[(qr + 1) * 64 + key], kBf16);
      }
    auto half16 = [](uint32_t w, int hi) { return (w >> (16 * hi)) & 0xffffu; };
    for (int l = 0; l < 32; ++l)
      for (int h = 0; h < 2; ++h) {  // movmatrix.trans: out row g, columns 2t, 2t + 1 = in (2t, g), (2t + 1, g)
        const int gg = l / 4, t = l % 4;
        pt[l][h] = half16(pc[h][4 * (2 * t) + gg / 2], gg % 2) | half16(pc[h][4 * (2 * t + 1) + gg / 2], gg % 2) << 16;
      }
    for (int sl = 0; sl < kHeadDim / 16; ++sl) {
      uint32_t av[32][4];
      for (int l = 0; l < 32; ++l) {
        uint32_t lane_w[kChunks / 2][4], bv[4];
        for (int i = 0; i < kChunks / 2; ++i)
          for (int m = 0; m < 4; ++m) lane_w[i][m] = vw[i][l][m];
        frag::v_fragment<C, kBf16, kChunks>(lane_w, sl, bv);
        frag::keys_m_operand(bv, av[l]);
      }
      for (int row = 0; row < 16; ++row)
        for (int n = 0; n < 8; ++n) {
          double o = 0;
          for (int k = 0; k < 16; ++k) o += a_elem(av, row, k, kBf16) * b_elem(pt, k, n, kBf16);
          const int ch = frag::keys_m_channel(sl, row);
          EXPECT_EQ(ch, 16 * sl + 2 * (row % 8) + row / 8);  // independent of the helper: the derivation above
          double want = 0;
          for (int key = 0; key < 16; ++key) want += p[n * 64 + warp * 16 + key] * img(warp * 16 + key, ch, false);
          if (o != want && bad++ < 5)
            ADD_FAILURE() << "warp " << warp << " keys-as-M o (channel " << ch << ", query " << n << "): " << o << " vs "
                          << want;
        }
    }
    EXPECT_EQ(bad, 0);
  }
}

}  // namespace

TEST(DecodeFrag, OneWarpsFragmentsGiveTheExactProducts) {
  check_block<kv::KVCode::u4, true, 64, false>(1);
  check_block<kv::KVCode::u4, true, 128>(2);
  check_block<kv::KVCode::u4, true, 128, false>(13);
  check_block<kv::KVCode::u4, false, 128>(3);
  check_block<kv::KVCode::u4, true, 256>(4);
  check_block<kv::KVCode::u8, true, 64>(5);
  check_block<kv::KVCode::u8, true, 128>(6);
  check_block<kv::KVCode::u8, false, 128>(7);
  check_block<kv::KVCode::u8, true, 256>(8);
  check_block<kv::KVCode::e4m3, true, 128>(9);
  check_block<kv::KVCode::e4m3, false, 128>(10);
  check_block<kv::KVCode::e5m2, true, 128>(11);
  check_block<kv::KVCode::e5m2, false, 256>(12);
}
