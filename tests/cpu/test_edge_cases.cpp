// Edge cases of the attention semantics (include/flashkv/attention.hpp EDGES), the comparison variants, varlen,
// strides, threading and device dispatch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attention_harness.hpp"
#include "common/reference.hpp"
#include "core/backend.hpp"
#include "flashkv/attention.hpp"
#include "flashkv/error.hpp"

using namespace flashkv;
using namespace flashkv::testing;

namespace {

const Algorithm kAlgorithms[] = {Algorithm::tiled, Algorithm::v1_order, Algorithm::naive};
const double kInf = std::numeric_limits<double>::infinity();

void expect_ok(const CheckResult& r) { EXPECT_TRUE(r.ok) << r.report; }

// ---- fully masked rows, empty keys -----------------------------------------------------------------------------------

TEST(EdgeCases, FullyMaskedRowsGiveExactZerosAndMinusInfLse) {
  // causal with seqlen_q > seqlen_k: the first seqlen_q − seqlen_k rows see no key (bottom-right alignment).
  for (Algorithm alg : kAlgorithms) {
    for (DType t : {DType::float32, DType::float16, DType::bfloat16}) {
      std::mt19937_64 rng = make_rng(0x3001);
      const int64_t sq = 150, sk = 40;
      HostTensor q(t, {1, sq, 2, 16}), k(t, {1, sk, 2, 16}), v(t, {1, sk, 2, 16}), out(t, {1, sq, 2, 16});
      HostTensor lse(DType::float32, {1, 2, sq});
      q.randn(rng);
      k.randn(rng);
      v.randn(rng);
      out.fill(std::nan(""));
      AttentionOptions o;
      o.causal = true;
      o.algorithm = alg;
      attention_forward(q.view, k.view, v.view, out.view, &lse.view, o);
      for (int64_t i = 0; i < sq; ++i) {
        for (int64_t h = 0; h < 2; ++h) {
          const double l = lse.get(h * sq + i);
          if (i < sq - sk) {
            EXPECT_EQ(l, -kInf) << "row " << i;
            for (int64_t c = 0; c < 16; ++c) EXPECT_EQ(out.get((i * 2 + h) * 16 + c), 0.0);
          } else {
            EXPECT_TRUE(std::isfinite(l)) << "row " << i;
          }
        }
      }
      // and the gradients of masked rows are exactly zero, never NaN
      if (alg == Algorithm::tiled) {
        HostTensor dout = out, dq = q, dk = k, dv = v;
        dout.randn(rng);
        attention_backward(q.view, k.view, v.view, out.view, lse.view, dout.view, dq.view, dk.view, dv.view, o);
        for (int64_t i = 0; i < sq - sk; ++i) {
          for (int64_t c = 0; c < 2 * 16; ++c) EXPECT_EQ(dq.get(i * 32 + c), 0.0);
        }
        for (double x : dk.to_double()) EXPECT_TRUE(std::isfinite(x));
      }
    }
  }
}

TEST(EdgeCases, SeqlenKZeroGivesZeros) {
  for (Algorithm alg : kAlgorithms) {
    std::mt19937_64 rng = make_rng(0x3002);
    HostTensor q(DType::float32, {2, 9, 2, 8}), k(DType::float32, {2, 0, 1, 8}), v(DType::float32, {2, 0, 1, 8});
    HostTensor out(DType::float32, {2, 9, 2, 8}), lse(DType::float32, {2, 2, 9});
    q.randn(rng);
    out.fill(std::nan(""));
    AttentionOptions o;
    o.algorithm = alg;
    attention_forward(q.view, k.view, v.view, out.view, &lse.view, o);
    for (double x : out.to_double()) EXPECT_EQ(x, 0.0);
    for (double x : lse.to_double()) EXPECT_EQ(x, -kInf);
    HostTensor dout = out, dq = q;
    dout.randn(rng);
    dq.fill(std::nan(""));
    attention_backward(q.view, k.view, v.view, out.view, lse.view, dout.view, dq.view, k.view, v.view, o);
    for (double x : dq.to_double()) EXPECT_EQ(x, 0.0);
  }
}

TEST(EdgeCases, SeqlenQGreaterThanSeqlenKCausalAndWindows) {
  AttnCase c;
  c.seqlen_q = 203;
  c.seqlen_k = 113;
  c.causal = true;
  c.num_heads = 2;
  expect_ok(check_forward(c, 0x3003));
  expect_ok(check_backward(c, 0x3004));
  c.causal = false;
  c.window_size_left = 0;  // only the diagonal key (plus none to the left): many empty rows
  c.window_size_right = 0;
  expect_ok(check_forward(c, 0x3005));
  expect_ok(check_backward(c, 0x3006));
}

TEST(EdgeCases, SlidingWindowWMinusOneZero) {
  for (int32_t w : {1, 2, 64, 65, 300}) {
    AttnCase c;
    c.seqlen_q = 190;
    c.seqlen_k = 190;
    c.window_size_left = w - 1;
    c.window_size_right = 0;
    c.dtype = DType::bfloat16;
    expect_ok(check_forward(c, 0x3007 + w));
  }
  // A window at least as long as the sequence is exactly causal.
  std::mt19937_64 rng = make_rng(0x3008);
  HostTensor q(DType::float32, {1, 100, 1, 32}), k(DType::float32, {1, 130, 1, 32}), v = k, o1 = q, o2 = q;
  q.randn(rng);
  k.randn(rng);
  v.randn(rng);
  AttentionOptions causal;
  causal.causal = true;
  AttentionOptions window;
  window.window_size_left = 200;
  window.window_size_right = 0;
  attention_forward(q.view, k.view, v.view, o1.view, nullptr, causal);
  attention_forward(q.view, k.view, v.view, o2.view, nullptr, window);
  EXPECT_EQ(o1.bytes, o2.bytes);
}

// ---- extreme logits --------------------------------------------------------------------------------------------------

TEST(EdgeCases, SoftcapWithLogitsBeyond1e4) {
  AttnCase c;
  c.seqlen_q = 77;
  c.seqlen_k = 150;
  c.head_dim = 64;
  c.softcap = 30.0f;
  c.input_std = 40.0;  // |q·k|·scale ≈ 40² · 8 / 8 · N(0,1) ~ 1e3–1e4
  for (DType t : {DType::float32, DType::float16, DType::bfloat16}) {
    c.dtype = t;
    for (Algorithm alg : kAlgorithms) {
      c.algorithm = alg;
      expect_ok(check_forward(c, 0x3009));
    }
    expect_ok(check_backward(c, 0x300a));
  }
  // The same magnitudes without softcap: logits ~1e4, where float32 rounding of the score alone is ~1e-3, so float32
  // is judged like the low-precision dtypes (against a naive float32 computation), for every variant.
  c.softcap = 0.0f;
  c.dtype = DType::float32;
  c.baseline_rule_for_fp32 = true;
  for (Algorithm alg : kAlgorithms) {
    c.algorithm = alg;
    expect_ok(check_forward(c, 0x300b));
  }
}

TEST(EdgeCases, HugeNegativeLogitsWithOneLargePositive) {
  const int64_t sk = 300, d = 4;
  for (Algorithm alg : kAlgorithms) {
    HostTensor q(DType::float32, {1, 1, 1, d}), k(DType::float32, {1, sk, 1, d}), v(DType::float32, {1, sk, 1, d});
    HostTensor out(DType::float32, {1, 1, 1, d}), lse(DType::float32, {1, 1, 1});
    std::mt19937_64 rng = make_rng(0x300c);
    v.randn(rng);
    for (int64_t c = 0; c < d; ++c) q.set(c, c == 0 ? 100.0 : 0.5);
    const int64_t hot = 211;
    for (int64_t j = 0; j < sk; ++j) {
      for (int64_t c = 0; c < d; ++c) k.set(j * d + c, c == 0 ? (j == hot ? 400.0 : -400.0) : 0.25);
    }
    AttentionOptions o;
    o.softmax_scale = 1.0f;
    o.algorithm = alg;
    attention_forward(q.view, k.view, v.view, out.view, &lse.view, o);
    for (int64_t c = 0; c < d; ++c) EXPECT_EQ(out.get(c), v.get(hot * d + c));  // softmax is exactly one-hot
    EXPECT_NEAR(lse.get(0), 40000.0 + 3 * 0.125, 40000.0 * 1e-7);
  }
}

TEST(EdgeCases, AllEqualScoresAverageTheValues) {
  const int64_t sk = 129, d = 8;
  HostTensor q(DType::float32, {1, 3, 1, d}), k(DType::float32, {1, sk, 1, d}), v(DType::float32, {1, sk, 1, d});
  HostTensor out(DType::float32, {1, 3, 1, d}), lse(DType::float32, {1, 1, 3});
  std::mt19937_64 rng = make_rng(0x300d);
  q.randn(rng);
  v.randn(rng);
  for (int64_t j = 0; j < sk; ++j) {
    for (int64_t c = 0; c < d; ++c) k.set(j * d + c, 0.75);  // every key identical
  }
  for (Algorithm alg : kAlgorithms) {
    AttentionOptions o;
    o.algorithm = alg;
    attention_forward(q.view, k.view, v.view, out.view, &lse.view, o);
    for (int64_t i = 0; i < 3; ++i) {
      double s = 0.0;
      for (int64_t c = 0; c < d; ++c) s += q.get(i * d + c) * 0.75;
      s *= 1.0 / std::sqrt(8.0);
      EXPECT_NEAR(lse.get(i), s + std::log(static_cast<double>(sk)), 1e-5 * (1 + std::fabs(s)));
      for (int64_t c = 0; c < d; ++c) {
        double mean = 0.0;
        for (int64_t j = 0; j < sk; ++j) mean += v.get(j * d + c);
        EXPECT_NEAR(out.get(i * d + c), mean / sk, 1e-5);
      }
    }
  }
}

// ---- layouts, variants, varlen, threads --------------------------------------------------------------------------------

TEST(EdgeCases, NonContiguousStrides) {
  AttnCase c;
  c.seqlen_q = 70;
  c.seqlen_k = 99;
  c.num_heads = 4;
  c.num_heads_kv = 2;
  c.head_dim = 24;
  c.head_dim_v = 40;
  c.pad = 5;
  c.causal = true;
  for (DType t : {DType::float32, DType::float16}) {
    c.dtype = t;
    expect_ok(check_forward(c, 0x300e));
    expect_ok(check_backward(c, 0x300f));
  }
  // A bhsd buffer viewed as bshd (permuted strides) gives bit-identical results to a contiguous copy.
  std::mt19937_64 rng = make_rng(0x3010);
  const int64_t b = 2, h = 3, s = 50, d = 16;
  HostTensor qbhsd(DType::float32, {b, h, s, d});
  qbhsd.randn(rng);
  TensorView qv = qbhsd.view;
  qv.shape[1] = s;
  qv.shape[2] = h;
  qv.strides[1] = d;
  qv.strides[2] = s * d;
  HostTensor qc(DType::float32, {b, s, h, d});
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t si = 0; si < s; ++si)
      for (int64_t hi = 0; hi < h; ++hi)
        for (int64_t c2 = 0; c2 < d; ++c2)
          qc.set(((bi * s + si) * h + hi) * d + c2, qbhsd.get(((bi * h + hi) * s + si) * d + c2));
  HostTensor k(DType::float32, {b, s, h, d}), v = k, o1(DType::float32, {b, s, h, d}), o2 = o1;
  k.randn(rng);
  v.randn(rng);
  attention_forward(qv, k.view, v.view, o1.view, nullptr);
  attention_forward(qc.view, k.view, v.view, o2.view, nullptr);
  EXPECT_EQ(o1.bytes, o2.bytes);
}

