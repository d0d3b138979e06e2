// The non-finite contract of the CPU attention kernels (include/flashkv/attention.hpp "NON-FINITE INPUTS"): one NaN or
// ±inf in q, k, v or dout, placed inside a tile that the mask splits (so masked keys sit next to the bad one), for
// every forward algorithm (tiled, v1, naive), the backward, dense and varlen, causal / window / GQA / softcap /
// seqlen_q > seqlen_k, float32 and 16-bit dtypes. Checked against the float64 reference of the contract
// (tests/common/reference_nonfinite.hpp): the class {NaN, +inf, −inf, finite} of every output element, finite values
// within the usual tolerance, and — the "rows that do not see the bad key are unaffected" rule — every element the
// bad value cannot reach is bit-for-bit the value computed without it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/reference.hpp"
#include "common/reference_nonfinite.hpp"
#include "flashkv/attention.hpp"

using namespace flashkv;
using namespace flashkv::testing;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

/// Where the bad value goes.
enum class Poke { none, k_nan, k_pos_inf, k_neg_inf, v_nan, v_pos_inf, v_neg_inf, q_nan, q_pos_inf, dout_nan };

const char* poke_name(Poke p) {
  switch (p) {
    case Poke::none: return "none";
    case Poke::k_nan: return "k=NaN";
    case Poke::k_pos_inf: return "k=+inf";
    case Poke::k_neg_inf: return "k=-inf";
    case Poke::v_nan: return "v=NaN";
    case Poke::v_pos_inf: return "v=+inf";
    case Poke::v_neg_inf: return "v=-inf";
    case Poke::q_nan: return "q=NaN";
    case Poke::q_pos_inf: return "q=+inf";
    case Poke::dout_nan: return "dout=NaN";
  }
  return "?";
}

struct NfCase {
  std::string name;
  DType dtype = DType::float32;
  // fixed length (batch × seqlen) unless lq/lk are given (varlen)
  int64_t batch = 2, seqlen_q = 150, seqlen_k = 150;
  std::vector<int64_t> lq, lk;
  int64_t h = 4, hk = 2, d = 32, dv = 32;
  bool causal = true;
  int32_t wl = -1, wr = -1;
  float softcap = 0.0f;
  // the poked element: sequence, local key row, local query row, head (query head; kv head = head / group), channel
  int64_t seq = 1, key = 70, query = 100, head = 3, chan = 5;

  bool varlen() const { return !lq.empty(); }
  RefVarlenShape shape() const {
    RefVarlenShape s;
    if (varlen()) {
      s.cu_seqlens_q = {0};
      s.cu_seqlens_k = {0};
      for (std::size_t b = 0; b < lq.size(); ++b) {
        s.cu_seqlens_q.push_back(s.cu_seqlens_q.back() + lq[b]);
        s.cu_seqlens_k.push_back(s.cu_seqlens_k.back() + lk[b]);
      }
    } else {
      s.cu_seqlens_q = uniform_cu_seqlens(batch, seqlen_q);
      s.cu_seqlens_k = uniform_cu_seqlens(batch, seqlen_k);
    }
    s.num_heads = h;
    s.num_heads_kv = hk;
    s.head_dim = d;
    s.head_dim_v = dv;
    return s;
  }
  RefOptions ref_options() const {
    RefOptions r;
    r.softmax_scale = static_cast<double>(1.0f / std::sqrt(static_cast<float>(d)));
    r.causal = causal;
    r.window_size_left = wl;
    r.window_size_right = wr;
    r.softcap = softcap;
    return r;
  }
  AttentionOptions options(Algorithm alg) const {
    AttentionOptions o;
    o.causal = causal;
    o.window_size_left = wl;
    o.window_size_right = wr;
    o.softcap = softcap;
    o.algorithm = alg;
    return o;
  }
};

/// Inputs in the packed layout (a fixed-length batch is allocated bshd, which has the same element order).
struct Tensors {
  HostTensor q, k, v, dout, cu_q, cu_k;
  int64_t max_q = 0, max_k = 0;
};

