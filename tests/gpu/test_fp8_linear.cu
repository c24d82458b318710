// The FP8-weight product (kernels/gemm/fp8_linear.h) against the CPU reference: the weights
// dequantized by the loader's own function (dequantize_projection: e4m3 value times its
// block's scale), then the reference product. x is bf16-exact. Each weight times its scale is
// rounded to bf16 for the tensor cores (2^-9 relative at most), so every output is within
// 2^-8 sum_k |w x| of the reference with fp32 out (the rest is the fp32 sums' order), and
// 2^-8 more of its value with bf16 out; a bound, not an average, so a single cancelling sum
// cannot fail it falsely.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>
#include <tuple>

#include "core/fp8.h"
#include "gpu/device_buffer.h"
#include "kernels/gemm/fp8_linear.h"
#include "models/weights.h"
#include "reference/layers.h"
#include "support/compare.h"
#include "support/random.h"

namespace asynct {
namespace {

using kernels::bf16;
using testing::close_to;
using testing::DeviceBuffer;
using testing::Random;

constexpr double kWeightRounding = 1.0 / 256;

// Every output finite and within the bound above of the reference.
::testing::AssertionResult within_rounding(const Tensor& got, const Tensor& expected, const Tensor& magnitude, bool bf16_out) {
  const float *g = got.data_as<float>(), *e = expected.data_as<float>(), *m = magnitude.data_as<float>();
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const double bound = kWeightRounding * m[i] + (bf16_out ? kWeightRounding * std::abs(e[i]) : 0.0) + 1e-6;
    if (!std::isfinite(g[i]) || std::abs(double(g[i]) - e[i]) > bound)
      return ::testing::AssertionFailure() << "output " << i << ": " << g[i] << " against " << e[i] << " (bound " << bound << ")";
  }
  return ::testing::AssertionSuccess();
}

Tensor absolute(const Tensor& t) {
  Tensor a = t.to(DType::F32);
  for (std::int64_t i = 0; i < a.numel(); ++i) a.data_as<float>()[i] = std::abs(a.data_as<float>()[i]);
  return a;
}

// A random [out, in] FP8 matrix with one scale per row and block of block_cols inputs, the
// scales spread over two decades (as real layers' are).
struct Fp8Weights {
  Tensor values, scales;
};
Fp8Weights random_fp8(Random& rng, int out, int in, int block_cols) {
  const int scale_cols = (in + block_cols - 1) / block_cols;
  Tensor scales = rng.uniform({out, scale_cols}, -2.0f, 0.0f);
  float* s = scales.data_as<float>();
  for (std::int64_t i = 0; i < scales.numel(); ++i) s[i] = std::pow(10.0f, s[i]) / 448.0f;
  Tensor values = Tensor::empty(DType::F8E4M3, {out, in});
  Tensor normal = rng.normal({out, in}, 150.0f);
  auto* v = values.data_as<fp8_e4m3_bits>();
  const float* f = normal.data_as<float>();
  for (std::int64_t i = 0; i < values.numel(); ++i) v[i].bits = float_to_fp8_e4m3(f[i]);
  return {values, scales};
}

kernels::Fp8Matrix matrix_of(const DeviceBuffer& values, const DeviceBuffer& scales, int out, int in, int block_cols) {
  kernels::Fp8Matrix m;
  m.values = values.as<std::uint8_t>();
  m.scales = scales.as<float>();
  m.out = out;
  m.in = in;
  m.block_cols = block_cols;
  return m;
}

// The split partials a product left, added in split order: [rows, out].
Tensor sum_of_splits(const kernels::LinearOutput& o, int rows, int out) {
  Tensor sum = Tensor::empty(DType::F32, {rows, out});
  std::fill_n(sum.data_as<float>(), sum.numel(), 0.0f);
  std::vector<float> split(std::size_t(rows) * out);
  for (int s = 0; s < o.splits; ++s) {
    ASYNCT_CUDA_CHECK(cudaMemcpy(split.data(), o.partials + s * o.split_stride, split.size() * sizeof(float),
                                 cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < split.size(); ++i) sum.data_as<float>()[i] += split[i];
  }
  return sum;
}

// rows, in, out, block_cols: one row (decode), each count of n8 tiles with ragged rows, inputs
// not a multiple of the block, of a 64-input chunk or of a CTA's eight warps' chunks, outputs not
// a multiple of 16, the widest dense input, a down projection's 6144 inputs (partials only),
// more column tiles than the GPU holds CTAs.
constexpr std::tuple<int, int, int, int> kShapes[] = {
    {1, 2048, 2048, 128}, {1, 16, 1, 16}, {3, 48, 77, 48},   {9, 1040, 300, 128}, {4, 6144, 64, 128},
    {32, 528, 130, 64},   {17, 2064, 1001, 128}, {2, kernels::kFp8LinearDenseMaxIn, 33, 128}, {32, 6144, 40, 128},
    {2, 64, 9000, 64}, {32, 528, 4100, 64}};  // more column tiles than CTAs: each CTA loops

TEST(Fp8Linear, MatchesTheDequantizedReferenceOnAwkwardShapes) {
  testing::require_gpu();
  Random rng(7);
  for (auto [rows, in, out, block_cols] : kShapes) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(in) + " -> " + std::to_string(out) + ", blocks of " +
                 std::to_string(block_cols));
    Fp8Weights w = random_fp8(rng, out, in, block_cols);
    Tensor x = rng.normal({rows, in}, 1.0f, true);
    const Tensor dequantized = dequantize_projection(w.values, w.scales, 1, block_cols);
    const Tensor expected = linear(x, dequantized), magnitude = linear(absolute(x), absolute(dequantized));
    DeviceBuffer dx = DeviceBuffer::upload(x, DType::BF16), dv = DeviceBuffer::upload(w.values, DType::F8E4M3),
                 ds = DeviceBuffer::upload(w.scales, DType::F32);
    const kernels::Fp8Matrix m = matrix_of(dv, ds, out, in, block_cols);
    if (in <= kernels::kFp8LinearDenseMaxIn) {
      for (bool fp32 : {true, false}) {
        DeviceBuffer dy(fp32 ? DType::F32 : DType::BF16, {rows, out});
        dy.poison();
        kernels::launch_fp8_linear(dx.as<bf16>(), m, dy.data(), rows, fp32, nullptr);
        testing::check_launch("fp8_linear");
        EXPECT_TRUE(within_rounding(dy.download_float(), expected, magnitude, !fp32)) << (fp32 ? "fp32" : "bf16") << " out";
      }
    } else {
      EXPECT_THROW(kernels::launch_fp8_linear(dx.as<bf16>(), m, dx.data(), rows, true, nullptr), Error);
    }
    const std::size_t room = std::size_t(kernels::kMaxLinearSplits) * kernels::kFp8LinearMaxRows * out + 64;
    DeviceBuffer partials(DType::F32, {std::int64_t(room)});
    partials.poison();
    const kernels::LinearOutput split = kernels::launch_fp8_linear_partials(dx.as<bf16>(), m, partials.as<float>(), room, rows, nullptr);
    testing::check_launch("fp8_linear_partials");
    EXPECT_GE(split.splits, 1);
    EXPECT_TRUE(within_rounding(sum_of_splits(split, rows, out), expected, magnitude, false)) << split.splits << " splits";
  }
}

