// Non-finite inputs on the CUDA attention kernels (issue 10 item 2; contract: docs/design.md "Non-finite inputs" and
// the file comment of flashkv/attention.hpp): a NaN or +-inf in q, k, v or dout reaches exactly the rows and
// gradients the definition says, in IEEE arithmetic over the visible keys J_i; masked keys are absent; rows that
// do not see the bad value are unaffected. Each case compares the classification {NaN, +inf, -inf, finite} of every
// output element with a float64 reference written from the definition (explicit mask, NaN-propagating max), and
// the finite elements with the usual rule (2x / 3x the naive same-precision error), for the default family and
// for sm80 (and, forward only, sm90ws) forced through AttentionOptions::kernel_family. Forward: causal, sliding
// window, varlen, softcap, -inf logits, at head dim 128 and, for the sm80 forward (no in-kernel rare path:
// FwdMainloop::kExactNonFiniteRows is off, the fix-up kernel covers it), also 64 and 96. Backward: non-finite q, k, v and dout without masking and on the
// boundary tiles (causal diagonal, window edges, varlen sequence ends) where the masked rows/keys of the same tile
// must stay finite (the fix-up of common/nonfinite_fixup.cuh), GQA and MHA, deterministic and atomic dQ, softcap, at
// head dims 128 and 64.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "core/mask.hpp"
#include "core/path_log.hpp"
#include "core/validate.hpp"
#include "cuda/attention_cuda.hpp"
#include "cuda/kernels.hpp"
#include "cuda_test_util.hpp"
#include "flashkv/attention.hpp"
#include "flashkv/error.hpp"

