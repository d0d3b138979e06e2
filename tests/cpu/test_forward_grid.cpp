// Forward grid: dtypes × head_dim × (seqlen_q, seqlen_k) × causal × window × softcap × MHA/GQA/MQA, every case
// against the float64 reference (tests/common/reference.hpp) with the tolerance rule of attention_harness.hpp.
// The default run samples the product so that every value of every axis appears (and every feature is combined with
// every dtype); FLASHKV_FULL_TESTS=1 runs the full product.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "attention_harness.hpp"
#include "common/reference.hpp"

using namespace flashkv;
using namespace flashkv::testing;

namespace {

const DType kDtypes[] = {DType::float32, DType::float16, DType::bfloat16};
const int64_t kHeadDims[] = {8, 16, 32, 59, 64, 96, 128, 256};
struct Pair {
  int64_t q, k;
  bool large;
};
const Pair kPairs[] = {{1, 1, false},       {113, 203, false},   {203, 113, false}, {128, 217, false},
                       {1, 4096, true},     {1023, 1024, true},  {1024, 1023, true}};

/// Feature combination #f (of 12): {none, causal, window(W−1,0), two-sided window} × softcap {0, 30} × heads
/// {MHA, GQA, MQA} folded so that consecutive indices differ in every axis.
void apply_features(AttnCase& c, int f) {
  switch (f % 4) {
    case 0: break;
    case 1: c.causal = true; break;
    case 2: c.window_size_left = 31; c.window_size_right = 0; break;    // sliding window W = 32
    case 3: c.window_size_left = 17; c.window_size_right = 9; break;    // local, two-sided
  }
  c.softcap = (f / 4) % 2 == 1 ? 30.0f : 0.0f;
  switch (f % 3) {
    case 0: c.num_heads = 2; c.num_heads_kv = 2; break;  // MHA
    case 1: c.num_heads = 4; c.num_heads_kv = 2; break;  // GQA
    case 2: c.num_heads = 3; c.num_heads_kv = 1; break;  // MQA
  }
}

std::vector<AttnCase> grid() {
  std::vector<AttnCase> cases;
  const bool full = full_tests();
  int idx = 0;
  for (DType t : kDtypes) {
    for (int64_t d : kHeadDims) {
      for (const Pair& pr : kPairs) {
        const int features = full ? 12 : 1;
        for (int f0 = 0; f0 < features; ++f0, ++idx) {
          // Default: small pairs for every (dtype, d); large pairs only for one dtype per d (rotating) and d <= 128.
          if (!full && pr.large && (static_cast<int>(t) != static_cast<int>(d / 8) % 3 || d > 128)) continue;
          AttnCase c;
          c.dtype = t;
          c.head_dim = d;
          c.seqlen_q = pr.q;
          c.seqlen_k = pr.k;
          c.batch = pr.large ? 1 : 2;
          apply_features(c, full ? f0 : idx);
          if (pr.large) {  // keep the float64 reference affordable
            c.num_heads = c.num_heads / c.num_heads_kv == 1 ? 1 : c.num_heads / c.num_heads_kv;
            c.num_heads_kv = 1;
          }
          cases.push_back(c);
        }
      }
    }
  }
  return cases;
}

class ForwardGrid : public ::testing::TestWithParam<AttnCase> {};

TEST_P(ForwardGrid, MatchesFloat64Reference) {
  const AttnCase& c = GetParam();
  const CheckResult r = check_forward(c, 0x1000 + static_cast<uint64_t>(c.head_dim * 131 + c.seqlen_q));
  if (std::getenv("FLASHKV_TEST_VERBOSE") != nullptr) std::fprintf(stderr, "%s", r.report.c_str());
  EXPECT_TRUE(r.ok) << r.report;
}

INSTANTIATE_TEST_SUITE_P(Cpu, ForwardGrid, ::testing::ValuesIn(grid()),
                         [](const ::testing::TestParamInfo<AttnCase>& info) {
                           const AttnCase& c = info.param;
                           return std::string(dtype_name(c.dtype)) + "_d" + std::to_string(c.head_dim) + "_q" +
                                  std::to_string(c.seqlen_q) + "_k" + std::to_string(c.seqlen_k) + "_" +
                                  std::to_string(info.index);
                         });

}  // namespace