TEST(EdgeCases, AllThreeVariantsMatchTheReference) {
  int salt = 0;
  for (Algorithm alg : kAlgorithms) {
    for (DType t : {DType::float32, DType::float16, DType::bfloat16}) {
      AttnCase c;
      c.dtype = t;
      c.algorithm = alg;
      c.seqlen_q = 150;
      c.seqlen_k = 131;
      c.head_dim = 48;
      c.num_heads = 4;
      c.num_heads_kv = 2;
      c.window_size_left = 40;
      c.window_size_right = 3;
      c.softcap = t == DType::float16 ? 20.0f : 0.0f;
      expect_ok(check_forward(c, 0x3011 + salt++));
      AttnCase vl = c;  // varlen with empty sequences
      vl.varlen_q = {0, 65, 3, 0, 129};
      vl.varlen_k = {7, 64, 0, 0, 140};
      vl.causal = true;
      vl.window_size_left = -1;
      vl.window_size_right = -1;
      expect_ok(check_forward(vl, 0x3111 + salt++));
    }
  }
}

TEST(EdgeCases, VariantsAgreeWithEachOther) {
  std::mt19937_64 rng = make_rng(0x3012);
  HostTensor q(DType::float32, {2, 200, 2, 64}), k(DType::float32, {2, 260, 1, 64}), v(DType::float32, {2, 260, 1, 32});
  q.randn(rng);
  k.randn(rng);
  v.randn(rng);
  std::vector<std::vector<double>> outs, lses;
  for (Algorithm alg : kAlgorithms) {
    HostTensor out(DType::float32, {2, 200, 2, 32}), lse(DType::float32, {2, 2, 200});
    AttentionOptions o;
    o.causal = true;
    o.algorithm = alg;
    attention_forward(q.view, k.view, v.view, out.view, &lse.view, o);
    outs.push_back(out.to_double());
    lses.push_back(lse.to_double());
  }
  for (std::size_t a = 1; a < outs.size(); ++a) {
    EXPECT_LE(max_abs_diff(outs[a], outs[0]), 1e-5 * std::max(1.0, max_abs(outs[0])));
    EXPECT_LE(max_abs_diff(lses[a], lses[0]), 1e-5 * std::max(1.0, max_abs(lses[0])));
  }
}

