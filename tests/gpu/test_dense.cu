// The dense pieces of the CUDA model runner against the CPU reference: linear (the skinny
// kernel and cuBLASLt; bf16 in, bf16 or fp32 out), row gathers (embedding lookup) and SwiGLU. Inputs are
// bf16-exact; tolerance 1e-2 relative Frobenius error (bf16 output rounding is ~4e-3).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "gpu/device_buffer.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/skinny_gemm.h"
#include "kernels/common/tuning.h"
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

// Runs body once per form of the skinny kernel: each column tile width (its plan picks one per
// shape), with the mma.sync consumer and, on a Hopper device, the wgmma one.
template <class Body>
void for_each_skinny_form(Body body) {
  const kernels::KernelTuning saved = kernels::kernel_tuning();
  for (bool wgmma : {false, true}) {
    if (wgmma && !kernels::skinny_gemm_fast_here()) continue;
    for (int tile_n : {64, 128}) {
      SCOPED_TRACE(std::string("skinny tile width ") + std::to_string(tile_n) + (wgmma ? ", wgmma" : ", mma.sync"));
      kernels::KernelTuning forced = saved;
      forced.skinny.tile_n = tile_n;
      forced.skinny.wgmma = wgmma ? kernels::KernelTuning::Skinny::kOn : kernels::KernelTuning::Skinny::kOff;
      kernels::set_kernel_tuning(forced);
      body();
    }
  }
  kernels::set_kernel_tuning(saved);
}

