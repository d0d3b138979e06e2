// CUDA forward/backward vs the float64 reference (tolerance: 2x / 3x the naive same-precision error) for each kernel
// family (Cuda*: auto, Cuda*Sm80: sm80, CudaForwardSm90ws: sm90ws), on the foundation's grid: head dims incl. 59 and 111 (padded), seqlen pairs (1,1), (113,203), (203,113), (1023,1024),
// (2048,2048), causal, sliding window, softcap, MHA/GQA/MQA, varlen with empty sequences, strided (padded-copy) inputs,
// deterministic backward (bit-identical), and the typed errors. FLASHKV_FULL_TESTS=1 runs the full cross product.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/path_log.hpp"
#include "core/validate.hpp"
#include "cuda/attention_cuda.hpp"
#include "cuda/kernels.hpp"
#include "cuda/util.hpp"
#include "cuda_test_util.hpp"
#include "flashkv/attention.hpp"
#include "flashkv/error.hpp"

namespace flashkv::cudatest {
namespace {

using flashkv::testing::full_tests;  // FLASHKV_FULL_TESTS=1

struct Case {
  DType dtype = DType::bfloat16;
  int batch = 2, heads = 4, heads_kv = 4, head_dim = 64;
  int seqlen_q = 113, seqlen_k = 203;
  int window_left = -1, window_right = -1;
  bool causal = false;
  float softcap = 0;
  std::vector<int> varlen_q, varlen_k;  ///< per-sequence lengths (non-empty => varlen)
  bool strided = false;                 ///< q/k/v/out views with a padded head stride (padded-copy path)
  bool deterministic = true;
  Algorithm algorithm = Algorithm::tiled;
  KernelFamily family = KernelFamily::automatic;  ///< automatic: the suite's family (FamilyScope)
  std::string name() const {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s d=%d b=%d h=%d/%d sq=%d sk=%d win=(%d,%d) causal=%d softcap=%g%s%s %s",
                  dtype_name(dtype), head_dim, batch, heads, heads_kv, seqlen_q, seqlen_k, window_left,
                  window_right, causal, softcap, varlen_q.empty() ? "" : " varlen", strided ? " strided" : "",
                  algorithm == Algorithm::v1_order ? "v1" : "tiled");
    return buf;
  }
};

/// Inputs of one case. The reference sees every case as packed rows (fixed-length [B, S, H, D] is the varlen special
/// case cu = {0, S, 2S, ...}): `shape` is a RefVarlenShape and the reference lse is [H, total_q].
struct RefProblem {
  RefVarlenShape shape;
  RefOptions opts;
  std::vector<int32_t> cu_q, cu_k;  ///< device copies of shape.cu_seqlens_q/k
  int batch = 1;
  int total_q() const { return static_cast<int>(shape.total_q()); }
  int total_k() const { return static_cast<int>(shape.total_k()); }
};
struct CaseData {
  RefProblem ref;
  HostTensor q, k, v;
  int64_t pitch;  // elements between heads (head_dim, or head_dim + 3 when strided)
};

struct RefForward {
  std::vector<double> out, lse;  ///< out [total_q, H, D], lse [H, total_q]
};
/// float64 reference (rnd = no_rounding()) or the naive same-precision computation (rnd = rounding_to(dtype)).
RefForward ref_forward(const RefProblem& p, const std::vector<double>& q, const std::vector<double>& k,
                       const std::vector<double>& v, const flashkv::testing::Rounder& rnd) {
  RefForward r;
  reference_forward_varlen(p.shape, p.opts, q, k, v, r.out, r.lse, rnd);
  return r;
}
struct RefGrads {
  std::vector<double> dq, dk, dv;
};
RefGrads ref_backward(const RefProblem& p, const std::vector<double>& q, const std::vector<double>& k,
                      const std::vector<double>& v, const std::vector<double>& dout,
                      const flashkv::testing::Rounder& rnd) {
  RefGrads g;
  reference_backward_varlen(p.shape, p.opts, q, k, v, dout, g.dq, g.dk, g.dv, rnd);
  return g;
}

/// Tensor with `rows` x heads x head_dim logical elements stored with head pitch `pitch`.
HostTensor random_pitched(int64_t rows, int heads, int d, int64_t pitch, DType t, std::mt19937_64& rng) {
  HostTensor dense = random_tensor(static_cast<size_t>(rows) * heads * d, t, rng);
  if (pitch == d) return dense;
  HostTensor out;
  out.bits.assign(static_cast<size_t>(rows) * heads * pitch, to_bits(NAN, t));
  out.val = dense.val;
  for (int64_t i = 0; i < rows * heads; ++i)
    for (int c = 0; c < d; ++c) out.bits[i * pitch + c] = dense.bits[i * d + c];
  return out;
}
std::vector<double> unpitch(const std::vector<uint16_t>& bits, int64_t rows, int heads, int d, int64_t pitch,
                            DType t) {
  std::vector<double> v(static_cast<size_t>(rows) * heads * d);
  for (int64_t i = 0; i < rows * heads; ++i)
    for (int c = 0; c < d; ++c) v[i * d + c] = from_bits(bits[i * pitch + c], t);
  return v;
}

/// View of a [rows..., heads, d] tensor with head pitch `pitch` (fixed: [B, S, H, d]; varlen: [total, H, d]).
TensorView view(void* data, DType t, bool varlen, int64_t b, int64_t s, int64_t h, int64_t d, int64_t pitch) {
  TensorView v;
  v.data = data;
  v.dtype = t;
  v.device = Device::cuda;
  if (varlen) {
    v.ndim = 3;
    v.shape[0] = s, v.shape[1] = h, v.shape[2] = d;
    v.strides[0] = h * pitch, v.strides[1] = pitch, v.strides[2] = 1;
  } else {
    v.ndim = 4;
    v.shape[0] = b, v.shape[1] = s, v.shape[2] = h, v.shape[3] = d;
    v.strides[0] = s * h * pitch, v.strides[1] = h * pitch, v.strides[2] = pitch, v.strides[3] = 1;
  }
  return v;
}

CaseData make_run(const Case& c, std::mt19937_64& rng) {
  CaseData r;
  RefProblem& p = r.ref;
  const bool varlen = !c.varlen_q.empty();
  p.batch = varlen ? static_cast<int>(c.varlen_q.size()) : c.batch;
  p.shape.num_heads = c.heads, p.shape.num_heads_kv = c.heads_kv;
  p.shape.head_dim = p.shape.head_dim_v = c.head_dim;
  p.cu_q = {0}, p.cu_k = {0};
  for (int b = 0; b < p.batch; ++b) {
    p.cu_q.push_back(p.cu_q.back() + (varlen ? c.varlen_q[b] : c.seqlen_q));
    p.cu_k.push_back(p.cu_k.back() + (varlen ? c.varlen_k[b] : c.seqlen_k));
  }
  p.shape.cu_seqlens_q.assign(p.cu_q.begin(), p.cu_q.end());
  p.shape.cu_seqlens_k.assign(p.cu_k.begin(), p.cu_k.end());
  p.opts.softmax_scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  p.opts.causal = c.causal;
  p.opts.window_size_left = c.window_left;
  p.opts.window_size_right = c.window_right;
  p.opts.softcap = c.softcap;
  r.pitch = c.strided ? c.head_dim + 3 : c.head_dim;
  r.q = random_pitched(p.total_q(), c.heads, c.head_dim, r.pitch, c.dtype, rng);
  r.k = random_pitched(p.total_k(), c.heads_kv, c.head_dim, r.pitch, c.dtype, rng);
  r.v = random_pitched(p.total_k(), c.heads_kv, c.head_dim, r.pitch, c.dtype, rng);
  return r;
}

/// The kernel family of the running suite: Cuda* suites run `automatic` (sm90 on Hopper where compiled), Cuda*Sm80
/// suites force sm80 through AttentionOptions::kernel_family (never through the environment).
KernelFamily g_family = KernelFamily::automatic;
struct FamilyScope {
  explicit FamilyScope(KernelFamily f) { g_family = f; }
  ~FamilyScope() { g_family = KernelFamily::automatic; }
  FamilyScope(const FamilyScope&) = delete;
  FamilyScope& operator=(const FamilyScope&) = delete;
};

AttentionOptions options_of(const Case& c) {
  AttentionOptions o;
  o.kernel_family = c.family != KernelFamily::automatic ? c.family : g_family;
  o.causal = c.causal;
  o.window_size_left = c.window_left;
  o.window_size_right = c.window_right;
  o.softcap = c.softcap;
  o.deterministic = c.deterministic;
  o.algorithm = c.algorithm;
  return o;
}

struct DeviceRun {
  DevBuf q, k, v, out, lse, cu_q, cu_k;
  TensorView qv, kv, vv, ov, lv, cqv, ckv;
  DeviceRun(const Case& c, const CaseData& r)
      : q(r.q.bits.size() * 2), k(r.k.bits.size() * 2), v(r.v.bits.size() * 2),
        out(static_cast<size_t>(r.ref.total_q()) * c.heads * r.pitch * 2),
        lse(static_cast<size_t>(r.ref.total_q()) * c.heads * 4), cu_q(r.ref.cu_q.size() * 4),
        cu_k(r.ref.cu_k.size() * 4) {
    const bool varlen = !c.varlen_q.empty();
    q.upload(r.q.bits), k.upload(r.k.bits), v.upload(r.v.bits);
    cu_q.upload(r.ref.cu_q), cu_k.upload(r.ref.cu_k);
    out.poison(), lse.poison();
    const int64_t sq = varlen ? r.ref.total_q() : c.seqlen_q, sk = varlen ? r.ref.total_k() : c.seqlen_k;
    qv = view(q.p, c.dtype, varlen, r.ref.batch, sq, c.heads, c.head_dim, r.pitch);
    kv = view(k.p, c.dtype, varlen, r.ref.batch, sk, c.heads_kv, c.head_dim, r.pitch);
    vv = view(v.p, c.dtype, varlen, r.ref.batch, sk, c.heads_kv, c.head_dim, r.pitch);
    ov = view(out.p, c.dtype, varlen, r.ref.batch, sq, c.heads, c.head_dim, r.pitch);
    lv = varlen ? dev_view(lse, DType::float32, {c.heads, r.ref.total_q()})
                : dev_view(lse, DType::float32, {r.ref.batch, c.heads, c.seqlen_q});
    cqv = dev_view(cu_q, DType::int32, {r.ref.batch + 1});
    ckv = dev_view(cu_k, DType::int32, {r.ref.batch + 1});
  }
  core::AttentionProblem forward_problem(const Case& c) const {
    const AttentionOptions o = options_of(c);
    if (c.varlen_q.empty()) return core::make_forward_problem(qv, kv, vv, ov, &lv, o);
    int mq = 0, mk = 0;
    for (int x : c.varlen_q) mq = std::max(mq, x);
    for (int x : c.varlen_k) mk = std::max(mk, x);
    return core::make_varlen_forward_problem(qv, kv, vv, cqv, ckv, mq, mk, ov, &lv, o);
  }
};

/// lse from the device layout ([B, H, S] or [H, total]) into the reference layout [H, total_q].
std::vector<double> lse_to_ref(const std::vector<float>& l, const Case& c, const RefProblem& p) {
  std::vector<double> out(static_cast<size_t>(c.heads) * p.total_q());
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < c.heads; ++h)
      for (int i = 0; i < p.cu_q[b + 1] - p.cu_q[b]; ++i) {
        const size_t src = c.varlen_q.empty() ? (static_cast<size_t>(b) * c.heads + h) * c.seqlen_q + i
                                              : static_cast<size_t>(h) * p.total_q() + p.cu_q[b] + i;
        out[static_cast<size_t>(h) * p.total_q() + p.cu_q[b] + i] = l[src];
      }
  return out;
}
/// max |a - ref| over rows with a visible key; a row with no visible key must be exactly -inf in both (lse error of
/// +inf otherwise, also for a kernel -inf/NaN where the reference is finite).
double lse_err(const std::vector<double>& a, const std::vector<double>& ref) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::isinf(a[i]) && a[i] != ref[i]) return INFINITY;
  return max_abs_diff(a, ref);
}