Tensors make_tensors(const NfCase& c, std::mt19937_64& rng) {
  Tensors t;
  const RefVarlenShape s = c.shape();
  if (c.varlen()) {
    t.q = HostTensor(c.dtype, {s.total_q(), c.h, c.d});
    t.k = HostTensor(c.dtype, {s.total_k(), c.hk, c.d});
    t.v = HostTensor(c.dtype, {s.total_k(), c.hk, c.dv});
    t.dout = HostTensor(c.dtype, {s.total_q(), c.h, c.dv});
    std::vector<int32_t> cq(s.cu_seqlens_q.begin(), s.cu_seqlens_q.end()), ck(s.cu_seqlens_k.begin(), s.cu_seqlens_k.end());
    t.cu_q = int32_tensor(cq);
    t.cu_k = int32_tensor(ck);
    for (std::size_t b = 0; b < c.lq.size(); ++b) {
      t.max_q = std::max(t.max_q, c.lq[b]);
      t.max_k = std::max(t.max_k, c.lk[b]);
    }
  } else {
    t.q = HostTensor(c.dtype, {c.batch, c.seqlen_q, c.h, c.d});
    t.k = HostTensor(c.dtype, {c.batch, c.seqlen_k, c.hk, c.d});
    t.v = HostTensor(c.dtype, {c.batch, c.seqlen_k, c.hk, c.dv});
    t.dout = HostTensor(c.dtype, {c.batch, c.seqlen_q, c.h, c.dv});
  }
  t.q.randn(rng);
  t.k.randn(rng);
  t.v.randn(rng);
  t.dout.randn(rng);
  return t;
}

/// Applies the poke; returns false when the case has no such element (e.g. an empty sequence).
bool apply_poke(const NfCase& c, Poke p, Tensors& t) {
  const RefVarlenShape s = c.shape();
  const int64_t iq = s.cu_seqlens_q[c.seq] + c.query, jk = s.cu_seqlens_k[c.seq] + c.key;
  const int64_t hk = c.head / (c.h / c.hk);
  const int64_t qe = (iq * c.h + c.head) * c.d + c.chan, ke = (jk * c.hk + hk) * c.d + c.chan;
  const int64_t ve = (jk * c.hk + hk) * c.dv + c.chan, de = (iq * c.h + c.head) * c.dv + c.chan;
  switch (p) {
    case Poke::none: return true;
    case Poke::k_nan: t.k.set(ke, kNaN); return true;
    case Poke::k_pos_inf: t.k.set(ke, kInf); return true;
    case Poke::k_neg_inf: t.k.set(ke, -kInf); return true;
    case Poke::v_nan: t.v.set(ve, kNaN); return true;
    case Poke::v_pos_inf: t.v.set(ve, kInf); return true;
    case Poke::v_neg_inf: t.v.set(ve, -kInf); return true;
    case Poke::q_nan: t.q.set(qe, kNaN); return true;
    case Poke::q_pos_inf: t.q.set(qe, kInf); return true;
    case Poke::dout_nan: t.dout.set(de, kNaN); return true;
  }
  return false;
}

struct Outputs {
  HostTensor out, lse, dq, dk, dv;
};

Outputs run_kernel(const NfCase& c, Algorithm alg, const Tensors& t, bool backward) {
  Outputs r;
  const RefVarlenShape s = c.shape();
  const AttentionOptions o = c.options(alg);
  if (c.varlen()) {
    r.out = HostTensor(c.dtype, {s.total_q(), c.h, c.dv});
    r.lse = HostTensor(DType::float32, {c.h, s.total_q()});
  } else {
    r.out = HostTensor(c.dtype, {c.batch, c.seqlen_q, c.h, c.dv});
    r.lse = HostTensor(DType::float32, {c.batch, c.h, c.seqlen_q});
  }
  r.out.fill(12345.0);  // sentinels: an unwritten element shows up as a value mismatch
  r.lse.fill(12345.0);
  if (c.varlen()) {
    attention_varlen_forward(t.q.view, t.k.view, t.v.view, t.cu_q.view, t.cu_k.view, t.max_q, t.max_k, r.out.view,
                             &r.lse.view, o);
  } else {
    attention_forward(t.q.view, t.k.view, t.v.view, r.out.view, &r.lse.view, o);
  }
  if (!backward) return r;
  r.dq = t.q;
  r.dk = t.k;
  r.dv = t.v;
  r.dq.fill(12345.0);
  r.dk.fill(12345.0);
  r.dv.fill(12345.0);
  if (c.varlen()) {
    attention_varlen_backward(t.q.view, t.k.view, t.v.view, t.cu_q.view, t.cu_k.view, t.max_q, t.max_k, r.out.view,
                              r.lse.view, t.dout.view, r.dq.view, r.dk.view, r.dv.view, o);
  } else {
    attention_backward(t.q.view, t.k.view, t.v.view, r.out.view, r.lse.view, t.dout.view, r.dq.view, r.dk.view,
                       r.dv.view, o);
  }
  return r;
}