// Every path on every shape: the skinny kernel (in each of its forms) takes up to 64 rows
// with `in` a multiple of 8 (the others fall back to cuBLASLt), the tuned path times cuBLASLt's
// candidates on its first call. Each shape runs twice (fp32 then bf16 out) on one Gemm, which
// also checks that the skinny kernel's split counters reset and that a tuned plan is reused.
void check_linear_on(kernels::GemmPath path, std::initializer_list<std::tuple<int, int, int>> shapes) {
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

void check_linear(std::initializer_list<std::tuple<int, int, int>> shapes) {
  testing::require_gpu();
  using kernels::GemmPath;
  for_each_skinny_form([&] { check_linear_on(GemmPath::Skinny, shapes); });
  for (GemmPath path : {GemmPath::CublasLt, GemmPath::CublasLtTuned}) check_linear_on(path, shapes);
}

TEST(Gemm, PathNamesParseAndUnknownOnesAreRejected) {
  EXPECT_EQ(kernels::gemm_path_from_name("skinny"), kernels::GemmPath::Skinny);
  EXPECT_EQ(kernels::gemm_path_from_name("tuned"), kernels::GemmPath::CublasLtTuned);
  EXPECT_EQ(kernels::gemm_path_from_name("cublaslt"), kernels::GemmPath::CublasLt);
  EXPECT_THROW(kernels::gemm_path_from_name("fast"), Error);
}

// The overrides parse from their ASYNCT_* names; unset or empty names keep the base's values, and
// a value outside a field's forms is an error naming the variable.
TEST(KernelTuning, ParsesNamesAndRejectsBadValues) {
  const auto from = [](std::map<std::string, std::string> values, const kernels::KernelTuning& base = {}) {
    return kernels::parse_kernel_tuning(
        [&](const char* name) -> const char* {
          const auto it = values.find(name);
          return it == values.end() ? nullptr : it->second.c_str();
        },
        base);
  };
  const kernels::KernelTuning none = from({});
  EXPECT_EQ(none.gemm, kernels::GemmPath::Default);
  EXPECT_EQ(none.prefill, kernels::PrefillKernel::kAuto);
  EXPECT_EQ(none.prefill_kv_splits, 0);
  EXPECT_EQ(none.prefill_seq_group, 0);
  EXPECT_EQ(none.prefill_ctas, 0);
  EXPECT_EQ(none.skinny.tile_n, 0);
  EXPECT_EQ(none.skinny.wgmma, kernels::KernelTuning::Skinny::kAuto);
  EXPECT_TRUE(none.dependent_launch);
  const kernels::KernelTuning all = from({{"ASYNCT_GEMM", "tuned"}, {"ASYNCT_PREFILL", "portable"}, {"ASYNCT_PREFILL_SPLITS", "3"},
                                          {"ASYNCT_PREFILL_GROUP", "2"}, {"ASYNCT_PREFILL_CTAS", "3"},
                                          {"ASYNCT_SKINNY_TILE", "64"}, {"ASYNCT_SKINNY_SPLITS", "4"},
                                          {"ASYNCT_SKINNY_WGMMA", "0"}, {"ASYNCT_PDL", "0"}});
  EXPECT_EQ(all.gemm, kernels::GemmPath::CublasLtTuned);
  EXPECT_EQ(all.prefill, kernels::PrefillKernel::kPortable);
  EXPECT_EQ(all.prefill_kv_splits, 3);
  EXPECT_EQ(all.prefill_seq_group, 2);
  EXPECT_EQ(all.prefill_ctas, 3);
  EXPECT_EQ(all.skinny.tile_n, 64);
  EXPECT_EQ(all.skinny.splits, 4);
  EXPECT_EQ(all.skinny.wgmma, kernels::KernelTuning::Skinny::kOff);
  EXPECT_FALSE(all.dependent_launch);
  const kernels::KernelTuning kept = from({{"ASYNCT_PDL", ""}, {"ASYNCT_PREFILL", "hopper"}}, all);
  EXPECT_EQ(kept.gemm, kernels::GemmPath::CublasLtTuned);
  EXPECT_EQ(kept.prefill, kernels::PrefillKernel::kHopper);
  EXPECT_FALSE(kept.dependent_launch);
  EXPECT_EQ(kernels::kernel_tuning_names().size(), 9u);
  EXPECT_THROW(from({{"ASYNCT_GEMM", "fast"}}), Error);
  EXPECT_THROW(from({{"ASYNCT_PREFILL", "auto"}}), Error);
  EXPECT_THROW(from({{"ASYNCT_PREFILL_SPLITS", "17"}}), Error);
  EXPECT_THROW(from({{"ASYNCT_PREFILL_GROUP", "-1"}}), Error);
  EXPECT_THROW(from({{"ASYNCT_PREFILL_CTAS", "-1"}}), Error);
  EXPECT_THROW(from({{"ASYNCT_SKINNY_TILE", "wide"}}), Error);
  EXPECT_THROW(from({{"ASYNCT_SKINNY_SPLITS", "-1"}}), Error);
  EXPECT_THROW(from({{"ASYNCT_SKINNY_WGMMA", "2"}}), Error);
  EXPECT_THROW(from({{"ASYNCT_PDL", "yes"}}), Error);
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

// linear_for_reader: at decode sizes on a Hopper device the product comes back as split
// partial sums, whose sum (host, split order) is the product; elsewhere (100 rows, or no room
// for a split) dense bf16. The split count must not depend on the row count (a row's result
// would then depend on its batch).
// first_splits: the split count of the first call of a shape (-1 before it), which later row
// counts must repeat.
void check_linear_for_reader(int rows, int in, int out, Random& rng, kernels::Gemm& gemm, int& first_splits) {
  SCOPED_TRACE(::testing::Message() << rows << " x " << in << " -> " << out);
  Tensor x = rng.normal({rows, in}, 1.0f, true), w = rng.normal({out, in}, 0.05f, true);
  Tensor expected = linear(x, w);
  DeviceBuffer dx = DeviceBuffer::upload(x, DType::BF16), dw = DeviceBuffer::upload(w, DType::BF16);
  DeviceBuffer dy(DType::BF16, {rows, out});
  const std::int64_t room = std::int64_t(kernels::kMaxLinearSplits) * kernels::kSkinnyMaxRows * out;
  DeviceBuffer partials(DType::F32, {room});
  dy.poison();
  partials.poison();
  const kernels::LinearOutput y = gemm.linear_for_reader(dx.as<bf16>(), dw.as<bf16>(), dy.as<bf16>(),
                                                         partials.as<float>(), std::size_t(room), rows, in, out, nullptr);
  testing::check_launch("linear_for_reader");
  if (!y.is_split()) {
    EXPECT_EQ(y.dense, dy.as<bf16>());
    EXPECT_TRUE(close_to(dy.download_float(), expected, kTolerance));
    return;
  }
  EXPECT_GE(y.splits, 1);
  EXPECT_LE(y.splits, kernels::kMaxLinearSplits);
  EXPECT_EQ(y.split_stride, std::int64_t(rows) * out);
  if (first_splits < 0) first_splits = y.splits;
  EXPECT_EQ(y.splits, first_splits) << "the split count changed with the row count";
  Tensor all = partials.download_float();
  Tensor sum = Tensor::empty(DType::F32, {rows, out});
  for (std::int64_t i = 0; i < std::int64_t(rows) * out; ++i) {
    float total = 0.0f;
    for (int s = 0; s < y.splits; ++s) total += all.data_as<float>()[s * y.split_stride + i];
    sum.data_as<float>()[i] = total;
  }
  EXPECT_TRUE(close_to(sum, expected, 1e-3));
}

TEST(Gemm, SmallLinearForReaderLeavesSplitsThatAddUp) {
  testing::require_gpu();
  Random rng(2);
  kernels::Gemm gemm;
  for_each_skinny_form([&] {
    int first = -1, other = -1;
    for (int rows : {1, 5, 17}) check_linear_for_reader(rows, 1032, 130, rng, gemm, first);
    check_linear_for_reader(3, 64, 8, rng, gemm, other);
  });
}

TEST(Gemm, LinearForReaderOnDecodeShapes) {
  testing::require_gpu();
  Random rng(3);
  kernels::Gemm gemm;
  for_each_skinny_form([&] {
    int o_splits = -1, down_splits = -1, other = -1;
    for (int rows : {1, 32, 64}) {
      check_linear_for_reader(rows, 2048, 2048, rng, gemm, o_splits);
      check_linear_for_reader(rows, 6144, 2048, rng, gemm, down_splits);
    }
    check_linear_for_reader(100, 512, 256, rng, gemm, other);  // past the skinny range: dense
  });
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

// [n, 2 inter] with the gate columns, then the up columns (the reference's order) -> the device's
// gate/up block order (linear_output.h). Applied to W^T's columns it orders W's rows.
Tensor to_glu_order(const Tensor& gate_then_up) {
  const std::int64_t n = gate_then_up.size(0), inter = gate_then_up.size(1) / 2;
  Tensor out = Tensor::empty(DType::F32, {n, 2 * inter});
  const float* from = gate_then_up.data_as<float>();
  float* to = out.data_as<float>();
  for (std::int64_t r = 0; r < n; ++r)
    for (int j = 0; j < int(inter); ++j) {
      const kernels::GluColumns at = kernels::glu_columns(j, int(inter));
      to[r * 2 * inter + at.gate] = from[r * 2 * inter + j];
      to[r * 2 * inter + at.up] = from[r * 2 * inter + inter + j];
    }
  return out;
}

TEST(Elementwise, SiluAndMulMatchesSwiglu) {
  testing::require_gpu();
  Random rng(3);
  for (auto [tokens, inter] : {std::pair{1, 8}, {7, 1000}, {33, 6144}}) {
    Tensor gate_up = rng.normal({tokens, 2 * inter}, 2.0f, true);
    DeviceBuffer dg = DeviceBuffer::upload(to_glu_order(gate_up), DType::BF16);
    DeviceBuffer out(DType::BF16, {tokens, inter});
    out.poison();
    kernels::launch_silu_and_mul(dg.as<bf16>(), out.as<bf16>(), tokens, inter, nullptr);
    testing::check_launch("silu_and_mul");
    EXPECT_TRUE(close_to(out.download_float(), swiglu(gate_up), kTolerance)) << tokens << " x " << inter;
  }
}

// gated_linear against linear + SwiGLU: the skinny kernel with the SiLU in its epilogue (up to
// kSkinnyFormsMaxRows rows on sm_90), otherwise cuBLASLt + silu_and_mul; whole and partial
// gate/up blocks (inter 1000 = 31 blocks of 32 and one of 8; a 128-column tile holds two), several
// row tiles, every form of the skinny kernel.
void check_gated_linear(int rows, int in, int inter, Random& rng, kernels::Gemm& gemm) {
  SCOPED_TRACE(::testing::Message() << rows << " x " << in << " -> 2 x " << inter);
  Tensor x = rng.normal({rows, in}, 1.0f, true);
  Tensor w = rng.normal({2 * inter, in}, 0.05f, true);  // gate rows, then up rows
  Tensor expected = swiglu(linear(x, w));
  // W's rows in block order: the transpose of to_glu_order on W^T, i.e. row p of the device
  // weight is the row of w whose output column lands at p.
  Tensor w_blocked = Tensor::empty(DType::F32, {2 * inter, in});
  for (int j = 0; j < inter; ++j) {
    const kernels::GluColumns at = kernels::glu_columns(j, inter);
    std::copy_n(w.data_as<float>() + std::int64_t(j) * in, in, w_blocked.data_as<float>() + std::int64_t(at.gate) * in);
    std::copy_n(w.data_as<float>() + std::int64_t(inter + j) * in, in, w_blocked.data_as<float>() + std::int64_t(at.up) * in);
  }
  DeviceBuffer dx = DeviceBuffer::upload(x, DType::BF16), dw = DeviceBuffer::upload(w_blocked, DType::BF16);
  DeviceBuffer gate_up(DType::BF16, {rows, 2 * inter}), act(DType::BF16, {rows, inter});
  act.poison();
  gemm.gated_linear(dx.as<bf16>(), dw.as<bf16>(), gate_up.as<bf16>(), act.as<bf16>(), rows, in, inter, nullptr);
  testing::check_launch("gated_linear");
  EXPECT_TRUE(close_to(act.download_float(), expected, kTolerance));
}

TEST(Gemm, SmallGatedLinearMatchesSwiglu) {
  testing::require_gpu();
  Random rng(4);
  kernels::Gemm gemm;
  for_each_skinny_form([&] {
    for (auto [rows, in, inter] : {std::tuple{1, 64, 8}, {3, 136, 72}, {17, 1032, 200}}) check_gated_linear(rows, in, inter, rng, gemm);
  });
}

TEST(Gemm, GatedLinearMatchesSwiglu) {
  testing::require_gpu();
  Random rng(5);
  kernels::Gemm gemm;
  for_each_skinny_form([&] {
    for (int rows : {1, 4, 32, 33, 100})
      for (auto [in, inter] : {std::pair{2048, 6144}, {512, 1000}}) check_gated_linear(rows, in, inter, rng, gemm);
  });
}

}  // namespace
}  // namespace asynct