TEST(EdgeCases, VarlenWithEmptySequencesAllDtypes) {
  for (DType t : {DType::float32, DType::float16, DType::bfloat16}) {
    AttnCase c;
    c.dtype = t;
    c.head_dim = 59;
    c.num_heads = 3;
    c.num_heads_kv = 1;
    c.softcap = 10.0f;
    c.window_size_left = 20;
    c.window_size_right = 0;
    c.varlen_q = {0, 1, 113, 0, 64, 200};
    c.varlen_k = {0, 4096 / 8, 203, 17, 0, 150};
    expect_ok(check_forward(c, 0x3013 + static_cast<int>(t)));
  }
}

TEST(EdgeCases, InputsUnmodifiedAndThreadCountInvariant) {
  std::mt19937_64 rng = make_rng(0x3014);
  HostTensor q(DType::bfloat16, {2, 130, 4, 32}), k(DType::bfloat16, {2, 140, 2, 32}), v = k;
  q.randn(rng);
  k.randn(rng);
  v.randn(rng);
  const HostTensor q0 = q, k0 = k, v0 = v;
  HostTensor out1(DType::bfloat16, {2, 130, 4, 32}), out2 = out1, lse1(DType::float32, {2, 4, 130}), lse2 = lse1;
  AttentionOptions o;
  o.num_threads = 1;
  attention_forward(q.view, k.view, v.view, out1.view, &lse1.view, o);
  o.num_threads = 2;
  attention_forward(q.view, k.view, v.view, out2.view, &lse2.view, o);
  EXPECT_EQ(out1.bytes, out2.bytes);
  EXPECT_EQ(lse1.bytes, lse2.bytes);
  HostTensor dout = out1, dq = q, dk = k, dv = v;
  dout.randn(rng);
  const HostTensor out0 = out1, lse0 = lse1, dout0 = dout;
  attention_backward(q.view, k.view, v.view, out1.view, lse1.view, dout.view, dq.view, dk.view, dv.view, o);
  EXPECT_EQ(q.bytes, q0.bytes);
  EXPECT_EQ(k.bytes, k0.bytes);
  EXPECT_EQ(v.bytes, v0.bytes);
  EXPECT_EQ(out1.bytes, out0.bytes);
  EXPECT_EQ(lse1.bytes, lse0.bytes);
  EXPECT_EQ(dout.bytes, dout0.bytes);
}

