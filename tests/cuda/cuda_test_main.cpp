// main() of the CUDA tests: prints the seed; exits with 77 (ctest SKIP_RETURN_CODE) when no CUDA device is present.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "cuda_test_util.hpp"

namespace flashkv::cudatest {
uint64_t test_seed() {
  static const uint64_t seed = [] {
    if (const char* s = std::getenv("FLASHKV_TEST_SEED")) return static_cast<uint64_t>(std::stoull(s));
    return static_cast<uint64_t>(std::random_device{}());
  }();
  return seed;
}
}  // namespace flashkv::cudatest

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (!GTEST_FLAG_GET(list_tests)) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      std::printf("no CUDA device: skipping\n");
      return 77;
    }
    std::printf("FLASHKV_TEST_SEED=%llu\n", static_cast<unsigned long long>(flashkv::cudatest::test_seed()));
  }
  return RUN_ALL_TESTS();
}
