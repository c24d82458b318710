// The FP8-weight product (kernels/gemm/fp8_linear.h) against the CPU reference: the weights
// dequantized by the loader's own function (dequantize_projection: e4m3 value times its
// block's scale), then the reference product. x is bf16-exact and the e4m3 values are exact in
// bf16; the scales are applied to fp32 sums. What remains is the fp32 sums' rounding and order
// (the tensor cores' and the reference's), so every output is within 2^-10 sum_k |w x| of the
// reference with fp32 out, and 2^-8 more of its value with bf16 out; a bound, not an average, so
// a single cancelling sum cannot fail it falsely.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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

constexpr double kSumRounding = 1.0 / 1024;
constexpr double kBf16Rounding = 1.0 / 256;

// The bound above for each output: the sums' rounding, and bf16's when the output is bf16.
Tensor rounding_bound(const Tensor& expected, const Tensor& magnitude, bool bf16_out) {
  Tensor bound = Tensor::empty(DType::F32, expected.shape());
  const float *e = expected.data_as<float>(), *m = magnitude.data_as<float>();
  for (std::int64_t i = 0; i < bound.numel(); ++i)
    bound.data_as<float>()[i] = float(kSumRounding * m[i] + (bf16_out ? kBf16Rounding * std::abs(e[i]) : 0.0) + 1e-6);
  return bound;
}

// Every output finite and within its bound of the reference.
::testing::AssertionResult within(const Tensor& got, const Tensor& expected, const Tensor& bound) {
  const float *g = got.data_as<float>(), *e = expected.data_as<float>(), *b = bound.data_as<float>();
  for (std::int64_t i = 0; i < got.numel(); ++i)
    if (!std::isfinite(g[i]) || std::abs(double(g[i]) - e[i]) > b[i])
      return ::testing::AssertionFailure() << "output " << i << ": " << g[i] << " against " << e[i] << " (bound " << b[i] << ")";
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

// The matrix on the device in its device order (fp8_linear.h), as the CUDA runner uploads it.
struct DeviceFp8 {
  DeviceBuffer values, scales;
  kernels::Fp8Matrix matrix;
};
DeviceFp8 upload_fp8(const Fp8Weights& w, int block_cols) {
  const int out = int(w.values.size(0)), in = int(w.values.size(1)), scale_cols = int(w.scales.size(1));
  std::vector<std::uint8_t> values(std::size_t(out) * in);
  std::memcpy(values.data(), w.values.data(), values.size());
  kernels::fp8_values_to_device_order(values.data(), out, in);
  const std::vector<float> scales = kernels::fp8_scales_to_device_order(w.scales.data_as<float>(), out, scale_cols);
  DeviceFp8 d{DeviceBuffer(DType::F8E4M3, {out, in}), DeviceBuffer(DType::F32, {scale_cols, out}), {}};
  ASYNCT_CUDA_CHECK(cudaMemcpy(d.values.data(), values.data(), values.size(), cudaMemcpyHostToDevice));
  ASYNCT_CUDA_CHECK(cudaMemcpy(d.scales.data(), scales.data(), scales.size() * sizeof(float), cudaMemcpyHostToDevice));
  d.matrix.values = d.values.as<std::uint8_t>();
  d.matrix.scales = d.scales.as<float>();
  d.matrix.out = out;
  d.matrix.in = in;
  d.matrix.block_cols = block_cols;
  return d;
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

// SiLU(gate) * up of a product's [rows][2 inter] output in the kGluBlock order, and a bound of
// its error from the product's bound (SiLU's slope is at most 1.1) and the bf16 rounding.
struct Glu {
  Tensor act, bound;
};
Glu glu_of(const Tensor& y, const Tensor& y_bound) {
  const int rows = int(y.size(0)), inter = int(y.size(1)) / 2;
  Glu g{Tensor::empty(DType::F32, {rows, inter}), Tensor::empty(DType::F32, {rows, inter})};
  const float *v = y.data_as<float>(), *b = y_bound.data_as<float>();
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < inter; ++j) {
      const kernels::GluColumns at = kernels::glu_columns(j, inter);
      const double gate = v[r * 2 * inter + at.gate], up = v[r * 2 * inter + at.up];
      const double silu = gate / (1.0 + std::exp(-gate));
      g.act.data_as<float>()[r * inter + j] = float(silu * up);
      g.bound.data_as<float>()[r * inter + j] =
          float(1.1 * std::abs(up) * b[r * 2 * inter + at.gate] + std::abs(silu) * b[r * 2 * inter + at.up] +
                kBf16Rounding * std::abs(silu * up) + 1e-5);
    }
  return g;
}

// rows, in, out, block_cols: one row (decode), every count of x tiles with ragged rows (1..64),
// inputs not a multiple of a stage (128) or of a block, a block of two stages, outputs not a
// multiple of a column tile, a down projection's 6144 inputs, more column tiles than the GPU
// holds CTAs, one stage, the widest x.
constexpr std::tuple<int, int, int, int> kShapes[] = {
    {1, 2048, 2048, 128}, {1, 16, 4, 128},     {3, 48, 76, 128},      {9, 1040, 300, 128},  {4, 6144, 64, 128},
    {33, 528, 132, 256},  {17, 2064, 1000, 128}, {2, 3136, 36, 128},  {32, 6144, 40, 128},  {2, 64, 9000, 128},
    {64, 528, 4100, 256}, {49, 128, 192, 128},   {64, 2048, 6144, 128}};

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
    DeviceBuffer dx = DeviceBuffer::upload(x, DType::BF16);
    const DeviceFp8 d = upload_fp8(w, block_cols);
    for (bool fp32 : {true, false}) {
      DeviceBuffer dy(fp32 ? DType::F32 : DType::BF16, {rows, out});
      dy.poison();
      kernels::launch_fp8_linear(dx.as<bf16>(), d.matrix, dy.data(), rows, fp32, nullptr);
      testing::check_launch("fp8_linear");
      EXPECT_TRUE(within(dy.download_float(), expected, rounding_bound(expected, magnitude, !fp32))) << (fp32 ? "fp32" : "bf16") << " out";
    }
    const std::size_t room = std::size_t(kernels::kMaxLinearSplits) * kernels::kFp8LinearMaxRows * out + 64;
    DeviceBuffer partials(DType::F32, {std::int64_t(room)});
    partials.poison();
    const kernels::LinearOutput split = kernels::launch_fp8_linear_partials(dx.as<bf16>(), d.matrix, partials.as<float>(), room, rows, nullptr);
    testing::check_launch("fp8_linear_partials");
    EXPECT_GE(split.splits, 1);
    EXPECT_TRUE(within(sum_of_splits(split, rows, out), expected, rounding_bound(expected, magnitude, false))) << split.splits << " splits";
    if (out % 16 == 0) {  // as a merged gate/up projection: SiLU(gate) * up in the kernel
      const Glu want = glu_of(expected, rounding_bound(expected, magnitude, false));
      DeviceBuffer act(DType::BF16, {rows, out / 2});
      act.poison();
      kernels::launch_fp8_linear_glu(dx.as<bf16>(), d.matrix, act.as<bf16>(), rows, nullptr);
      testing::check_launch("fp8_linear_glu");
      EXPECT_TRUE(within(act.download_float(), want.act, want.bound)) << "SiLU(gate) * up";
    }
  }
}

