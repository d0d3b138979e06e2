// CUDA backward vs the float64 reference (tolerance: 3x the naive same-precision error) for the auto and sm80 families:
// the grid of test_attention_cuda.cpp, varlen and strided inputs, the deterministic mode (bit-identical), the tile
// configurations for GPUs with less shared memory, and sm90ws being forward-only.
#include "attention_cuda_case.hpp"

namespace flashkv::cudatest {
namespace {

// sm90ws is forward-only: a backward that asks for it is an UnsupportedError saying so, on every GPU.
TEST(CudaKernels, Sm90wsIsForwardOnly) {
  Case b;
  b.family = KernelFamily::sm90ws;
  std::mt19937_64 rng(9);
  const CaseData r = make_run(b, rng);
  DeviceRun d(b, r);
  b.family = KernelFamily::automatic;
  cuda::attention_forward_cuda(d.forward_problem(b), nullptr);
  b.family = KernelFamily::sm90ws;
  const HostTensor dout = random_pitched(r.ref.total_q(), b.heads, b.head_dim, r.pitch, b.dtype, rng);
  try {
    run_backward(b, r, d, dout);
    ADD_FAILURE() << "expected UnsupportedError for a backward with kernel_family sm90ws";
  } catch (const UnsupportedError& e) {
    EXPECT_TRUE(contains(e.what(), "'sm90ws'") && contains(e.what(), "forward-only")) << e.what();
  }
}

void check_backward(const Case& c) {
  SCOPED_TRACE(c.name());
  std::mt19937_64 rng(test_seed() ^ std::hash<std::string>{}(c.name() + "bwd"));
  const CaseData r = make_run(c, rng);
  DeviceRun d(c, r);
  cuda::attention_forward_cuda(d.forward_problem(c), nullptr);
  const HostTensor dout = random_pitched(r.ref.total_q(), c.heads, c.head_dim, r.pitch, c.dtype, rng);
  const BwdResult g = run_backward(c, r, d, dout);
  const RefGrads ref = ref_backward(r.ref, r.q.val, r.k.val, r.v.val, dout.val, no_rounding());
  const RefGrads naive = ref_backward(r.ref, r.q.val, r.k.val, r.v.val, dout.val, rounding_to(c.dtype));
  const int tq = r.ref.total_q(), tk = r.ref.total_k();
  const struct {
    const char* name;
    std::vector<double> got;
    const std::vector<double>& ref;
    const std::vector<double>& naive;
  } grads[] = {{"dq", unpitch(g.dq, tq, c.heads, c.head_dim, r.pitch, c.dtype), ref.dq, naive.dq},
               {"dk", unpitch(g.dk, tk, c.heads_kv, c.head_dim, r.pitch, c.dtype), ref.dk, naive.dk},
               {"dv", unpitch(g.dv, tk, c.heads_kv, c.head_dim, r.pitch, c.dtype), ref.dv, naive.dv}};
  for (const auto& x : grads) {
    const double err = max_abs_diff(x.got, x.ref), naive_err = max_abs_diff(x.naive, x.ref);
    EXPECT_LE(err, 3 * naive_err + 1e-4) << x.name << ": kernel err " << err << " vs naive " << naive_err;
  }
}

void backward_grid() {
  for (DType t : {DType::bfloat16, DType::float16}) {
    for (int d : head_dims()) {
      if (!compiled(d, t)) continue;
      struct Shape {
        int sq, sk;
      };
      const std::vector<Shape> shapes = {{1, 1}, {113, 203}, {203, 113}, {257, 130}};
      for (const Shape& s : shapes) {
        for (int variant = 0; variant < 4; ++variant) {
          if (!full_tests() && d != 64 && d != 128 && variant != (s.sq % 4)) continue;
          Case c;
          c.dtype = t, c.head_dim = d, c.seqlen_q = s.sq, c.seqlen_k = s.sk, c.batch = 2, c.heads = 4;
          c.heads_kv = 4;
          if (variant == 1) c.causal = true, c.heads_kv = 2;
          if (variant == 2) c.window_left = 37, c.window_right = 11, c.heads_kv = 1, c.deterministic = false;
          if (variant == 3) c.softcap = 30.f, c.causal = true;
          check_backward(c);
        }
      }
    }
  }
}
TEST(CudaBackward, GridVsFloat64Reference) { backward_grid(); }
// The same with the sm80 (mma.sync) kernels.
TEST(CudaBackwardSm80, GridVsFloat64Reference) {
  FamilyScope only(KernelFamily::sm80);
  backward_grid();
}

void backward_varlen_strided() {
  Case c;
  c.heads = 4, c.heads_kv = 2, c.head_dim = 64, c.causal = true;
  c.varlen_q = {5, 0, 133, 1, 70};
  c.varlen_k = {17, 9, 0, 300, 70};
  check_backward(c);
  Case s;
  s.strided = true, s.head_dim = 59, s.window_left = 40, s.window_right = 40;
  check_backward(s);
}
TEST(CudaBackward, VarlenAndStrided) { backward_varlen_strided(); }
// The same with the sm80 (mma.sync) kernels.
TEST(CudaBackwardSm80, VarlenAndStrided) {
  FamilyScope only(KernelFamily::sm80);
  backward_varlen_strided();
}

TEST(CudaSmallGpu, TileConfigurationsForLessSharedMemory) {
  // FLASHKV_CUDA_SMEM_LIMIT = 99 KiB (sm_86/sm_89) makes a large GPU take the small-shared-memory tiles: the
  // head_dim 64 backward (first-release tiles) and the head_dim 256 non-causal forward (64x64), both vs the reference;
  // a kernel that cannot fit raises UnsupportedError naming the sizes instead of failing to launch.
  struct EnvGuard {
    EnvGuard() { setenv("FLASHKV_CUDA_SMEM_LIMIT", "101376", 1); }
    ~EnvGuard() { unsetenv("FLASHKV_CUDA_SMEM_LIMIT"); }
  } guard;
  for (DType t : {DType::bfloat16, DType::float16}) {
    Case c;
    c.dtype = t, c.head_dim = 64, c.seqlen_q = 203, c.seqlen_k = 229, c.heads = 4, c.heads_kv = 2;
    check_forward(c);
    check_backward(c);
    c.causal = true;
    check_backward(c);
    if (compiled(256, t)) {
      Case w;
      w.dtype = t, w.head_dim = 256, w.seqlen_q = 203, w.seqlen_k = 229, w.heads = 2, w.heads_kv = 2;
      check_forward(w);
      try {
        check_backward(w);  // the head_dim 256 backward needs ~209 KB
        ADD_FAILURE() << "expected UnsupportedError for the head_dim 256 backward under a 99 KiB limit";
      } catch (const UnsupportedError& e) {
        EXPECT_NE(std::string(e.what()).find("shared memory"), std::string::npos) << e.what();
      }
    }
  }
}

void backward_deterministic() {
  for (int mode = 0; mode < 3; ++mode) {  // non-causal, causal, sliding window (uneven K/V-block turn counts)
    Case c;
    c.batch = 2, c.heads = 8, c.heads_kv = 2, c.head_dim = 128, c.seqlen_q = 1024 + 17, c.seqlen_k = 1024 + 17;
    c.causal = mode == 1;
    if (mode == 2) c.window_left = 100, c.window_right = 30;
    SCOPED_TRACE(c.name());
    std::mt19937_64 rng(test_seed() + 7);
    const CaseData r = make_run(c, rng);
    DeviceRun d(c, r);
    cuda::attention_forward_cuda(d.forward_problem(c), nullptr);
    const HostTensor dout = random_pitched(r.ref.total_q(), c.heads, c.head_dim, r.pitch, c.dtype, rng);
    const BwdResult a = run_backward(c, r, d, dout);
    const BwdResult b = run_backward(c, r, d, dout);
    EXPECT_TRUE(a.dq == b.dq) << "dq differs between two deterministic runs";
    EXPECT_TRUE(a.dk == b.dk) << "dk differs between two deterministic runs";
    EXPECT_TRUE(a.dv == b.dv) << "dv differs between two deterministic runs";
    Case nd = c;
    nd.deterministic = false;
    const BwdResult x = run_backward(nd, r, d, dout);
    const double e = max_abs_diff(decode(x.dq, c.dtype), decode(a.dq, c.dtype));
    EXPECT_LE(e, 2e-2) << "atomic vs deterministic dq differ by more than rounding";
  }
  Case w;  // deterministic with a window against the float64 reference
  w.heads = 4, w.heads_kv = 2, w.head_dim = 64, w.seqlen_q = 257, w.seqlen_k = 300, w.window_left = 37;
  w.window_right = 11, w.deterministic = true;
  check_backward(w);
}
TEST(CudaBackward, DeterministicIsBitIdentical) { backward_deterministic(); }
// The same with the sm80 (mma.sync) kernels.
TEST(CudaBackwardSm80, DeterministicIsBitIdentical) {
  FamilyScope only(KernelFamily::sm80);
  backward_deterministic();
}

}  // namespace
}  // namespace flashkv::cudatest