// The split count is the shape's alone: a row's sums are the same bits in a batch of one and of 32.
TEST(Fp8Linear, ARowsResultDoesNotDependOnItsBatch) {
  testing::require_gpu();
  Random rng(9);
  const int in = 6144, out = 200;
  Fp8Weights w = random_fp8(rng, out, in, 128);
  Tensor x = rng.normal({32, in}, 1.0f, true);
  DeviceBuffer dx = DeviceBuffer::upload(x, DType::BF16), dv = DeviceBuffer::upload(w.values, DType::F8E4M3),
               ds = DeviceBuffer::upload(w.scales, DType::F32);
  const kernels::Fp8Matrix m = matrix_of(dv, ds, out, in, 128);
  const std::size_t room = std::size_t(kernels::kMaxLinearSplits) * kernels::kFp8LinearMaxRows * out;
  DeviceBuffer p1(DType::F32, {std::int64_t(room)}), p32(DType::F32, {std::int64_t(room)});
  const kernels::LinearOutput one = kernels::launch_fp8_linear_partials(dx.as<bf16>(), m, p1.as<float>(), room, 1, nullptr);
  const kernels::LinearOutput all = kernels::launch_fp8_linear_partials(dx.as<bf16>(), m, p32.as<float>(), room, 32, nullptr);
  testing::check_launch("fp8_linear_partials");
  ASSERT_EQ(one.splits, all.splits);
  const Tensor a = sum_of_splits(one, 1, out), b = sum_of_splits(all, 32, out);
  for (int c = 0; c < out; ++c) EXPECT_EQ(a.data_as<float>()[c], b.data_as<float>()[c]) << "column " << c;
}

TEST(Fp8Linear, DequantizeMatchesTheLoader) {
  testing::require_gpu();
  Random rng(11);
  const int out = 37, in = 400, block_cols = 80;
  Fp8Weights w = random_fp8(rng, out, in, block_cols);
  DeviceBuffer dv = DeviceBuffer::upload(w.values, DType::F8E4M3), ds = DeviceBuffer::upload(w.scales, DType::F32);
  DeviceBuffer dq(DType::BF16, {out, in});
  dq.poison();
  kernels::launch_fp8_dequantize(matrix_of(dv, ds, out, in, block_cols), dq.as<bf16>(), nullptr);
  testing::check_launch("fp8_dequantize");
  // bf16 rounding of value times scale: 2^-9 relative at most.
  EXPECT_TRUE(close_to(dq.download_float(), dequantize_projection(w.values, w.scales, 1, block_cols), 4e-3));
}

TEST(Fp8Linear, SmallRejectsWhatItCannotTake) {
  testing::require_gpu();
  DeviceBuffer x(DType::BF16, {1, 64}), v(DType::F8E4M3, {8, 64}), s(DType::F32, {8, 1}), y(DType::F32, {1, 8});
  kernels::Fp8Matrix m;
  m.values = v.as<std::uint8_t>();
  m.scales = s.as<float>();
  m.out = 8;
  EXPECT_THROW(kernels::launch_fp8_linear(x.as<bf16>(), m, y.data(), kernels::kFp8LinearMaxRows + 1, true, nullptr), Error);
  m.in = 40;  // not a multiple of 16
  m.block_cols = 128;
  EXPECT_THROW(kernels::launch_fp8_linear(x.as<bf16>(), m, y.data(), 1, true, nullptr), Error);
  m.in = 64;
  m.block_cols = 24;  // a lane's 16 weights would straddle two blocks
  EXPECT_THROW(kernels::launch_fp8_linear(x.as<bf16>(), m, y.data(), 1, true, nullptr), Error);
  m.block_cols = 64;
  EXPECT_THROW(kernels::launch_fp8_linear(x.as<bf16>(), m, y.data(), 0, true, nullptr), Error);
  EXPECT_NO_THROW(kernels::launch_fp8_linear(x.as<bf16>(), m, y.data(), 1, true, nullptr));
  testing::check_launch("fp8_linear");
}

}  // namespace
}  // namespace asynct