// The split count is the shape's alone: a row's sums are the same bits in a batch of one, 32 and 64.
TEST(Fp8Linear, ARowsResultDoesNotDependOnItsBatch) {
  testing::require_gpu();
  Random rng(9);
  const int in = 6144, out = 200;
  Fp8Weights w = random_fp8(rng, out, in, 128);
  Tensor x = rng.normal({64, in}, 1.0f, true);
  DeviceBuffer dx = DeviceBuffer::upload(x, DType::BF16);
  const DeviceFp8 d = upload_fp8(w, 128);
  const std::size_t room = std::size_t(kernels::kMaxLinearSplits) * kernels::kFp8LinearMaxRows * out;
  std::vector<Tensor> first_rows;
  int splits = 0;
  for (int rows : {1, 32, 64}) {
    DeviceBuffer p(DType::F32, {std::int64_t(room)});
    const kernels::LinearOutput o = kernels::launch_fp8_linear_partials(dx.as<bf16>(), d.matrix, p.as<float>(), room, rows, nullptr);
    testing::check_launch("fp8_linear_partials");
    if (splits == 0) splits = o.splits;
    ASSERT_EQ(o.splits, splits) << rows << " rows";
    first_rows.push_back(sum_of_splits(o, rows, out));
  }
  for (std::size_t b = 1; b < first_rows.size(); ++b)
    for (int c = 0; c < out; ++c)
      EXPECT_EQ(first_rows[0].data_as<float>()[c], first_rows[b].data_as<float>()[c]) << "column " << c << ", batch " << b;
}