std::vector<double> packed_lse(const NfCase& c, const HostTensor& lse) {
  const std::vector<double> x = lse.to_double();
  return c.varlen() ? x : lse_bhs_to_packed(x, c.batch, c.h, c.seqlen_q);
}

double fwd_rtol(DType t) { return t == DType::float32 ? 1e-5 : t == DType::float16 ? 2e-3 : 1.6e-2; }
double bwd_rtol(DType t) { return t == DType::float32 ? 2e-5 : t == DType::float16 ? 4e-3 : 3.2e-2; }

/// Elements whose reference value is unchanged by the poke (bitwise) must be unchanged in the kernel too.
std::string compare_unaffected(const char* what, const std::vector<double>& ref_clean,
                               const std::vector<double>& ref_poked, const std::vector<double>& got_clean,
                               const std::vector<double>& got_poked) {
  int64_t bad = 0, checked = 0;
  std::string first;
  for (std::size_t i = 0; i < ref_clean.size(); ++i) {
    if (!(std::isfinite(ref_poked[i]) && std::memcmp(&ref_clean[i], &ref_poked[i], sizeof(double)) == 0)) continue;
    ++checked;
    if (got_clean[i] != got_poked[i] && bad++ < 3) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "  %s[%zu]: %.9g without the bad value, %.9g with it\n", what, i, got_clean[i],
                    got_poked[i]);
      first += buf;
    }
  }
  if (checked == 0) return std::string(what) + ": no unaffected element (the case cannot show the rule)\n";
  if (bad == 0) return "";
  return std::string(what) + ": " + std::to_string(bad) + " of " + std::to_string(checked) +
         " unaffected elements changed\n" + first;
}

/// Runs one (case, poke, algorithm): forward always, backward for the tiled algorithm (the backward has one).
std::string check(const NfCase& c, Poke p, Algorithm alg, uint64_t salt) {
  std::mt19937_64 rng = make_rng(salt);
  const Tensors clean = make_tensors(c, rng);
  Tensors t = clean;
  apply_poke(c, p, t);
  const bool bwd = alg == Algorithm::tiled;
  const RefVarlenShape s = c.shape();
  const RefOptions ro = c.ref_options();
  std::vector<double> out_ref, lse_ref, out_ref0, lse_ref0;
  ieee_reference_forward(s, ro, t.q.to_double(), t.k.to_double(), t.v.to_double(), out_ref, lse_ref);
  ieee_reference_forward(s, ro, clean.q.to_double(), clean.k.to_double(), clean.v.to_double(), out_ref0, lse_ref0);
  const Outputs got = run_kernel(c, alg, t, bwd);
  const Outputs got0 = run_kernel(c, alg, clean, false);
  std::string report;
  report += compare_classified("out", got.out.to_double(), out_ref, fwd_rtol(c.dtype));
  report += compare_classified("lse", packed_lse(c, got.lse), lse_ref, 1e-5);
  report += compare_unaffected("out (unaffected)", out_ref0, out_ref, got0.out.to_double(), got.out.to_double());
  report += compare_unaffected("lse (unaffected)", lse_ref0, lse_ref, packed_lse(c, got0.lse), packed_lse(c, got.lse));
  if (bwd) {
    std::vector<double> dq, dk, dv;
    ieee_reference_backward(s, ro, t.q.to_double(), t.k.to_double(), t.v.to_double(), out_ref, lse_ref,
                            t.dout.to_double(), dq, dk, dv);
    report += compare_classified("dq", got.dq.to_double(), dq, bwd_rtol(c.dtype));
    report += compare_classified("dk", got.dk.to_double(), dk, bwd_rtol(c.dtype));
    report += compare_classified("dv", got.dv.to_double(), dv, bwd_rtol(c.dtype));
  }
  if (report.empty()) return "";
  return c.name + " " + dtype_name(c.dtype) + " alg=" + algorithm_name(alg) + " poke=" + poke_name(p) + "\n" + report;
}

const Algorithm kAlgorithms[] = {Algorithm::tiled, Algorithm::v1_order, Algorithm::naive};
const Poke kPokes[] = {Poke::k_nan,     Poke::k_pos_inf, Poke::k_neg_inf, Poke::v_nan,    Poke::v_pos_inf,
                       Poke::v_neg_inf, Poke::q_nan,     Poke::q_pos_inf, Poke::dout_nan};

