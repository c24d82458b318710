// The tensor type's checks and conversions.
#include <cmath>

#include <gtest/gtest.h>

#include "core/tensor.h"
#include "support/expect_error.h"

namespace asynct {
namespace {

using testing::expect_error;

TEST(Tensor, ShapeAndDtypeChecksNameTheProblem) {
  Tensor t = Tensor::empty(DType::BF16, {7, 8, 128});
  expect_error([&] { expect_shape(t, {7, 16, 128}, "attention: query"); },
               "attention: query: expected shape [7, 16, 128], got [7, 8, 128]");
  expect_error([&] { expect_dtype(t, DType::F32, "norm: x"); }, "norm: x: expected float32, got bfloat16[7, 8, 128]");
  expect_shape(t, {any, 8, any}, "wildcards");
  expect_error([&] { t.reshape({7, 8}); }, "cannot become [7, 8]");
  expect_error([&] { t.data_as<float>(); }, "tensor holds bfloat16, accessed as float32");
  expect_error([&] { Tensor::empty(DType::F32, {2, 3}).at<float>(6); }, "index 6 out of range");
  expect_error([&] { t.size(3); }, "dimension 3 out of range");
  EXPECT_EQ(t.size(-1), 128);
  EXPECT_EQ(t.nbytes(), 7u * 8u * 128u * 2u);
}

TEST(Tensor, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties go to the even mantissa (1.0).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 0x1p-8f)), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 0x1.8p-8f)), 1.0078125f);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  EXPECT_EQ(bf16_to_float(float_to_bf16(-3.5f)), -3.5f);
}

TEST(Tensor, F16ConversionsRoundTrip) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f, 0.1f})
    EXPECT_NEAR(f16_to_float(float_to_f16(v)), v, std::fabs(v) * 1e-3 + 1e-12) << v;
  EXPECT_EQ(float_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16(1e6f), 0x7c00);  // overflow is infinity
  for (std::uint32_t bits = 0; bits < 0x7c00; ++bits)  // every finite positive half survives
    ASSERT_EQ(float_to_f16(f16_to_float(std::uint16_t(bits))), bits);
}

TEST(Tensor, ConversionBetweenFloatTypes) {
  Tensor t = Tensor::from_vector<float>({1.0f, -0.333333f, 1e-3f}, {3});
  std::vector<float> back = t.to(DType::BF16).to_float_vector();
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_NEAR(back[1], -0.333333f, 2e-3);
  expect_error([&] { t.to(DType::I32); }, "cannot convert float32 to int32");
}

}  // namespace
}  // namespace asynct
