// The FP8-weight product (kernels/gemm/fp8_linear.h) against the CPU reference: the weights
// dequantized by the loader's own function (dequantize_projection: e4m3 value times its
// block's scale), then the reference product. x is bf16-exact; tolerance 1e-3 relative Frobenius
// error with fp32 out (only the order of the sums differs), 1e-2 with bf16 out.
#include <gtest/gtest.h>

#include <cmath>
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

TEST(Fp8Linear, MatchesTheDequantizedReferenceOnAwkwardShapes) {
  testing::require_gpu();
  Random rng(7);
  // rows, in, out, block_cols: one row (decode), passes of four with a ragged last one, inputs
  // not a multiple of the block or of a warp's 512, the widest input, columns not a multiple
  // of a CTA's eight warps.
  for (auto [rows, in, out, block_cols] : std::initializer_list<std::tuple<int, int, int, int>>{
           {1, 2048, 2048, 128}, {1, 16, 1, 16}, {3, 48, 77, 48}, {5, 1040, 300, 128}, {4, 6144, 64, 128},
           {70, 528, 130, 64}, {2, kernels::kFp8LinearMaxIn, 33, 128}, {9, 2064, 1001, 128}}) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(in) + " -> " + std::to_string(out) + ", blocks of " +
                 std::to_string(block_cols));
    Fp8Weights w = random_fp8(rng, out, in, block_cols);
    Tensor x = rng.normal({rows, in}, 1.0f, true);
    const Tensor expected = linear(x, dequantize_projection(w.values, w.scales, 1, block_cols));
    DeviceBuffer dx = DeviceBuffer::upload(x, DType::BF16), dv = DeviceBuffer::upload(w.values, DType::F8E4M3),
                 ds = DeviceBuffer::upload(w.scales, DType::F32);
    kernels::Fp8Matrix m;
    m.values = dv.as<std::uint8_t>();
    m.scales = ds.as<float>();
    m.out = out;
    m.in = in;
    m.block_cols = block_cols;
    for (bool fp32 : {true, false}) {
      DeviceBuffer dy(fp32 ? DType::F32 : DType::BF16, {rows, out});
      dy.poison();
      kernels::launch_fp8_linear(dx.as<bf16>(), m, dy.data(), rows, fp32, nullptr);
      testing::check_launch("fp8_linear");
      EXPECT_TRUE(close_to(dy.download_float(), expected, fp32 ? 1e-3 : 1e-2)) << (fp32 ? "fp32" : "bf16") << " out";
    }
  }
}

TEST(Fp8Linear, SmallRejectsWhatItCannotTake) {
  testing::require_gpu();
  DeviceBuffer x(DType::BF16, {1, 64}), v(DType::F8E4M3, {8, 64}), s(DType::F32, {8, 1}), y(DType::F32, {1, 8});
  kernels::Fp8Matrix m;
  m.values = v.as<std::uint8_t>();
  m.scales = s.as<float>();
  m.out = 8;
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