void run_all_pokes(const NfCase& c, uint64_t salt) {
  for (Algorithm alg : kAlgorithms) {
    for (Poke p : kPokes) {
      if (p == Poke::dout_nan && alg != Algorithm::tiled) continue;  // forward-only algorithms never read dout
      const std::string r = check(c, p, alg, salt + static_cast<uint64_t>(p) * 17);
      EXPECT_TRUE(r.empty()) << r;
    }
  }
}

// ---- the cases ---------------------------------------------------------------------------------------------------

/// One sequence of (sq, sk), h/hk heads, d = dv; the poke in sequence 0, query head `head`.
NfCase single(const char* name, int64_t sq, int64_t sk, int64_t h, int64_t hk, int64_t d, int64_t head) {
  NfCase c;
  c.name = name;
  c.batch = 1;
  c.seq = 0;
  c.seqlen_q = sq;
  c.seqlen_k = sk;
  c.h = h;
  c.hk = hk;
  c.head = head;
  c.d = c.dv = d;
  return c;
}

TEST(NonFinite, CausalGqaDense) {
  NfCase c;
  c.name = "causal b=2 s=150 h=4/2 d=32";  // key 70 sits in the diagonal tile of query block 0 (rows 0..127)
  run_all_pokes(c, 0x7001);
}

TEST(NonFinite, WindowedDenseSeqlenQNeSeqlenK) {
  NfCase c;
  c.name = "window(40,3) b=2 sq=150 sk=131 h=4/2 d=32";
  c.causal = false;
  c.seqlen_k = 131;
  c.wl = 40;
  c.wr = 3;
  c.key = 64;  // first key of a K/V tile: seen by queries ~49..105 only
  c.query = 80;
  run_all_pokes(c, 0x7002);
}

TEST(NonFinite, NonCausalSoftcapMha) {
  NfCase c = single("full softcap=5 b=1 s=70/90 h=2/2 d=16", 70, 90, 2, 2, 16, 1);
  c.causal = false;
  c.softcap = 5.0f;  // +inf scores become softcap: finite rows
  c.key = 33;
  c.query = 50;
  run_all_pokes(c, 0x7003);
}

TEST(NonFinite, CausalMoreQueriesThanKeysEmptyRows) {
  // causal sq = 150 > sk = 40: rows 0..109 see no key; a NaN in such a row's q (or dout) must leave out = 0,
  // lse = −inf and every gradient it would reach untouched.
  NfCase c = single("causal sq=150 sk=40 b=1 h=2/1 d=16", 150, 40, 2, 1, 16, 1);
  c.key = 20;
  for (int64_t query : {int64_t{60}, int64_t{130}}) {  // an empty row, then a row that sees keys 0..20
    c.query = query;
    run_all_pokes(c, 0x7004 + static_cast<uint64_t>(query));
  }
}

TEST(NonFinite, VarlenCausalWithEmptySequences) {
  NfCase c;
  c.name = "varlen causal h=2/1 d=16";
  c.lq = {0, 70, 130, 5};
  c.lk = {3, 90, 130, 0};
  c.h = 2;
  c.hk = 1;
  c.head = 0;
  c.d = c.dv = 16;
  c.seq = 2;
  c.key = 70;
  c.query = 100;
  run_all_pokes(c, 0x7005);
}

TEST(NonFinite, SixteenBitDtypes) {
  for (DType t : {DType::bfloat16, DType::float16}) {
    NfCase c;
    c.name = "causal b=2 s=150 h=4/2 d=32";
    c.dtype = t;
    run_all_pokes(c, 0x7006 + static_cast<uint64_t>(t));
  }
}

