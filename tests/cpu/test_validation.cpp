// Every error path of the attention entry points (include/flashkv/attention.hpp ERRORS): the right exception type,
// the argument named, and "expected ..., got ..." in the message. Nothing is computed or written on error.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "common/reference.hpp"
#include "flashkv/attention.hpp"
#include "flashkv/error.hpp"

using namespace flashkv;
using namespace flashkv::testing;

namespace {

template <class E>
void expect_error(const std::function<void()>& fn, const std::string& argument, const std::string& fragment = "") {
  try {
    fn();
    ADD_FAILURE() << "no exception; expected one naming '" << argument << "'";
  } catch (const E& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.argument(), argument) << msg;
    EXPECT_NE(msg.find("expected"), std::string::npos) << msg;
    EXPECT_NE(msg.find("got"), std::string::npos) << msg;
    if (!fragment.empty()) {
      EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

/// A valid fixed-length problem (b=2, sq=5, sk=7, h=4, hkv=2, d=8, dv=6) whose pieces each test breaks.
struct Fixed {
  HostTensor q{DType::float32, {2, 5, 4, 8}}, k{DType::float32, {2, 7, 2, 8}}, v{DType::float32, {2, 7, 2, 6}};
  HostTensor out{DType::float32, {2, 5, 4, 6}}, lse{DType::float32, {2, 4, 5}};
  HostTensor dout{DType::float32, {2, 5, 4, 6}}, dq{DType::float32, {2, 5, 4, 8}}, dk{DType::float32, {2, 7, 2, 8}},
      dv{DType::float32, {2, 7, 2, 6}};
  AttentionOptions o;
  TensorView Q = q.view, K = k.view, V = v.view, O = out.view, L = lse.view, dO = dout.view, dQ = dq.view,
             dK = dk.view, dV = dv.view;
  void fwd() { attention_forward(Q, K, V, O, &L, o); }
  void bwd() { attention_backward(Q, K, V, O, L, dO, dQ, dK, dV, o); }
};

TEST(Validation, ValidProblemRuns) {
  Fixed f;
  std::mt19937_64 rng = make_rng(0x4000);
  f.q.randn(rng);
  f.k.randn(rng);
  f.v.randn(rng);
  f.dout.randn(rng);
  EXPECT_NO_THROW(f.fwd());
  EXPECT_NO_THROW(f.bwd());
  EXPECT_NO_THROW(attention_forward(f.Q, f.K, f.V, f.O, nullptr, f.o));  // lse is optional in forward
}

TEST(Validation, RankShapeAndLayout) {
  { Fixed f; f.Q.ndim = 3; expect_error<Error>([&] { f.fwd(); }, "q", "4 dimensions"); }
  { Fixed f; f.K.ndim = 5; expect_error<Error>([&] { f.fwd(); }, "k"); }
  { Fixed f; f.V.ndim = 2; expect_error<Error>([&] { f.fwd(); }, "v"); }
  { Fixed f; f.K.shape[0] = 3; expect_error<Error>([&] { f.fwd(); }, "k", "batch"); }
  { Fixed f; f.K.shape[3] = 4; expect_error<Error>([&] { f.fwd(); }, "k", "head_dim 8"); }
  { Fixed f; f.V.shape[1] = 6; expect_error<Error>([&] { f.fwd(); }, "v", "seqlen_k"); }
  { Fixed f; f.V.shape[2] = 1; expect_error<Error>([&] { f.fwd(); }, "v", "num_heads_kv"); }
  { Fixed f; f.V.shape[0] = 1; expect_error<Error>([&] { f.fwd(); }, "v", "batch"); }
  { Fixed f; f.O.shape[3] = 8; expect_error<Error>([&] { f.fwd(); }, "out", "shape [2, 5, 4, 6]"); }
  { Fixed f; f.O.shape[1] = 4; expect_error<Error>([&] { f.fwd(); }, "out"); }
  { Fixed f; f.L.shape[2] = 7; expect_error<Error>([&] { f.fwd(); }, "lse", "shape [2, 4, 5]"); }
  { Fixed f; f.Q.strides[3] = 2; expect_error<Error>([&] { f.fwd(); }, "q", "contiguous last dimension"); }
  { Fixed f; f.K.strides[1] = -16; expect_error<Error>([&] { f.fwd(); }, "k", "non-negative strides"); }
  { Fixed f; f.Q.shape[1] = -1; expect_error<Error>([&] { f.fwd(); }, "q", "non-negative shape"); }
}

TEST(Validation, HeadDimsAndHeads) {
  { Fixed f; f.Q.shape[3] = 0; f.K.shape[3] = 0; expect_error<Error>([&] { f.fwd(); }, "q", "[1, 256]"); }
  {
    HostTensor q(DType::float32, {1, 2, 1, 257}), k(DType::float32, {1, 2, 1, 257}), o(DType::float32, {1, 2, 1, 257});
    expect_error<Error>([&] { attention_forward(q.view, k.view, k.view, o.view, nullptr); }, "q", "[1, 256]");
  }
  { Fixed f; f.V.shape[3] = 300; f.O.shape[3] = 300; expect_error<Error>([&] { f.fwd(); }, "v", "head_dim_v"); }
  { Fixed f; f.V.shape[3] = 0; f.O.shape[3] = 0; expect_error<Error>([&] { f.fwd(); }, "v", "head_dim_v"); }
  {
    Fixed f;  // 4 query heads, 3 kv heads
    f.K.shape[2] = 3;
    expect_error<Error>([&] { f.fwd(); }, "k", "dividing num_heads = 4");
  }
  { Fixed f; f.K.shape[2] = 0; f.V.shape[2] = 0; expect_error<Error>([&] { f.fwd(); }, "k", "num_heads_kv >= 1"); }
  { Fixed f; f.Q.shape[2] = 0; expect_error<Error>([&] { f.fwd(); }, "q", "num_heads >= 1"); }
}

TEST(Validation, DtypesAndDevices) {
  { Fixed f; f.K.dtype = DType::float16; expect_error<TypeError>([&] { f.fwd(); }, "k", "float32"); }
  { Fixed f; f.V.dtype = DType::bfloat16; expect_error<TypeError>([&] { f.fwd(); }, "v"); }
  { Fixed f; f.O.dtype = DType::float16; expect_error<TypeError>([&] { f.fwd(); }, "out"); }
  { Fixed f; f.L.dtype = DType::float16; expect_error<TypeError>([&] { f.fwd(); }, "lse", "float32"); }
  {
    Fixed f;  // float64 / int32 are not attention dtypes
    f.Q.dtype = f.K.dtype = f.V.dtype = f.O.dtype = DType::float64;
    expect_error<TypeError>([&] { f.fwd(); }, "q", "float32, float16, bfloat16 or float8_e4m3fn");
  }
  { Fixed f; f.K.device = Device::cuda; expect_error<TypeError>([&] { f.fwd(); }, "k", "device cpu:0"); }
  { Fixed f; f.O.device_index = 1; expect_error<TypeError>([&] { f.fwd(); }, "out"); }
  { Fixed f; f.dQ.dtype = DType::float16; expect_error<TypeError>([&] { f.bwd(); }, "dq"); }
}

TEST(Validation, NullPointers) {
  { Fixed f; f.Q.data = nullptr; expect_error<Error>([&] { f.fwd(); }, "q", "non-null"); }
  { Fixed f; f.K.data = nullptr; expect_error<Error>([&] { f.fwd(); }, "k", "non-null"); }
  { Fixed f; f.V.data = nullptr; expect_error<Error>([&] { f.fwd(); }, "v", "non-null"); }
  { Fixed f; f.O.data = nullptr; expect_error<Error>([&] { f.fwd(); }, "out", "non-null"); }
  { Fixed f; f.L.data = nullptr; expect_error<Error>([&] { f.fwd(); }, "lse", "non-null"); }
  { Fixed f; f.dO.data = nullptr; expect_error<Error>([&] { f.bwd(); }, "dout", "non-null"); }
  { Fixed f; f.dK.data = nullptr; expect_error<Error>([&] { f.bwd(); }, "dk", "non-null"); }
}

TEST(Validation, Options) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  { Fixed f; f.o.window_size_left = -2; expect_error<Error>([&] { f.fwd(); }, "window_size_left", ">= -1"); }
  { Fixed f; f.o.window_size_right = -5; expect_error<Error>([&] { f.fwd(); }, "window_size_right", ">= -1"); }
  {
    Fixed f;
    f.o.causal = true;
    f.o.window_size_right = 3;
    expect_error<Error>([&] { f.fwd(); }, "window_size_right", "causal");
  }
  for (float bad : {-1.0f, nan, inf}) {
    Fixed f;
    f.o.softcap = bad;
    expect_error<Error>([&] { f.fwd(); }, "softcap", ">= 0");
  }
  for (float bad : {0.0f, -0.5f, nan, inf}) {
    Fixed f;
    f.o.softmax_scale = bad;
    expect_error<Error>([&] { f.fwd(); }, "softmax_scale", "> 0");
  }
  { Fixed f; f.o.algorithm = static_cast<Algorithm>(7); expect_error<Error>([&] { f.fwd(); }, "algorithm"); }
  { Fixed f; f.o.num_threads = -1; expect_error<Error>([&] { f.fwd(); }, "num_threads"); }
}

TEST(Validation, BackwardShapes) {
  { Fixed f; f.dO.shape[3] = 8; expect_error<Error>([&] { f.bwd(); }, "dout", "shape of out"); }
  { Fixed f; f.dQ.shape[1] = 4; expect_error<Error>([&] { f.bwd(); }, "dq", "shape of q"); }
  { Fixed f; f.dK.shape[2] = 1; expect_error<Error>([&] { f.bwd(); }, "dk", "shape of k"); }
  { Fixed f; f.dV.ndim = 3; expect_error<Error>([&] { f.bwd(); }, "dv"); }
  { Fixed f; f.L.shape[1] = 2; expect_error<Error>([&] { f.bwd(); }, "lse"); }
}

/// A valid varlen problem: 3 sequences, q lengths {2, 0, 3}, k lengths {4, 1, 2}.
struct Varlen {
  HostTensor q{DType::float16, {5, 2, 8}}, k{DType::float16, {7, 1, 8}}, v{DType::float16, {7, 1, 8}};
  HostTensor out{DType::float16, {5, 2, 8}}, lse{DType::float32, {2, 5}};
  HostTensor cq = int32_tensor({0, 2, 2, 5}), ck = int32_tensor({0, 4, 5, 7});
  int64_t max_q = 3, max_k = 4;
  AttentionOptions o;
  void fwd() {
    attention_varlen_forward(q.view, k.view, v.view, cq.view, ck.view, max_q, max_k, out.view, &lse.view, o);
  }
  void bwd() {
    HostTensor dq = q, dk = k, dv = v, dout = out;
    attention_varlen_backward(q.view, k.view, v.view, cq.view, ck.view, max_q, max_k, out.view, lse.view, dout.view,
                              dq.view, dk.view, dv.view, o);
  }
};

TEST(Validation, VarlenCuSeqlens) {
  {
    Varlen f;
    EXPECT_NO_THROW(f.fwd());
    EXPECT_NO_THROW(f.bwd());
  }
  { Varlen f; f.cq = int32_tensor({1, 2, 2, 5}); expect_error<Error>([&] { f.fwd(); }, "cu_seqlens_q", "[0] = 0"); }
  {
    Varlen f;
    f.ck = int32_tensor({0, 4, 3, 7});
    expect_error<Error>([&] { f.fwd(); }, "cu_seqlens_k", "non-decreasing");
  }
  { Varlen f; f.cq = int32_tensor({0, 2, 2, 4}); expect_error<Error>([&] { f.fwd(); }, "cu_seqlens_q", "total_q"); }
  { Varlen f; f.ck = int32_tensor({0, 4, 5, 9}); expect_error<Error>([&] { f.bwd(); }, "cu_seqlens_k", "total_k"); }
  { Varlen f; f.ck = int32_tensor({0, 4, 7}); expect_error<Error>([&] { f.fwd(); }, "cu_seqlens_k", "length"); }
  { Varlen f; f.max_q = 2; expect_error<Error>([&] { f.fwd(); }, "max_seqlen_q", "sequence 2 has 3"); }
  { Varlen f; f.max_k = -1; expect_error<Error>([&] { f.fwd(); }, "max_seqlen_k", ">= 0"); }
  {
    Varlen f;
    f.cq.view.dtype = DType::float32;
    expect_error<TypeError>([&] { f.fwd(); }, "cu_seqlens_q", "int32");
  }
  { Varlen f; f.ck.view.ndim = 2; expect_error<Error>([&] { f.fwd(); }, "cu_seqlens_k", "1 dimensions"); }
  { Varlen f; f.cq.view.data = nullptr; expect_error<Error>([&] { f.fwd(); }, "cu_seqlens_q", "non-null"); }
  { Varlen f; f.cq.view.shape[0] = 0; f.ck.view.shape[0] = 0; expect_error<Error>([&] { f.fwd(); }, "cu_seqlens_q"); }
  { Varlen f; f.q.view.ndim = 4; expect_error<Error>([&] { f.fwd(); }, "q", "3 dimensions"); }
  { Varlen f; f.lse.view.shape[1] = 4; expect_error<Error>([&] { f.fwd(); }, "lse", "(num_heads, total_q)"); }
  { Varlen f; f.ck.view.device = Device::cuda; expect_error<TypeError>([&] { f.fwd(); }, "cu_seqlens_k"); }
}

// FP8 (float8_e4m3fn q/k/v, bfloat16 out) is a CUDA forward (kernel family sm90ws): the out dtype and the descales
// are checked on every device (Error / TypeError naming them), then CPU tensors are an UnsupportedError; descales with
// 16-bit or float32 inputs are an Error; a backward is an UnsupportedError.
TEST(Validation, Fp8InputsAndDescales) {
  HostTensor q8{DType::float8_e4m3fn, {2, 5, 4, 8}}, k8{DType::float8_e4m3fn, {2, 7, 2, 8}},
      v8{DType::float8_e4m3fn, {2, 7, 2, 8}};
  HostTensor out{DType::bfloat16, {2, 5, 4, 8}}, lse{DType::float32, {2, 4, 5}};
  HostTensor per_head{DType::float32, {2, 2}}, per_tensor{DType::float32, {1}}, wrong{DType::float32, {2, 4}},
      half{DType::float16, {1}};
  AttentionOptions o;
  o.q_descale = &per_head.view, o.k_descale = &per_tensor.view, o.v_descale = &per_head.view;
  auto fwd = [&](const AttentionOptions& opt) { attention_forward(q8.view, k8.view, v8.view, out.view, &lse.view, opt); };
  try {
    fwd(o);
    ADD_FAILURE() << "expected UnsupportedError for FP8 on the CPU";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << e.what();
  }
  {
    AttentionOptions b = o;
    b.k_descale = &wrong.view;
    expect_error<Error>([&] { fwd(b); }, "k_descale", "[2, 2] (batch, num_heads_kv)");
    b.k_descale = &half.view;
    expect_error<TypeError>([&] { fwd(b); }, "k_descale", "float32");
  }
  {
    HostTensor out16{DType::float16, {2, 5, 4, 8}};
    expect_error<TypeError>([&] { attention_forward(q8.view, k8.view, v8.view, out16.view, &lse.view, o); }, "out",
                            "bfloat16");
  }
  {
    HostTensor k16{DType::bfloat16, {2, 7, 2, 8}};
    expect_error<TypeError>([&] { attention_forward(q8.view, k16.view, v8.view, out.view, &lse.view, o); }, "k");
  }
  {
    Fixed f;
    f.o.q_descale = &per_tensor.view;
    expect_error<Error>([&] { f.fwd(); }, "q_descale", "float8_e4m3fn");
  }
  EXPECT_THROW(attention_backward(q8.view, k8.view, v8.view, out.view, lse.view, out.view, q8.view, k8.view, v8.view,
                                  AttentionOptions{}),
               UnsupportedError);
}

TEST(Validation, NothingWrittenOnError) {
  Fixed f;
  f.out.fill(7.0);
  const auto before = f.out.bytes;
  f.o.softcap = -1.0f;
  EXPECT_THROW(f.fwd(), Error);
  EXPECT_EQ(f.out.bytes, before);
}

}  // namespace