namespace flashkv::cudatest {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// One problem in packed layout: q/out/dout [total_q, H, D], k/v [total_k, Hkv, D]; fixed-length problems are the
/// uniform case and go through the bshd API.
struct Problem {
  std::vector<int> lq, lk;  ///< per-sequence lengths
  bool varlen = false;
  int heads = 2, heads_kv = 1, d = 128;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  bool deterministic = true;  ///< backward: dQ in a fixed order (false: float32 atomics)
  KernelFamily family = KernelFamily::automatic;
  std::vector<int> cu_q, cu_k;
  int total_q() const { return cu_q.back(); }
  int total_k() const { return cu_k.back(); }
  double scale() const { return 1.0 / std::sqrt(static_cast<double>(d)); }
  void finish() {
    cu_q = {0}, cu_k = {0};
    for (size_t b = 0; b < lq.size(); ++b) cu_q.push_back(cu_q.back() + lq[b]), cu_k.push_back(cu_k.back() + lk[b]);
  }
  core::MaskRule rule(int b) const {
    return core::MaskRule{lq[b], lk[b], window_left, causal ? 0 : window_right};
  }
};

struct Ref {
  std::vector<double> out, lse;  ///< out [total_q, H, D]; lse [H, total_q]
  std::vector<double> dq, dk, dv;
};

/// The score of query row (b, i, h) and key j (within sequence b), as the kernels form it: q.k accumulated in float32
/// range (an overflow is +-inf, as in the tensor cores), times softmax_scale, then softcap.
double score(const Problem& p, const std::vector<double>& q, const std::vector<double>& k, int b, int i, int h, int j) {
  const int hk = h / (p.heads / p.heads_kv);
  const double* qi = &q[(static_cast<size_t>(p.cu_q[b] + i) * p.heads + h) * p.d];
  const double* kj = &k[(static_cast<size_t>(p.cu_k[b] + j) * p.heads_kv + hk) * p.d];
  double dot = 0;
  for (int c = 0; c < p.d; ++c) dot += qi[c] * kj[c];
  double s = static_cast<double>(static_cast<float>(dot)) * p.scale();
  if (p.softcap > 0) s = p.softcap * std::tanh(s / p.softcap);
  return s;
}

/// The definition over J_i only (nan-semantics contract), forward and backward, in float64.
Ref reference(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
              const std::vector<double>& v, const std::vector<double>* dout) {
  Ref r;
  const int H = p.heads, D = p.d, TQ = p.total_q();
  r.out.assign(static_cast<size_t>(TQ) * H * D, 0.0);
  r.lse.assign(static_cast<size_t>(H) * TQ, -kInf);
  r.dq.assign(q.size(), 0.0), r.dk.assign(k.size(), 0.0), r.dv.assign(v.size(), 0.0);
  for (size_t b = 0; b < p.lq.size(); ++b) {
    const core::MaskRule rule = p.rule(static_cast<int>(b));
    for (int h = 0; h < H; ++h) {
      const int hk = h / (H / p.heads_kv);
      for (int i = 0; i < p.lq[b]; ++i) {
        const int j0 = static_cast<int>(rule.row_first(i)), j1 = static_cast<int>(rule.row_last(i));
        if (j1 <= j0) continue;  // out 0, lse -inf, zero gradients
        std::vector<double> s(static_cast<size_t>(j1 - j0));
        double m = -kInf;
        bool nan = false;
        for (int j = j0; j < j1; ++j) {
          s[j - j0] = score(p, q, k, static_cast<int>(b), i, h, j);
          nan |= std::isnan(s[j - j0]);
          m = std::max(m, s[j - j0]);
        }
        if (nan) m = kNaN;
        double l = 0;
        std::vector<double> pr(s.size());
        for (size_t x = 0; x < s.size(); ++x) l += pr[x] = std::exp(s[x] - m);
        const size_t qrow = (static_cast<size_t>(p.cu_q[b] + i) * H + h) * D;
        for (int c = 0; c < D; ++c) {
          double acc = 0;
          for (int j = j0; j < j1; ++j) acc += pr[j - j0] * v[(static_cast<size_t>(p.cu_k[b] + j) * p.heads_kv + hk) * D + c];
          r.out[qrow + c] = acc / l;
        }
        const double lse = m + std::log(l);
        r.lse[static_cast<size_t>(h) * TQ + p.cu_q[b] + i] = lse;
        if (dout == nullptr) continue;
        double dsum = 0;
        for (int c = 0; c < D; ++c) dsum += (*dout)[qrow + c] * r.out[qrow + c];
        for (int j = j0; j < j1; ++j) {
          const size_t krow = (static_cast<size_t>(p.cu_k[b] + j) * p.heads_kv + hk) * D;
          const double P = std::exp(s[j - j0] - lse);
          double dp = 0;
          for (int c = 0; c < D; ++c) dp += (*dout)[qrow + c] * v[krow + c];
          double ds = P * (dp - dsum);
          if (p.softcap > 0) {
            const double th = s[j - j0] / p.softcap;
            ds *= 1 - th * th;
          }
          for (int c = 0; c < D; ++c) {
            r.dv[krow + c] += P * (*dout)[qrow + c];
            r.dq[qrow + c] += ds * p.scale() * k[krow + c];
            r.dk[krow + c] += ds * p.scale() * q[qrow + c];
          }
        }
      }
    }
  }
  return r;
}

int cls(double x) { return std::isnan(x) ? 3 : (x == kInf ? 1 : (x == -kInf ? 2 : 0)); }

/// The naive same-precision error of one output over the elements where both ref and naive are finite; `count` is
/// how many such elements there were.
double naive_error(const std::vector<double>& ref, const std::vector<double>& naive, size_t* count = nullptr) {
  double e = 0;
  size_t n = 0;
  for (size_t x = 0; x < ref.size(); ++x)
    if (cls(ref[x]) == 0 && std::isfinite(naive[x])) e = std::max(e, std::fabs(naive[x] - ref[x])), ++n;
  if (count) *count = n;
  return e;
}

/// Classification per element, then the finite elements against ref within `factor` x the naive error. Where the
/// naive computation has no finite element among ref's finite ones (its whole-matrix arithmetic spreads the bad value
/// further than the definition does), the baseline is `fallback`: the naive error of the same problem without the
/// bad values.
void compare(const char* what, const std::vector<double>& got, const std::vector<double>& ref,
             const std::vector<double>& naive, double factor, double atol, double fallback = -1) {
  size_t mismatches = 0, first = 0, nonfinite = 0, naive_count = 0;
  double err = 0;
  double naive_err = naive_error(ref, naive, &naive_count);
  if (naive_count == 0 && fallback >= 0) naive_err = fallback;
  for (size_t x = 0; x < ref.size(); ++x) {
    if (cls(ref[x]) != 0) ++nonfinite;
    if (cls(got[x]) != cls(ref[x])) {
      if (mismatches++ == 0) first = x;
      continue;
    }
    if (cls(ref[x]) == 0) err = std::max(err, std::fabs(got[x] - ref[x]));
  }
  EXPECT_EQ(mismatches, 0u) << what << ": " << mismatches << " elements classified differently, first #" << first
                            << " got " << got[first] << " want " << ref[first];
  EXPECT_LE(err, factor * naive_err + atol) << what << ": finite elements err " << err << " vs naive " << naive_err;
  std::printf("    %s: %zu non-finite elements, finite err %.3g (naive %.3g)\n", what, nonfinite, err, naive_err);
}

enum class Where { q, k, v, dout };
struct Bad {
  Where where;
  int row;  ///< packed row
  int head, col;
  double value;
};

struct Case {
  std::string name;
  Problem p;
  std::vector<Bad> bad;
  bool backward = false;
  /// Forward only, fixed-length: the call is captured into a CUDA graph on a new stream and the graph replayed twice,
  /// out and lse poisoned before each replay (a capture takes a zeroed stream-ordered flag instead of the device's
  /// epoch slot, kernel/fwd_kernel.cuh; each replay must run its own fix-up).
  bool graph = false;
};

void run_case(const Case& cs) {
  SCOPED_TRACE(cs.name + " [" + kernel_family_name(cs.p.family) + ", head_dim " + std::to_string(cs.p.d) + "]");
  const Problem& p = cs.p;
  const DType t = DType::bfloat16;
  std::mt19937_64 rng(test_seed() ^ std::hash<std::string>{}(cs.name));
  const int TQ = p.total_q(), TK = p.total_k(), H = p.heads, HK = p.heads_kv, D = p.d;
  HostTensor q = random_tensor(static_cast<size_t>(TQ) * H * D, t, rng);
  HostTensor k = random_tensor(static_cast<size_t>(TK) * HK * D, t, rng);
  HostTensor v = random_tensor(static_cast<size_t>(TK) * HK * D, t, rng);
  HostTensor dO = random_tensor(static_cast<size_t>(TQ) * H * D, t, rng);
  const std::vector<double> clean_q = q.val, clean_k = k.val, clean_v = v.val, clean_dout = dO.val;
  for (const Bad& b : cs.bad) {
    HostTensor& x = b.where == Where::q ? q : (b.where == Where::k ? k : (b.where == Where::v ? v : dO));
    const int heads = (b.where == Where::k || b.where == Where::v) ? HK : H;
    const size_t at = (static_cast<size_t>(b.row) * heads + b.head) * D + b.col;
    x.bits[at] = to_bits(static_cast<float>(b.value), t);
    x.val[at] = from_bits(x.bits[at], t);
  }
  DevBuf dq_(q.bits.size() * 2), dk_(k.bits.size() * 2), dv_(v.bits.size() * 2), dout(dO.bits.size() * 2);
  DevBuf qb(q.bits.size() * 2), kb(k.bits.size() * 2), vb(v.bits.size() * 2), ob(q.bits.size() * 2);
  DevBuf lb(static_cast<size_t>(H) * TQ * 4), cq(p.cu_q.size() * 4), ck(p.cu_k.size() * 4);
  qb.upload(q.bits), kb.upload(k.bits), vb.upload(v.bits), dout.upload(dO.bits);
  cq.upload(p.cu_q), ck.upload(p.cu_k);
  ob.poison(), lb.poison(), dq_.poison(), dk_.poison(), dv_.poison();
  AttentionOptions o;
  o.causal = p.causal, o.window_size_left = p.window_left, o.window_size_right = p.window_right;
  o.softcap = p.softcap, o.kernel_family = p.family, o.deterministic = p.deterministic;
  const int B = static_cast<int>(p.lq.size()), S = p.lq[0], SK = p.lk[0];
  auto v4 = [&](const DevBuf& x, int s, int h) { return dev_view(x, t, {B, s, h, D}); };
  auto v3 = [&](const DevBuf& x, int n, int h) { return dev_view(x, t, {n, h, D}); };
  const TensorView lse = p.varlen ? dev_view(lb, DType::float32, {H, TQ}) : dev_view(lb, DType::float32, {B, H, S});
  const TensorView cqv = dev_view(cq, DType::int32, {B + 1}), ckv = dev_view(ck, DType::int32, {B + 1});
  int mq = 0, mk = 0;
  for (int b = 0; b < B; ++b) mq = std::max(mq, p.lq[b]), mk = std::max(mk, p.lk[b]);
  if (p.varlen) {
    cuda::attention_forward_cuda(core::make_varlen_forward_problem(v3(qb, TQ, H), v3(kb, TK, HK), v3(vb, TK, HK), cqv,
                                                                   ckv, mq, mk, v3(ob, TQ, H), &lse, o),
                                 nullptr);
  } else if (cs.graph) {
    const core::AttentionProblem fp =
        core::make_forward_problem(v4(qb, S, H), v4(kb, SK, HK), v4(vb, SK, HK), v4(ob, S, H), &lse, o);
    cudaStream_t st = nullptr;
    cuda_ok(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cuda_ok(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
    cuda::attention_forward_cuda(fp, st);
    cuda_ok(cudaStreamEndCapture(st, &graph), "cudaStreamEndCapture");
    cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    for (int replay = 0; replay < 2; ++replay) {
      ob.poison(), lb.poison();
      cuda_ok(cudaGraphLaunch(exec, st), "cudaGraphLaunch");
      cuda_ok(cudaStreamSynchronize(st), "cudaStreamSynchronize");
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
  } else {
    cuda::attention_forward_cuda(
        core::make_forward_problem(v4(qb, S, H), v4(kb, SK, HK), v4(vb, SK, HK), v4(ob, S, H), &lse, o), nullptr);
  }
  const Ref ref = reference(p, q.val, k.val, v.val, cs.backward ? &dO.val : nullptr);
  // Naive same-precision baseline of the finite elements (tests/common/reference.hpp).
  flashkv::testing::RefVarlenShape shape;
  shape.num_heads = H, shape.num_heads_kv = HK, shape.head_dim = shape.head_dim_v = D;
  shape.cu_seqlens_q.assign(p.cu_q.begin(), p.cu_q.end());
  shape.cu_seqlens_k.assign(p.cu_k.begin(), p.cu_k.end());
  flashkv::testing::RefOptions ro;
  ro.softmax_scale = p.scale(), ro.causal = p.causal, ro.window_size_left = p.window_left;
  ro.window_size_right = p.window_right, ro.softcap = p.softcap;
  std::vector<double> n_out, n_lse;
  reference_forward_varlen(shape, ro, q.val, k.val, v.val, n_out, n_lse, rounding_to(t));
  const std::vector<double> out = decode(ob.download<uint16_t>(ob.bytes / 2), t);
  const std::vector<float> lraw = lb.download<float>(lb.bytes / 4);
  std::vector<double> lse_got(ref.lse.size());
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < p.lq[b]; ++i)
        lse_got[static_cast<size_t>(h) * TQ + p.cu_q[b] + i] =
            p.varlen ? lraw[static_cast<size_t>(h) * TQ + p.cu_q[b] + i] : lraw[(static_cast<size_t>(b) * H + h) * S + i];
  compare("out", out, ref.out, n_out, 2.0, 1e-5);
  compare("lse", lse_got, ref.lse, n_lse, 2.0, 1e-4);
  if (!cs.backward) return;
  if (p.varlen) {
    cuda::attention_backward_cuda(
        core::make_varlen_backward_problem(v3(qb, TQ, H), v3(kb, TK, HK), v3(vb, TK, HK), cqv, ckv, mq, mk,
                                           v3(ob, TQ, H), lse, v3(dout, TQ, H), v3(dq_, TQ, H), v3(dk_, TK, HK),
                                           v3(dv_, TK, HK), o),
        nullptr);
  } else {
    cuda::attention_backward_cuda(
        core::make_backward_problem(v4(qb, S, H), v4(kb, SK, HK), v4(vb, SK, HK), v4(ob, S, H), lse, v4(dout, S, H),
                                    v4(dq_, S, H), v4(dk_, SK, HK), v4(dv_, SK, HK), o),
        nullptr);
  }
  std::vector<double> n_dq, n_dk, n_dv;
  reference_backward_varlen(shape, ro, q.val, k.val, v.val, dO.val, n_dq, n_dk, n_dv, rounding_to(t));
  // The fallback baseline: the naive error of the same problem without the bad values.
  const Ref clean = reference(p, clean_q, clean_k, clean_v, &clean_dout);
  std::vector<double> c_dq, c_dk, c_dv;
  reference_backward_varlen(shape, ro, clean_q, clean_k, clean_v, clean_dout, c_dq, c_dk, c_dv, rounding_to(t));
  compare("dq", decode(dq_.download<uint16_t>(dq_.bytes / 2), t), ref.dq, n_dq, 3.0, 1e-4, naive_error(clean.dq, c_dq));
  compare("dk", decode(dk_.download<uint16_t>(dk_.bytes / 2), t), ref.dk, n_dk, 3.0, 1e-4, naive_error(clean.dk, c_dk));
  compare("dv", decode(dv_.download<uint16_t>(dv_.bytes / 2), t), ref.dv, n_dv, 3.0, 1e-4, naive_error(clean.dv, c_dv));
}

Problem fixed(int batch, int sq, int sk) {
  Problem p;
  p.lq.assign(batch, sq), p.lk.assign(batch, sk);
  p.finish();
  return p;
}

std::vector<Case> forward_cases() {
  std::vector<Case> cs;
  {  // NaN in one K element: every row that sees key 40 of batch 0 is NaN (out and lse), the others are untouched.
    Case c{"causal, NaN in k", fixed(2, 150, 170), {{Where::k, 40, 0, 5, kNaN}}};
    c.p.causal = true;
    cs.push_back(c);
  }
  {  // +inf in V on the causal diagonal's tile: rows that see key 100 get +inf in column 7, lse stays finite; the
     // rows of the same tile that must not see it stay finite (the masked-tile rare path).
    Case c{"causal, +inf in v", fixed(2, 150, 170), {{Where::v, 170 + 100, 0, 7, kInf}}};
    c.p.causal = true;
    cs.push_back(c);
  }
  {
    Case c{"window, NaN in v", fixed(1, 200, 200), {{Where::v, 120, 0, 3, kNaN}, {Where::v, 30, 0, 60, -kInf}}};
    c.p.window_left = 30, c.p.window_right = 10;
    cs.push_back(c);
  }
  {  // NaN in one query row: that row only.
    Case c{"causal, NaN in q", fixed(2, 150, 170), {{Where::q, 20, 1, 3, kNaN}}};
    c.p.causal = true;
    cs.push_back(c);
  }
  {  // varlen: the bad value of sequence 1 stays in sequence 1.
    Case c;
    c.name = "varlen causal, -inf in v, NaN in k";
    c.p.lq = {37, 0, 90, 65}, c.p.lk = {50, 9, 90, 130}, c.p.varlen = true, c.p.causal = true;
    c.p.finish();
    c.bad = {{Where::v, 59 + 45, 0, 11, -kInf}, {Where::k, 149 + 100, 0, 2, kNaN}};
    cs.push_back(c);
  }
  {
    Case c{"softcap causal, NaN in k", fixed(1, 130, 130), {{Where::k, 64, 0, 0, kNaN}}};
    c.p.causal = true, c.p.softcap = 20.f;
    cs.push_back(c);
  }
  {  // -inf logits: row 0 (causal, seqlen_q = seqlen_k) sees only key 0 and its score overflows to -inf, so every
     // visible score is -inf: out and lse NaN (exp(-inf - (-inf))). Other rows see key 0 with a moderate score.
    Case c{"causal, -inf logit", fixed(1, 140, 140), {{Where::k, 0, 0, 0, 30.0}, {Where::q, 0, 0, 0, -3e38}}};
    c.p.causal = true, c.p.heads = c.p.heads_kv = 1;
    cs.push_back(c);
  }
  return cs;
}

std::vector<Case> backward_cases() {
  std::vector<Case> cs;
  {
    Case c{"bwd causal, NaN in v", fixed(2, 150, 170), {{Where::v, 60, 0, 9, kNaN}}, true};
    c.p.causal = true;
    cs.push_back(c);
  }
  {
    Case c{"bwd window, +inf in v", fixed(1, 160, 160), {{Where::v, 80, 0, 1, kInf}}, true};
    c.p.window_left = 20, c.p.window_right = 5;
    cs.push_back(c);
  }
  cs.push_back({"bwd full, NaN in k", fixed(2, 140, 150), {{Where::k, 33, 0, 4, kNaN}}, true});
  cs.push_back({"bwd full, NaN in q", fixed(2, 140, 150), {{Where::q, 140 + 7, 1, 4, kNaN}}, true});
  cs.push_back({"bwd full, +inf in dout", fixed(2, 140, 150), {{Where::dout, 70, 0, 12, kInf}}, true});
  {
    Case c;
    c.name = "bwd varlen causal, NaN in v";
    c.p.lq = {37, 0, 90}, c.p.lk = {50, 9, 90}, c.p.varlen = true, c.p.causal = true, c.backward = true;
    c.p.finish();
    c.bad = {{Where::v, 59 + 30, 0, 11, kNaN}};
    cs.push_back(c);
  }
  // Boundary tiles: the bad value sits in a tile that masking splits, so the tile's GEMMs multiply a masked P or dS
  // of 0 with it; the rows (dq) or keys (dk/dv) of that tile that do not see it must stay finite and exact.
  {  // key 100 of batch 0 is seen by rows >= 80 only (shift 20): dq of rows < 80 and dk/dv of the other keys finite.
    Case c{"bwd causal, NaN in k (diagonal tile)", fixed(2, 150, 170), {{Where::k, 100, 0, 4, kNaN}}, true};
    c.p.causal = true;
    cs.push_back(c);
  }
  {  // row 40 of batch 1 sees keys <= 60: dk/dv of keys > 60 (the same key tiles) finite.
    Case c{"bwd causal, NaN in q (diagonal tile)", fixed(2, 150, 170), {{Where::q, 150 + 40, 1, 7, kNaN}}, true};
    c.p.causal = true;
    cs.push_back(c);
  }
  {  // dout of row 30 reaches dv of keys <= 50 only (P = 0 x inf elsewhere), and dq of its own row.
    Case c{"bwd causal, +inf in dout (diagonal tile)", fixed(2, 150, 170), {{Where::dout, 30, 0, 12, kInf}}, true};
    c.p.causal = true;
    cs.push_back(c);
  }
  {  // both window edges: key 70 is seen by rows 65..90 only, row 120 sees keys 100..125 only.
    Case c{"bwd window, NaN in k, -inf in q, NaN in dout", fixed(1, 160, 160),
           {{Where::k, 70, 0, 2, kNaN}, {Where::q, 120, 1, 9, -kInf}, {Where::dout, 10, 0, 3, kNaN}}, true};
    c.p.window_left = 20, c.p.window_right = 5;
    cs.push_back(c);
  }
  {  // MHA (dk/dv stored by the main kernel's epilogue directly) and atomic dQ.
    Case c{"bwd causal MHA atomic, NaN in q, +inf in k", fixed(2, 150, 170),
           {{Where::q, 150 + 60, 1, 0, kNaN}, {Where::k, 110, 0, 5, kInf}}, true};
    c.p.causal = true, c.p.heads = c.p.heads_kv = 2, c.p.deterministic = false;
    cs.push_back(c);
  }
  {
    Case c{"bwd softcap sliding window, NaN in k and dout", fixed(1, 200, 200),
           {{Where::k, 90, 0, 1, kNaN}, {Where::dout, 150, 1, 6, kNaN}}, true};
    c.p.softcap = 20.f, c.p.window_left = 40, c.p.window_right = 0;
    cs.push_back(c);
  }
  {  // varlen: the bad values of one sequence stay in it (and in the rows / keys of it that see them).
    Case c;
    c.name = "bwd varlen causal, NaN in q, k and dout";
    c.p.lq = {37, 0, 90, 65}, c.p.lk = {50, 9, 90, 130}, c.p.varlen = true, c.p.causal = true, c.backward = true;
    c.p.finish();
    c.bad = {{Where::q, 37 + 10, 0, 1, kNaN}, {Where::k, 149 + 100, 0, 2, kNaN}, {Where::dout, 5, 1, 4, kInf}};
    cs.push_back(c);
  }
  return cs;
}

bool have_head_dim(int d, KernelFamily f) {
  try {
    Case c{"probe", fixed(1, 1, 1), {}};
    c.p.heads = c.p.heads_kv = 1, c.p.d = d, c.p.family = f;
    run_case(c);
    return true;
  } catch (const UnsupportedError& e) {
    std::printf("  [skipped: head_dim %d is not compiled] %s\n", d, e.what());
    return false;
  }
}

void run_all(const std::vector<Case>& cases, KernelFamily f, int d = 128) {
  if (!have_head_dim(d, f)) GTEST_SKIP() << "head_dim " << d << " not compiled";
  // A head dim without its own instantiation runs padded on a larger one: that is not the kernel this test is about.
  const std::string path = core::last_path();
  std::printf("  probe ran: %s\n", path.c_str());
  if (path.find(" hdim" + std::to_string(d) + " ") == std::string::npos) {
    GTEST_SKIP() << "head_dim " << d << " has no instantiation of its own in this build (" << path << ")";
  }
  for (Case c : cases) {
    c.p.family = f, c.p.d = d;
    run_case(c);
  }
}

TEST(CudaNonFinite, ForwardFollowsTheDefinition) { run_all(forward_cases(), KernelFamily::automatic); }
TEST(CudaNonFiniteSm80, ForwardFollowsTheDefinition) { run_all(forward_cases(), KernelFamily::sm80); }
TEST(CudaNonFiniteSm90ws, ForwardFollowsTheDefinition) {
  if (!cuda::device_runs_sm90()) GTEST_SKIP() << "no Hopper GPU running sm_90a code";
  run_all(forward_cases(), KernelFamily::sm90ws);
}
// The sm80 forward captured into a CUDA graph (two replays): the fix-up of every replay repairs the rows a NaN / inf
// reached, as eagerly.
TEST(CudaNonFiniteSm80, ForwardInsideACudaGraph) {
  std::vector<Case> cs;
  for (Case c : forward_cases()) {
    if (c.p.varlen) continue;
    c.graph = true;
    cs.push_back(c);
  }
  ASSERT_FALSE(cs.empty());
  run_all(cs, KernelFamily::sm80);
}

TEST(CudaNonFinite, BackwardFollowsTheDefinition) { run_all(backward_cases(), KernelFamily::automatic); }
TEST(CudaNonFiniteSm80, BackwardFollowsTheDefinition) { run_all(backward_cases(), KernelFamily::sm80); }
// The sm80 forward has no in-kernel rare path (the fix-up kernel covers it): its other tile configurations.
TEST(CudaNonFiniteSm80, ForwardHeadDim64FollowsTheDefinition) { run_all(forward_cases(), KernelFamily::sm80, 64); }
TEST(CudaNonFiniteSm80, ForwardHeadDim96FollowsTheDefinition) { run_all(forward_cases(), KernelFamily::sm80, 96); }
// hd96 on Hopper: `auto` runs sm80 (no sm90 kernel); hd64: sm90 / sm90ws.
TEST(CudaNonFinite, ForwardHeadDim96FollowsTheDefinition) { run_all(forward_cases(), KernelFamily::automatic, 96); }
// Other backward tile configurations (hd64: 128 x 128 on sm80 and sm90).
TEST(CudaNonFinite, BackwardHeadDim64FollowsTheDefinition) { run_all(backward_cases(), KernelFamily::automatic, 64); }
TEST(CudaNonFiniteSm80, BackwardHeadDim64FollowsTheDefinition) { run_all(backward_cases(), KernelFamily::sm80, 64); }

}  // namespace
}  // namespace flashkv::cudatest