// Every e4m3 value (subnormals, the largest, both signs; the NaN codes aside) comes out of the
// product exactly: one-hot rows of x pick single weights, and power-of-two scales keep the
// reference's value times scale exact.
TEST(Fp8Linear, EveryE4m3ValueComesOutExactly) {
  testing::require_gpu();
  const int in = 256, out = 256, rows = kernels::kFp8LinearMaxRows;
  Fp8Weights w{Tensor::empty(DType::F8E4M3, {out, in}), Tensor::empty(DType::F32, {out, 2})};
  for (int n = 0; n < out; ++n) {
    for (int k = 0; k < in; ++k) {
      const int code = (n + k) % 256;
      w.values.data_as<fp8_e4m3_bits>()[n * in + k].bits = std::uint8_t((code & 0x7f) == 0x7f ? 0 : code);
    }
    for (int c = 0; c < 2; ++c) w.scales.data_as<float>()[n * 2 + c] = std::ldexp(1.0f, -(n % 5) + 2 * c);
  }
  const DeviceFp8 d = upload_fp8(w, 128);
  const Tensor dequantized = dequantize_projection(w.values, w.scales, 1, 128);
  for (int first = 0; first < in; first += rows) {
    Tensor x = Tensor::empty(DType::F32, {rows, in});
    std::fill_n(x.data_as<float>(), x.numel(), 0.0f);
    for (int r = 0; r < rows; ++r) x.data_as<float>()[r * in + first + r] = 1.0f;
    DeviceBuffer dx = DeviceBuffer::upload(x, DType::BF16), dy(DType::F32, {rows, out});
    dy.poison();
    kernels::launch_fp8_linear(dx.as<bf16>(), d.matrix, dy.data(), rows, true, nullptr);
    testing::check_launch("fp8_linear");
    const Tensor y = dy.download();
    for (int r = 0; r < rows; ++r)
      for (int n = 0; n < out; ++n)
        ASSERT_EQ(y.data_as<float>()[r * out + n], dequantized.data_as<float>()[n * in + first + r])
            << "weight (" << n << ", " << first + r << "), e4m3 code " << (n + first + r) % 256;
  }
}

TEST(Fp8Linear, DequantizeMatchesTheLoader) {
  testing::require_gpu();
  Random rng(11);
  const int out = 37, in = 400, block_cols = 80;
  Fp8Weights w = random_fp8(rng, out, in, block_cols);
  const DeviceFp8 d = upload_fp8(w, block_cols);
  DeviceBuffer dq(DType::BF16, {out, in});
  dq.poison();
  kernels::launch_fp8_dequantize(d.matrix, dq.as<bf16>(), nullptr);
  testing::check_launch("fp8_dequantize");
  // bf16 rounding of value times scale: 2^-9 relative at most.
  EXPECT_TRUE(close_to(dq.download_float(), dequantize_projection(w.values, w.scales, 1, block_cols), 4e-3));
}

TEST(Fp8Linear, SmallRejectsWhatItCannotTake) {
  testing::require_gpu();
  DeviceBuffer x(DType::BF16, {kernels::kFp8LinearMaxRows + 1, 256}), v(DType::F8E4M3, {8, 256}), s(DType::F32, {2, 8}),
      y(DType::F32, {kernels::kFp8LinearMaxRows + 1, 8});
  kernels::Fp8Matrix m;
  m.values = v.as<std::uint8_t>();
  m.scales = s.as<float>();
  m.out = 8;
  m.in = 256;
  m.block_cols = 128;
  auto launch = [&](int rows) { kernels::launch_fp8_linear(x.as<bf16>(), m, y.data(), rows, true, nullptr); };
  EXPECT_THROW(launch(kernels::kFp8LinearMaxRows + 1), Error);
  EXPECT_THROW(launch(0), Error);
  m.in = 40;  // not a multiple of 16
  EXPECT_THROW(launch(1), Error);
  m.in = 256;
  m.block_cols = 64;  // blocks narrower than a stage: the dequantized path's
  EXPECT_THROW(launch(1), Error);
  m.block_cols = 128;
  m.out = 6;  // the scales' rows are not whole 16-byte units
  EXPECT_THROW(launch(1), Error);
  m.out = 8;
  EXPECT_NO_THROW(launch(1));
  EXPECT_NO_THROW(launch(kernels::kFp8LinearMaxRows));
  testing::check_launch("fp8_linear");
}

}  // namespace
}  // namespace asynct
