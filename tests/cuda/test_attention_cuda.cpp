// CUDA forward vs the float64 reference (tolerance: 2x the naive same-precision error) for each kernel family (Cuda*:
// auto, Cuda*Sm80: sm80, CudaForwardSm90ws: sm90ws), on the foundation's grid: head dims incl. 59 and 111 (padded),
// seqlen pairs (1,1), (113,203), (203,113), (1023,1024), (2048,2048), causal, sliding window, softcap, MHA/GQA/MQA,
// varlen with empty sequences, strided (padded-copy) inputs, kernel selection, path reports and the typed errors
// (backward: test_attention_bwd_cuda.cpp). FLASHKV_FULL_TESTS=1 runs the full cross product.
#include "attention_cuda_case.hpp"

namespace flashkv::cudatest {
namespace {


// The family is decided once per call from the device, the build and the call's shape: on Hopper, with a build that
// carries sm_90a code, `auto` must really take the Hopper kernels (else the Cuda* suites would test the sm80 kernels
// twice) for the head dims that have them — sm90ws for the forwards of common/tile_size.hpp sm90ws_preferred, sm90
// for the others — and `sm80` must take the mma.sync ones; a family that cannot run is an UnsupportedError naming it.
TEST(CudaKernels, FamilyIsDecidedOncePerCall) {
  const bool hopper = is_hopper();
  const bool sm90 = hopper && cuda::sm90_kernels_compiled();
  std::printf("  %s, sm90 kernels compiled: %d, runs sm90: %d\n", hopper ? "Hopper" : "not Hopper",
              static_cast<int>(cuda::sm90_kernels_compiled()), static_cast<int>(cuda::device_runs_sm90()));
  EXPECT_EQ(cuda::device_runs_sm90(), sm90);
  const bool hopper_auto = sm90 && !sm80_only_env();
  for (int d : {64, 128, 256, 96}) {
    Case c;
    c.head_dim = d, c.batch = 1, c.heads = c.heads_kv = 2, c.seqlen_q = c.seqlen_k = 70;
    try {
      const std::string a = forward_path(c);
      // generate_instantiations.py HEAD_DIMS: 96 and 192 are sm80 only (a head dim that is not compiled runs padded)
      const bool has90 = !contains(a, "hdim96 ") && !contains(a, "hdim192 ");
      // seqlen 70 without a mask: sm90ws for head dims >= 128, sm90 for 64 (measured: bench/results/h200-v3-*).
      // (96 reaches sm90ws only when it is not compiled as sm80 and runs padded on 128.)
      const char* want = !(hopper_auto && has90) ? " sm80 fwd " : (d >= 96 ? " sm90ws fwd " : " sm90 fwd ");
      EXPECT_TRUE(contains(a, want)) << a;
      c.family = KernelFamily::sm80;
      const std::string b = forward_path(c);
      EXPECT_TRUE(contains(b, " sm80 fwd hdim")) << b;
      for (KernelFamily f : {KernelFamily::sm90, KernelFamily::sm90ws}) {
        c.family = f;
        const std::string name = std::string(" ") + kernel_family_name(f) + " fwd hdim";
        if (sm90) {  // a head dim without a kernel of its own in the family runs padded on the next larger one
          EXPECT_TRUE(contains(forward_path(c), name)) << core::last_path();
        } else {
          try {
            forward_path(c);
            ADD_FAILURE() << "expected UnsupportedError for kernel_family " << kernel_family_name(f) << ", head_dim "
                          << d;
          } catch (const UnsupportedError& e) {
            EXPECT_TRUE(contains(e.what(), std::string("'") + kernel_family_name(f) + "'")) << e.what();
          }
        }
      }
    } catch (const UnsupportedError& e) {
      std::printf("  [not compiled] %s\n", e.what());
    }
  }
  // The shape part of `auto` (forward): causal hd128 at seqlen 70 stays sm90; hd256 takes sm90ws under a mask too;
  // hd64 takes sm90ws from seqlen_k 8192 (causal), stays sm90 at 4096; softcap (not measured on sm90ws) stays sm90.
  if (hopper_auto) {
    struct Want {
      int d, s;
      bool causal;
      float softcap;
      const char* family;
    };
    for (const Want& w : {Want{128, 70, true, 0.f, " sm90 fwd "}, Want{256, 70, true, 0.f, " sm90ws fwd "},
                          Want{64, 8192, true, 0.f, " sm90ws fwd "}, Want{64, 4096, false, 0.f, " sm90 fwd "},
                          Want{128, 1024, true, 0.f, " sm90 fwd "}, Want{128, 1024, false, 0.f, " sm90ws fwd "},
                          Want{256, 70, false, 20.f, " sm90 fwd "}}) {
      Case c;
      c.head_dim = w.d, c.batch = 1, c.heads = c.heads_kv = 1, c.seqlen_q = c.seqlen_k = w.s, c.causal = w.causal;
      c.softcap = w.softcap;
      try {
        EXPECT_TRUE(contains(forward_path(c), w.family)) << core::last_path();
      } catch (const UnsupportedError& e) {
        std::printf("  [not compiled] %s\n", e.what());
      }
    }
  }
  for (KernelFamily f : {KernelFamily::sm90, KernelFamily::sm90ws}) {
    Case v;
    v.algorithm = Algorithm::v1_order, v.family = f;
    try {
      forward_path(v);
      ADD_FAILURE() << "expected UnsupportedError for v1_order with kernel_family " << kernel_family_name(f);
    } catch (const UnsupportedError& e) {
      EXPECT_TRUE(contains(e.what(), kernel_family_name(f))) << e.what();
    }
  }
}

void forward_grid() {
  for (DType t : {DType::bfloat16, DType::float16}) {
    for (int d : head_dims()) {
      if (!compiled(d, t)) continue;
      struct Shape {
        int sq, sk, batch, heads;
      };
      std::vector<Shape> shapes = {{1, 1, 2, 4}, {113, 203, 2, 4}, {203, 113, 2, 4}};
      const bool large = full_tests() || d == 64 || d == 128 || d == 59;
      if (large) shapes.push_back({1023, 1024, 1, 2}), shapes.push_back({2048, 2048, 1, 1});
      for (const Shape& s : shapes) {
        for (int variant = 0; variant < 4; ++variant) {
          if (s.sq >= 1023 && !full_tests() && variant != (s.sq == 1023 ? 2 : 1)) continue;
          Case c;
          c.dtype = t, c.head_dim = d, c.seqlen_q = s.sq, c.seqlen_k = s.sk, c.batch = s.batch, c.heads = s.heads;
          c.heads_kv = s.heads;
          if (variant == 1) c.causal = true, c.heads_kv = std::max(1, s.heads / 2);               // GQA
          if (variant == 2) c.window_left = 37, c.window_right = 11, c.heads_kv = 1;              // MQA
          if (variant == 3) c.softcap = 30.f, c.causal = true;                                   // softcap
          check_forward(c);
        }
      }
    }
  }
}
TEST(CudaForward, GridVsFloat64Reference) { forward_grid(); }
// The same with the sm80 (mma.sync) kernels (kernel_family = sm80), which Hopper would otherwise not run for these
// head dims.
TEST(CudaForwardSm80, GridVsFloat64Reference) {
  FamilyScope only(KernelFamily::sm80);
  forward_grid();
}
/// The sm90ws (TMA warp-specialized) suites: skipped where the device does not run this build's sm_90a code (the
/// explicit family is then an UnsupportedError: CudaKernels.FamilyIsDecidedOncePerCall).
#define FLASHKV_REQUIRE_SM90WS()                                                        \
  if (!cuda::device_runs_sm90()) GTEST_SKIP() << "no Hopper GPU running sm_90a code"; \
  FamilyScope only(KernelFamily::sm90ws)
// The same with the sm90ws kernels (kernel_family = sm90ws), which `auto` takes only for some shapes; head dims
// without a kernel of their own (59, 96, 111, 192) run padded on 64/128/256.
TEST(CudaForwardSm90ws, GridVsFloat64Reference) {
  FLASHKV_REQUIRE_SM90WS();
  forward_grid();
}
// Persistent CTAs (more tiles than SMs, no mask) carry their K/V rings and Q buffer from tile to tile; tiles without
// keys (seqlen_k = 0) load Q only and store zeros (lse -inf), also many of them on one CTA.
TEST(CudaForwardSm90ws, PersistentTilesAndEmptyKeys) {
  FLASHKV_REQUIRE_SM90WS();
  for (DType t : {DType::bfloat16, DType::float16}) {
    Case c;
    // 2 x 32 heads x 5 query tiles = 320 tiles > 132 SMs (H200), with a partial last query tile and key tile; small
    // enough that the float64 reference stays a few seconds (it took 123 s at 4 x 16 x 1100 x 700).
    c.dtype = t, c.batch = 2, c.seqlen_q = 600, c.seqlen_k = 300, c.heads = 32, c.heads_kv = 8, c.head_dim = 128;
    check_forward(c);
    EXPECT_TRUE(contains(core::last_path(), " sm90ws fwd ") && contains(core::last_path(), " persistent"))
        << core::last_path();
    c.head_dim = 64, c.seqlen_k = 0, c.batch = 16;
    check_forward(c);
  }
}

void forward_varlen() {
  for (DType t : {DType::bfloat16, DType::float16}) {
    for (bool causal : {false, true}) {
      Case c;
      c.dtype = t, c.causal = causal, c.heads = 4, c.heads_kv = 2, c.head_dim = 64;
      c.varlen_q = {5, 0, 133, 1, 70};
      c.varlen_k = {17, 9, 0, 300, 70};
      check_forward(c);
      c.head_dim = 111;
      c.window_left = 20, c.window_right = 3, c.causal = false;
      check_forward(c);
    }
  }
}
TEST(CudaForward, VarlenWithEmptySequences) { forward_varlen(); }
// The same with the sm80 (mma.sync) kernels.
TEST(CudaForwardSm80, VarlenWithEmptySequences) {
  FamilyScope only(KernelFamily::sm80);
  forward_varlen();
}
TEST(CudaForwardSm90ws, VarlenWithEmptySequences) {
  FLASHKV_REQUIRE_SM90WS();
  forward_varlen();
}

void forward_strided() {
  Case c;
  c.strided = true, c.head_dim = 64, c.causal = true, c.heads = 4, c.heads_kv = 2;
  check_forward(c);
  c.dtype = DType::float16, c.softcap = 20.f;
  check_forward(c);
}
TEST(CudaForward, StridedInputsUsePaddedCopy) { forward_strided(); }
TEST(CudaForwardSm90ws, StridedInputsUsePaddedCopy) {
  FLASHKV_REQUIRE_SM90WS();
  forward_strided();
}

TEST(CudaForward, V1LoopOrderMatchesReference) {
  for (DType t : {DType::bfloat16, DType::float16}) {
    Case c;
    c.dtype = t, c.algorithm = Algorithm::v1_order, c.seqlen_q = 203, c.seqlen_k = 113, c.heads_kv = 2;
    check_forward(c);
    c.causal = true, c.head_dim = 128, c.seqlen_q = 257, c.seqlen_k = 300, c.softcap = 25.f;
    check_forward(c);
    c.varlen_q = {5, 0, 133}, c.varlen_k = {17, 9, 0}, c.causal = false, c.window_left = 7, c.window_right = 2;
    check_forward(c);
  }
}

TEST(CudaForward, TypedErrors) {
  Case c;
  std::mt19937_64 rng(3);
  const CaseData r = make_run(c, rng);
  DeviceRun d(c, r);
  // float32 on CUDA
  {
    TensorView q = d.qv, k = d.kv, v = d.vv, o = d.ov;
    q.dtype = k.dtype = v.dtype = o.dtype = DType::float32;
    const auto pr = core::make_forward_problem(q, k, v, o, nullptr, {});
    EXPECT_THROW(cuda::attention_forward_cuda(pr, nullptr), UnsupportedError);
  }
  // naive algorithm on CUDA
  {
    AttentionOptions o;
    o.algorithm = Algorithm::naive;
    const auto pr = core::make_forward_problem(d.qv, d.kv, d.vv, d.ov, nullptr, o);
    try {
      cuda::attention_forward_cuda(pr, nullptr);
      ADD_FAILURE() << "expected UnsupportedError";
    } catch (const UnsupportedError& e) {
      EXPECT_NE(std::string(e.what()).find("naive"), std::string::npos) << e.what();
    }
  }
  // head_dim_v != head_dim
  {
    TensorView v = d.vv, o = d.ov;
    v.shape[3] = 32, o.shape[3] = 32;
    const auto pr = core::make_forward_problem(d.qv, d.kv, v, o, nullptr, {});
    EXPECT_THROW(cuda::attention_forward_cuda(pr, nullptr), UnsupportedError);
  }
}

// core::record_path once per call (issue 10 item 4): family, kind, compiled head dim, dtype, mask, tiles; padding of
// the head dim and the padded copy named when they happen; the backward names atomic / deterministic.
TEST(CudaKernels, PathReportNamesWhatRan) {
  Case c;
  c.head_dim = 64, c.causal = true, c.family = KernelFamily::sm80;
  std::string s = forward_path(c);
  EXPECT_EQ(s.rfind("attention_forward cuda sm80 fwd hdim64 bfloat16 causal tiles ", 0), 0u) << s;
  c.head_dim = 59, c.causal = false, c.window_left = 5, c.window_right = 3;
  s = forward_path(c);
  EXPECT_TRUE(contains(s, " window ") && contains(s, "head_dim 59 padded") && contains(s, "padded-copy")) << s;
  c.head_dim = 64, c.window_left = c.window_right = -1, c.strided = true, c.softcap = 10.f;
  s = forward_path(c);
  EXPECT_TRUE(contains(s, " softcap ") && contains(s, "padded-copy") && !contains(s, "padded ")) << s;
  Case v;
  v.algorithm = Algorithm::v1_order;
  s = forward_path(v);
  EXPECT_EQ(s.rfind("attention_forward cuda sm80 fwd_v1 hdim64 bfloat16 tiles 64x64", 0), 0u) << s;
  for (bool det : {false, true}) {
    Case b;
    b.deterministic = det, b.family = KernelFamily::sm80, b.varlen_q = {5, 9}, b.varlen_k = {7, 3};
    std::mt19937_64 rng(5);
    const CaseData r = make_run(b, rng);
    DeviceRun d(b, r);
    cuda::attention_forward_cuda(d.forward_problem(b), nullptr);
    const HostTensor dout = random_pitched(r.ref.total_q(), b.heads, b.head_dim, r.pitch, b.dtype, rng);
    run_backward(b, r, d, dout);
    s = core::last_path();
    EXPECT_EQ(s.rfind("attention_backward cuda sm80 bwd hdim64 bfloat16 varlen ", 0), 0u) << s;
    EXPECT_TRUE(contains(s, det ? " deterministic " : " atomic ")) << s;
  }
}

}  // namespace
}  // namespace flashkv::cudatest