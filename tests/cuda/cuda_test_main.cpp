// main() of the CUDA tests: prints the seed; exits with 77 (ctest SKIP_RETURN_CODE) when no CUDA device is present.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>

#include "cuda_test_util.hpp"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (!GTEST_FLAG_GET(list_tests)) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      std::printf("no CUDA device: skipping\n");
      return 77;
    }
    flashkv::testing::test_seed();  // prints "[flashkv-test] seed = N (reproduce with FLASHKV_TEST_SEED=N)"
  }
  return RUN_ALL_TESTS();
}
