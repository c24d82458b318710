// Embedding, linear and SwiGLU against hand cases; clear errors for bad ids and shapes.
#include <cmath>

#include <gtest/gtest.h>

#include "reference/layers.h"
#include "support/expect_error.h"

namespace asynct {
namespace {

using testing::expect_error;

TEST(Layers, EmbeddingLooksUpRowsAndRejectsBadIds) {
  Tensor table = Tensor::from_vector<float>({0, 1, 10, 11, 20, 21}, {3, 2});
  Tensor e = embedding(table, {2, 0, 2});
  EXPECT_EQ(e.to_float_vector(), (std::vector<float>{20, 21, 0, 1, 20, 21}));
  expect_error([&] { embedding(table, {1, 3}); }, "token id 3 at position 1 is outside the vocabulary [0, 3)");
  expect_error([&] { embedding(table, {-1}); }, "token id -1");
}

TEST(Layers, LinearIsXTimesWeightTransposed) {
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor w = Tensor::from_vector<float>({1, 0, 0, 0, 1, 1}, {2, 3});  // [out 2, in 3]
  EXPECT_EQ(linear(x, w).to_float_vector(), (std::vector<float>{1, 5, 4, 11}));
  expect_error([&] { linear(x, Tensor::empty(DType::F32, {2, 4})); }, "linear: weight: expected shape [*, 3]");
}

TEST(Layers, SwigluIsSiluOfGateTimesUp) {
  Tensor gu = Tensor::from_vector<float>({0, 1, 3, -2}, {1, 4});  // gate [0, 1], up [3, -2]
  std::vector<float> y = swiglu(gu).to_float_vector();
  EXPECT_NEAR(y[0], 0.0, 1e-7);
  EXPECT_NEAR(y[1], 1.0 / (1.0 + std::exp(-1.0)) * -2.0, 1e-6);
}

}  // namespace
}  // namespace asynct
