// Tile loads of the CPU kernels (src/cpu/tile_io.hpp): the branch-free float16 conversion equals the reference
// conversion (src/core/float16.hpp) for every bit pattern, and (transposed) loads convert every dtype exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/reference.hpp"
#include "core/float16.hpp"
#include "cpu/tile_io.hpp"

using namespace flashkv;

namespace {

TEST(TileIo, FastFloat16ConversionIsExactForEveryBitPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float a = cpu::fp16_to_float_fast(static_cast<uint16_t>(h));
    const float b = fp16_to_float(static_cast<uint16_t>(h));
    EXPECT_EQ(float_to_bits(a), float_to_bits(b)) << "bits 0x" << std::hex << h;
  }
}

TEST(TileIo, LoadsAndTransposedLoadsConvertEveryDtype) {
  std::mt19937_64 rng = flashkv::testing::make_rng(0x7001);
  for (DType t : {DType::float32, DType::float16, DType::bfloat16}) {
    const int rows = 37, dim = 59;
    const int64_t stride = 70;  // padded rows
    flashkv::testing::HostTensor x(t, {rows, dim}, stride - dim);
    x.randn(rng);
    std::vector<float> a(static_cast<std::size_t>(rows) * dim), b(static_cast<std::size_t>(dim) * cpu::kBlockN, -1.0f);
    cpu::load_rows(x.view.data, t, stride, rows, dim, a.data());
    cpu::load_rows_transposed(x.view.data, t, stride, rows, dim, b.data());
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < dim; ++c) {
        EXPECT_EQ(a[static_cast<std::size_t>(r) * dim + c], x.get(r * dim + c));
        EXPECT_EQ(b[static_cast<std::size_t>(c) * cpu::kBlockN + r], x.get(r * dim + c));
      }
    }
    for (int c = 0; c < dim; ++c) {
      for (int r = rows; r < cpu::kBlockN; ++r) EXPECT_EQ(b[static_cast<std::size_t>(c) * cpu::kBlockN + r], 0.0f);
    }
  }
}

}  // namespace