/// Runs the forward case; returns false (and records a failure) on a tolerance violation.
void check_forward(const Case& c) {
  SCOPED_TRACE(c.name());
  std::mt19937_64 rng(test_seed() ^ std::hash<std::string>{}(c.name()));
  const CaseData r = make_run(c, rng);
  DeviceRun d(c, r);
  cuda::attention_forward_cuda(d.forward_problem(c), nullptr);
  const auto out = unpitch(d.out.download<uint16_t>(d.out.bytes / 2), r.ref.total_q(), c.heads, c.head_dim, r.pitch,
                           c.dtype);
  const auto lse = lse_to_ref(d.lse.download<float>(d.lse.bytes / 4), c, r.ref);
  const RefForward ref = ref_forward(r.ref, r.q.val, r.k.val, r.v.val, no_rounding());
  const RefForward naive = ref_forward(r.ref, r.q.val, r.k.val, r.v.val, rounding_to(c.dtype));
  const double err = max_abs_diff(out, ref.out), naive_err = max_abs_diff(naive.out, ref.out);
  EXPECT_LE(err, 2 * naive_err + 1e-5) << "out: kernel err " << err << " vs naive " << naive_err;
  const double lerr = lse_err(lse, ref.lse), naive_lerr = lse_err(naive.lse, ref.lse);
  EXPECT_LE(lerr, 2 * naive_lerr + 1e-4) << "lse: kernel err " << lerr << " vs naive " << naive_lerr;
}

