#include <gtest/gtest.h>

#include "flashkv/error.hpp"
#include "flashkv/types.hpp"

using namespace flashkv;

TEST(Types, ContiguousStridesAndNumel) {
  float buf[2 * 3 * 4];
  TensorView t = TensorView::contiguous(buf, DType::float32, {2, 3, 4});
  EXPECT_EQ(t.ndim, 3);
  EXPECT_EQ(t.strides[0], 12);
  EXPECT_EQ(t.strides[1], 4);
  EXPECT_EQ(t.strides[2], 1);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_TRUE(t.is_contiguous());
  t.strides[0] = 100;
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.describe(), "[2, 3, 4] float32 cpu");
}

TEST(Types, DtypeSizes) {
  EXPECT_EQ(dtype_size(DType::float32), 4u);
  EXPECT_EQ(dtype_size(DType::float16), 2u);
  EXPECT_EQ(dtype_size(DType::bfloat16), 2u);
  EXPECT_EQ(dtype_size(DType::int32), 4u);
  EXPECT_EQ(dtype_size(DType::float64), 8u);
  EXPECT_EQ(dtype_size(DType::uint8), 1u);
  EXPECT_THROW(dtype_size(static_cast<DType>(99)), Error);
}

TEST(Types, TooManyDimsIsTypedError) {
  EXPECT_THROW(TensorView::contiguous(nullptr, DType::float32, {1, 1, 1, 1, 1, 1, 1, 1, 1}), Error);
}

TEST(Errors, StructuredMessageNamesArgument) {
  Error e("k", "head_dim 64", "32");
  EXPECT_STREQ(e.what(), "flashkv: argument 'k': expected head_dim 64, got 32");
  EXPECT_EQ(e.argument(), "k");
  EXPECT_EQ(e.status(), Status::invalid_argument);
  TypeError te("q", "float16", "float32");
  EXPECT_EQ(te.status(), Status::type_error);
  const std::invalid_argument& base = te;  // derived from std::invalid_argument
  EXPECT_NE(std::string(base.what()).find("'q'"), std::string::npos);
}