TEST(NonFinite, AllVisibleScoresMinusInfGiveNaN) {
  // Window (0, 0): row i sees key i only. k_i = −inf in a channel where q_i > 0 makes its one score −inf:
  // exp(−inf − (−inf)) = NaN, so the row is NaN with a NaN lse — not the "no visible key" (0, −inf) answer.
  for (Algorithm alg : kAlgorithms) {
    NfCase c = single("window(0,0) b=1 s=100 h=1/1 d=16", 100, 100, 1, 1, 16, 0);
    c.causal = false;
    c.wl = c.wr = 0;
    c.key = c.query = 37;
    std::mt19937_64 rng = make_rng(0x7007);
    Tensors t = make_tensors(c, rng);
    const int64_t qe = 37 * 16 + 5, ke = 37 * 16 + 5;
    t.q.set(qe, std::fabs(t.q.get(qe)));
    t.k.set(ke, -kInf);
    const Outputs got = run_kernel(c, alg, t, alg == Algorithm::tiled);
    for (int64_t i = 0; i < 100; ++i) {
      const double l = got.lse.get(i);
      if (i == 37) {
        EXPECT_TRUE(std::isnan(l)) << algorithm_name(alg) << " lse " << l;
        for (int64_t ch = 0; ch < 16; ++ch) EXPECT_TRUE(std::isnan(got.out.get(i * 16 + ch))) << algorithm_name(alg);
      } else {
        EXPECT_TRUE(std::isfinite(l)) << algorithm_name(alg) << " row " << i;
      }
    }
    if (alg == Algorithm::tiled) {  // and the backward agrees with the reference
      std::vector<double> o, l, dq, dk, dv;
      const RefVarlenShape s = c.shape();
      ieee_reference_forward(s, c.ref_options(), t.q.to_double(), t.k.to_double(), t.v.to_double(), o, l);
      ieee_reference_backward(s, c.ref_options(), t.q.to_double(), t.k.to_double(), t.v.to_double(), o, l,
                              t.dout.to_double(), dq, dk, dv);
      EXPECT_EQ(compare_classified("dq", got.dq.to_double(), dq, 2e-5), "");
      EXPECT_EQ(compare_classified("dk", got.dk.to_double(), dk, 2e-5), "");
      EXPECT_EQ(compare_classified("dv", got.dv.to_double(), dv, 2e-5), "");
    }
  }
}

TEST(NonFinite, LogitsThatOverflowFloat32AreInfNotMasked) {
  // q·k = 1e40 does not fit float32: the score is +inf and the row is NaN (IEEE: exp(inf − inf)), never the
  // "no visible key" answer. Rows whose score is −1e19·scale or finite stay finite.
  for (Algorithm alg : kAlgorithms) {
    NfCase c;
    c.name = "overflow causal b=2 s=150 h=4/2 d=32";
    std::mt19937_64 rng = make_rng(0x7008);
    Tensors t = make_tensors(c, rng);
    const RefVarlenShape s = c.shape();
    const int64_t iq = s.cu_seqlens_q[c.seq] + c.query, jk = s.cu_seqlens_k[c.seq] + c.key;
    t.q.set((iq * c.h + c.head) * c.d + c.chan, 1e20);
    t.k.set((jk * c.hk + c.head / 2) * c.d + c.chan, 1e20);
    const Outputs got = run_kernel(c, alg, t, false);
    std::vector<double> o, l;
    ieee_reference_forward(s, c.ref_options(), t.q.to_double(), t.k.to_double(), t.v.to_double(), o, l);
    EXPECT_EQ(compare_classified("out", got.out.to_double(), o, 1e-5), "") << algorithm_name(alg);
    EXPECT_EQ(compare_classified("lse", packed_lse(c, got.lse), l, 1e-5), "") << algorithm_name(alg);
    EXPECT_TRUE(std::isnan(l[static_cast<std::size_t>(c.head * s.total_q() + iq)]));  // the reference's verdict
  }
}

TEST(NonFinite, MinusInfLseOnlyForRowsWithoutKeys) {
  // Over every case above: a −inf lse appears exactly where the row sees no key.
  NfCase c = single("causal sq=150 sk=40", 150, 40, 2, 1, 16, 0);
  for (Algorithm alg : kAlgorithms) {
    for (Poke p : {Poke::k_nan, Poke::q_nan, Poke::k_neg_inf}) {
      std::mt19937_64 rng = make_rng(0x7009);
      Tensors t = make_tensors(c, rng);
      c.key = 0;
      c.query = 120;
      apply_poke(c, p, t);
      const Outputs got = run_kernel(c, alg, t, false);
      for (int64_t h = 0; h < 2; ++h) {
        for (int64_t i = 0; i < 150; ++i) {
          const bool empty = i < 110;
          EXPECT_EQ(std::isinf(got.lse.get(h * 150 + i)) && got.lse.get(h * 150 + i) < 0, empty)
              << algorithm_name(alg) << " " << poke_name(p) << " h=" << h << " row " << i;
        }
      }
    }
  }
}

}  // namespace
