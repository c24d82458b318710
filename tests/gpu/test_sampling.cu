// The device greedy-sampling kernel against summarize_logits on the host: the argmax with the
// lowest id on ties (including -0.0 against +0.0), the lowest non-finite id and its value, at
// Qwen3's vocabulary (151936, the 16-byte path) and at sizes that are not multiples of 4; large
// rows are split over several blocks, whose parts the last of them combines.
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "gpu/device_buffer.h"
#include "kernels/common/cuda_array.h"
#include "engine/sampler.h"
#include "kernels/sampling/sampling.h"
#include "support/random.h"

namespace asynct {
namespace {

using testing::DeviceBuffer;

// Runs the kernel on host rows [rows, vocab]; the output is poisoned before.
std::vector<LogitSummary> summarize_on_device(const Tensor& logits) {
  const int rows = int(logits.size(0)), vocab = int(logits.size(1));
  DeviceBuffer d = DeviceBuffer::upload(logits, DType::F32);
  kernels::DeviceArray<LogitSummary> out{std::size_t(rows)};
  ASYNCT_CUDA_CHECK(cudaMemset(out.get(), 0xFF, std::size_t(rows) * sizeof(LogitSummary)));
  kernels::launch_summarize_logits(d.as<float>(), rows, vocab, out.get(), nullptr);
  testing::check_launch("summarize_logits");
  std::vector<LogitSummary> host(static_cast<std::size_t>(rows));
  ASYNCT_CUDA_CHECK(cudaMemcpy(host.data(), out.get(), host.size() * sizeof(LogitSummary), cudaMemcpyDeviceToHost));
  return host;
}

void expect_matches_host(const Tensor& logits, const char* what) {
  const std::vector<LogitSummary> got = summarize_on_device(logits);
  const std::size_t vocab = std::size_t(logits.size(1));
  for (std::size_t r = 0; r < got.size(); ++r) {
    const LogitSummary want = summarize_logits(logits.data_as<float>() + r * vocab, vocab);
    EXPECT_EQ(got[r].nonfinite, want.nonfinite) << what << ", row " << r;
    if (want.nonfinite >= 0) {
      const float g = got[r].nonfinite_value, w = want.nonfinite_value;
      EXPECT_TRUE((std::isnan(g) && std::isnan(w)) || g == w) << what << ", row " << r << ": " << g << " vs " << w;
    } else {
      EXPECT_EQ(got[r].token, want.token) << what << ", row " << r;
    }
  }
}

TEST(DeviceSampling, DeviceGreedyMatchesHostOnRandomRows) {
  testing::require_gpu();
  testing::Random rng(5);
  for (auto [rows, vocab] : {std::pair{32, 151936}, {3, 1000}, {5, 7}, {1, 1}, {4, 4099}, {2, 256}, {3, 100003}, {1, 151936}}) {
    Tensor logits = rng.normal({rows, vocab}, 3.0f);
    expect_matches_host(logits, ("random " + std::to_string(rows) + " x " + std::to_string(vocab)).c_str());
  }
}

TEST(DeviceSampling, DeviceGreedyTakesTheLowestIdOnTiesAndFindsNonFiniteLogits) {
  testing::require_gpu();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (int vocab : {151936, 4099, 65537}) {  // 8 and 4 parts per row (rows split across blocks), and 1
    testing::Random rng(6);
    Tensor logits = rng.uniform({8, vocab}, -4.0f, 4.0f);
    auto row = [&](int r) { return logits.data_as<float>() + std::int64_t(r) * vocab; };
    // 0: the maximum twice, far apart (different threads see them).
    row(0)[vocab - 3] = 9.0f;
    row(0)[1029] = 9.0f;
    // 1: every logit equal: token 0.
    std::fill(row(1), row(1) + vocab, 0.5f);
    // 2: -0.0 before +0.0 as the maximum: equal, so the lower id.
    std::fill(row(2), row(2) + vocab, -1.0f);
    row(2)[77] = -0.0f;
    row(2)[3] = 0.0f;
    row(2)[vocab - 1] = -0.0f;
    // 3: the maximum at the last id.
    row(3)[vocab - 1] = 100.0f;
    // 4, 5, 6: NaN and infinities; the lowest non-finite id is reported with its value.
    row(4)[vocab - 2] = NAN;
    row(4)[vocab / 2] = kInf;
    row(5)[2] = -kInf;
    row(5)[vocab - 1] = NAN;
    std::fill(row(6), row(6) + vocab, -kInf);
    // 7: a huge finite maximum next to an infinity earlier in the row.
    row(7)[10] = std::numeric_limits<float>::max();
    row(7)[vocab - 5] = kInf;
    expect_matches_host(logits, ("crafted, vocab " + std::to_string(vocab)).c_str());

    const std::vector<LogitSummary> got = summarize_on_device(logits);
    EXPECT_EQ(got[0].token, 1029);
    EXPECT_EQ(got[1].token, 0);
    EXPECT_EQ(got[2].token, 3);
    EXPECT_EQ(got[3].token, vocab - 1);
    EXPECT_EQ(got[4].nonfinite, vocab / 2);
    EXPECT_EQ(got[4].nonfinite_value, kInf);
    EXPECT_EQ(got[5].nonfinite, 2);
    EXPECT_EQ(got[6].nonfinite, 0);
    EXPECT_EQ(got[7].nonfinite, vocab - 5);
  }
}

TEST(DeviceSampling, DeviceGreedyRejectsBadArguments) {
  testing::require_gpu();
  kernels::DeviceArray<float> logits(8);
  kernels::DeviceArray<LogitSummary> out(2);
  EXPECT_THROW(kernels::launch_summarize_logits(logits.get(), 2, 0, out.get(), nullptr), Error);
  EXPECT_THROW(kernels::launch_summarize_logits(nullptr, 2, 4, out.get(), nullptr), Error);
  kernels::launch_summarize_logits(logits.get(), 0, 4, out.get(), nullptr);  // no rows: nothing to do
}

}  // namespace
}  // namespace asynct
