// The GPU test plumbing itself: an output the kernel does not fully write is caught because
// the buffer was poisoned, and a correct output passes the reference comparison.
#include <gtest/gtest.h>

#include "gpu/device_buffer.h"
#include "support/compare.h"
#include "support/random.h"

namespace asynct {
namespace {

using testing::close_to;
using testing::DeviceBuffer;

// y = 2x in bf16, for the first `written` elements only.
__global__ void double_values(const __nv_bfloat16* x, __nv_bfloat16* y, int written) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < written) y[i] = __float2bfloat16(2.0f * __bfloat162float(x[i]));
}

TEST(GpuPlumbing, PoisonCatchesUnwrittenOutputAndCorrectOutputPasses) {
  testing::require_gpu();
  testing::Random rng(1);
  const int n = 1000;
  Tensor x = rng.normal({n}, 1.0f, /*bf16_exact=*/true);
  Tensor reference = Tensor::empty(DType::F32, {n});
  for (int i = 0; i < n; ++i) reference.at<float>(i) = 2.0f * x.at<float>(i);

  DeviceBuffer dx = DeviceBuffer::upload(x, DType::BF16);
  DeviceBuffer dy(DType::BF16, {n});
  for (int written : {n, n - 1}) {
    dy.poison();
    double_values<<<(n + 255) / 256, 256>>>(dx.as<__nv_bfloat16>(), dy.as<__nv_bfloat16>(), written);
    testing::check_launch("double_values");
    auto result = close_to(dy.download_float(), reference, 1e-2);
    if (written == n) EXPECT_TRUE(result);
    else EXPECT_FALSE(result) << "the unwritten last element must be caught";
  }
}

}  // namespace
}  // namespace asynct