// ---- device dispatch ---------------------------------------------------------------------------------------------------

int g_forward_calls = 0;
int g_backward_calls = 0;
bool g_available = true;
void fake_forward(const core::AttentionProblem& p, void* stream) {
  EXPECT_EQ(p.device, Device::cuda);
  EXPECT_EQ(stream, p.stream);
  ++g_forward_calls;
}
void fake_backward(const core::AttentionProblem&, void*) { ++g_backward_calls; }
bool fake_available() { return g_available; }

TEST(Dispatch, CudaTensorsUseTheRegisteredBackendOrFailLoudly) {
  float buf[64] = {};
  auto cuda = [&](std::initializer_list<int64_t> shape) {
    return TensorView::contiguous(buf, DType::float32, shape, Device::cuda, 0);
  };
  const TensorView q = cuda({1, 2, 1, 8}), k = cuda({1, 2, 1, 8}), out = cuda({1, 2, 1, 8});
  const core::DeviceBackend* before = core::device_backend(Device::cuda);
  core::register_device_backend(Device::cuda, nullptr);
  try {
    attention_forward(q, k, k, out, nullptr);
    ADD_FAILURE() << "expected UnsupportedError";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("built without the CUDA backend"), std::string::npos) << e.what();
  }
  static const core::DeviceBackend fake{&fake_forward, &fake_backward, &fake_available, "fake-cuda"};
  core::register_device_backend(Device::cuda, &fake);
  AttentionOptions o;
  o.stream = reinterpret_cast<void*>(0x1234);
  attention_forward(q, k, k, out, nullptr, o);
  EXPECT_EQ(g_forward_calls, 1);
  g_available = false;
  try {
    attention_forward(q, k, k, out, nullptr, o);
    ADD_FAILURE() << "expected UnsupportedError";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
  g_available = true;
  core::register_device_backend(Device::cuda, before);
  EXPECT_THROW(core::register_device_backend(Device::cpu, &fake), Error);
}

}  // namespace
