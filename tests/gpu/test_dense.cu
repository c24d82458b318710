// The dense pieces of the CUDA model runner against the CPU reference: linear (the skinny
// kernel and cuBLASLt; bf16 in, bf16 or fp32 out), row gathers (embedding lookup) and SwiGLU. Inputs are
// bf16-exact; tolerance 1e-2 relative Frobenius error (bf16 output rounding is ~4e-3).
#include <gtest/gtest.h>

#include <string>

#include "gpu/device_buffer.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "reference/layers.h"
#include "support/compare.h"
#include "support/random.h"

namespace asynct {
namespace {

using kernels::bf16;
using testing::close_to;
using testing::DeviceBuffer;
using testing::Random;

constexpr double kTolerance = 1e-2;

// Every path on every shape: the skinny kernel takes up to 64 rows with `in` a multiple of 8
// (the others fall back to cuBLASLt), the tuned path times cuBLASLt's candidates on its first
// call. Each shape runs twice (fp32 then bf16 out) on one Gemm, which also checks that the
// skinny kernel's split counters reset and that a tuned plan is reused.
void check_linear(std::initializer_list<std::tuple<int, int, int>> shapes) {
  testing::require_gpu();
  using kernels::GemmPath;
  for (GemmPath path : {GemmPath::Skinny, GemmPath::CublasLt, GemmPath::CublasLtTuned}) {
    SCOPED_TRACE("GEMM path " + std::to_string(int(path)));
    Random rng(1);
    kernels::Gemm gemm;
    for (auto [rows, in, out] : shapes) {
      Tensor x = rng.normal({rows, in}, 1.0f, true), w = rng.normal({out, in}, 0.05f, true);
      Tensor expected = linear(x, w);
      DeviceBuffer dx = DeviceBuffer::upload(x, DType::BF16), dw = DeviceBuffer::upload(w, DType::BF16);
      for (bool fp32 : {true, false}) {
        DeviceBuffer dy(fp32 ? DType::F32 : DType::BF16, {rows, out});
        dy.poison();
        gemm.linear(dx.as<bf16>(), dw.as<bf16>(), dy.data(), rows, in, out, fp32, nullptr, path);
        testing::check_launch("gemm");
        EXPECT_TRUE(close_to(dy.download_float(), expected, fp32 ? 1e-3 : kTolerance))
            << rows << " x " << in << " -> " << out << (fp32 ? " fp32" : " bf16");
      }
    }
  }
}

TEST(Gemm, PathNamesParseAndUnknownOnesAreRejected) {
  EXPECT_EQ(kernels::gemm_path_from_name("skinny"), kernels::GemmPath::Skinny);
  EXPECT_EQ(kernels::gemm_path_from_name("tuned"), kernels::GemmPath::CublasLtTuned);
  EXPECT_EQ(kernels::gemm_path_from_name("cublaslt"), kernels::GemmPath::CublasLt);
  EXPECT_THROW(kernels::gemm_path_from_name("fast"), Error);
}

// Small enough for compute-sanitizer: one and three row tiles, partial tiles in every
// direction, one split and several (the last CTA adding the partial tiles), uneven splits with a
// partial last K tile (1032 = 16 tiles of 64 and 8).
TEST(Gemm, SmallSkinnyShapes) {
  check_linear({{1, 64, 8}, {3, 136, 200}, {48, 72, 70}, {5, 1024, 64}, {7, 1032, 130}});
}

// Decode-sized products (many splits: the down projection's shape), odd ones, and products
// that go to cuBLASLt (100 rows; in = 100 is not a multiple of 8).
TEST(Gemm, LinearMatchesReferenceOnAwkwardShapes) {
  check_linear({{32, 2048, 4096}, {37, 512, 1000}, {64, 6144, 2048}, {5, 1000, 333}, {100, 264, 300}, {7, 100, 50}});
}

TEST(Elementwise, SmallGatherRowsLooksUpAndZeroesBadIds) {
  testing::require_gpu();
  Random rng(2);
  Tensor table = rng.normal({50, 72}, 1.0f, true);
  const std::vector<std::int32_t> ids = {3, 49, 0, 3, 17};
  DeviceBuffer dt = DeviceBuffer::upload(table, DType::BF16);
  DeviceBuffer di = DeviceBuffer::upload(Tensor::from_vector(ids, {5}), DType::I32);
  DeviceBuffer out(DType::BF16, {5, 72});
  out.poison();
  kernels::launch_gather_rows(dt.as<bf16>(), di.as<std::int32_t>(), out.as<bf16>(), 5, 50, 72, nullptr);
  testing::check_launch("gather_rows");
  EXPECT_TRUE(close_to(out.download_float(), embedding(table, ids), 0.0));

  DeviceBuffer bad = DeviceBuffer::upload(Tensor::from_vector<std::int32_t>({50, -1}, {2}), DType::I32);
  DeviceBuffer zeros(DType::BF16, {2, 72});
  zeros.poison();
  kernels::launch_gather_rows(dt.as<bf16>(), bad.as<std::int32_t>(), zeros.as<bf16>(), 2, 50, 72, nullptr);
  testing::check_launch("gather_rows");
  for (float v : zeros.download_float().to_float_vector()) EXPECT_EQ(v, 0.0f);
  EXPECT_THROW(kernels::launch_gather_rows(dt.as<bf16>(), di.as<std::int32_t>(), out.as<bf16>(), 5, 50, 70, nullptr), Error);
}

TEST(Elementwise, SiluAndMulMatchesSwiglu) {
  testing::require_gpu();
  Random rng(3);
  for (auto [tokens, inter] : {std::pair{1, 8}, {7, 1000}, {33, 6144}}) {
    Tensor gate_up = rng.normal({tokens, 2 * inter}, 2.0f, true);
    DeviceBuffer dg = DeviceBuffer::upload(gate_up, DType::BF16);
    DeviceBuffer out(DType::BF16, {tokens, inter});
    out.poison();
    kernels::launch_silu_and_mul(dg.as<bf16>(), out.as<bf16>(), tokens, inter, nullptr);
    testing::check_launch("silu_and_mul");
    EXPECT_TRUE(close_to(out.download_float(), swiglu(gate_up), kTolerance)) << tokens << " x " << inter;
  }
}

}  // namespace
}  // namespace asynct