bool is_hopper() {
  int dev = 0, major = 0, minor = 0;
  EXPECT_EQ(cudaGetDevice(&dev), cudaSuccess);
  EXPECT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
  EXPECT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), cudaSuccess);
  return major == 9 && minor == 0;
}
bool sm80_only_env() {
  const char* v = std::getenv("FLASHKV_CUDA_SM80_ONLY");
  return v != nullptr && v[0] != '\0' && std::string(v) != "0";
}
bool contains(const std::string& s, const std::string& x) { return s.find(x) != std::string::npos; }

/// Runs one forward of c and returns the recorded kernel path.
std::string forward_path(const Case& c) {
  std::mt19937_64 rng(11);
  const CaseData r = make_run(c, rng);
  DeviceRun d(c, r);
  cuda::attention_forward_cuda(d.forward_problem(c), nullptr);
  return core::last_path();
}

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
  // seqlen_k >= 2048 takes sm90ws at hd64 (causal); softcap (not measured on sm90ws) stays sm90.
  if (hopper_auto) {
    struct Want {
      int d, s;
      bool causal;
      float softcap;
      const char* family;
    };
    for (const Want& w : {Want{128, 70, true, 0.f, " sm90 fwd "}, Want{256, 70, true, 0.f, " sm90ws fwd "},
                          Want{64, 2048, true, 0.f, " sm90ws fwd "}, Want{64, 1024, false, 0.f, " sm90 fwd "},
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

std::vector<int> head_dims() { return {64, 128, 59, 111, 96, 192, 256}; }

bool compiled(int d, DType t) {
  try {
    Case c;
    c.head_dim = d, c.dtype = t, c.batch = 1, c.heads = c.heads_kv = 1, c.seqlen_q = c.seqlen_k = 1;
    std::mt19937_64 rng(1);
    const CaseData r = make_run(c, rng);
    DeviceRun dr(c, r);
    cuda::attention_forward_cuda(dr.forward_problem(c), nullptr);
    return true;
  } catch (const UnsupportedError& e) {
    std::printf("  [not compiled] %s\n", e.what());
    return false;
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
    c.dtype = t, c.batch = 4, c.seqlen_q = 1100, c.seqlen_k = 700, c.heads = 16, c.heads_kv = 4, c.head_dim = 128;
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

// ---- backward ------------------------------------------------------------------------------------------------------

struct BwdResult {
  std::vector<uint16_t> dq, dk, dv;
};

BwdResult run_backward(const Case& c, const CaseData& r, DeviceRun& d, const HostTensor& dout) {
  DevBuf dO(dout.bits.size() * 2), dq(d.q.bytes), dk(d.k.bytes), dv(d.v.bytes);
  dO.upload(dout.bits);
  dq.poison(), dk.poison(), dv.poison();
  const bool varlen = !c.varlen_q.empty();
  const int64_t sq = varlen ? r.ref.total_q() : c.seqlen_q, sk = varlen ? r.ref.total_k() : c.seqlen_k;
  const TensorView dov = view(dO.p, c.dtype, varlen, r.ref.batch, sq, c.heads, c.head_dim, r.pitch);
  const TensorView dqv = view(dq.p, c.dtype, varlen, r.ref.batch, sq, c.heads, c.head_dim, r.pitch);
  const TensorView dkv = view(dk.p, c.dtype, varlen, r.ref.batch, sk, c.heads_kv, c.head_dim, r.pitch);
  const TensorView dvv = view(dv.p, c.dtype, varlen, r.ref.batch, sk, c.heads_kv, c.head_dim, r.pitch);
  const AttentionOptions o = options_of(c);
  core::AttentionProblem pr;
  if (!varlen) {
    pr = core::make_backward_problem(d.qv, d.kv, d.vv, d.ov, d.lv, dov, dqv, dkv, dvv, o);
  } else {
    int mq = 0, mk = 0;
    for (int x : c.varlen_q) mq = std::max(mq, x);
    for (int x : c.varlen_k) mk = std::max(mk, x);
    pr = core::make_varlen_backward_problem(d.qv, d.kv, d.vv, d.cqv, d.ckv, mq, mk, d.ov, d.lv, dov, dqv, dkv, dvv,
                                            o);
  }
  cuda::attention_backward_cuda(pr, nullptr);
  return {dq.download<uint16_t>(dq.bytes / 2), dk.download<uint16_t>(dk.bytes / 2),
          dv.download<uint16_t>(dv.bytes / 2)};
}

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
