// The tensor type's checks and conversions.
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>

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

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Large tensors are converted in pieces on several threads: every element must come out as the
// scalar conversion gives it, NaNs, infinities, subnormals, ties and values that round up included,
// also at the pieces' edges.
TEST(Tensor, LargeConversionsMatchTheScalarOnesElementForElement) {
  const std::int64_t n = 3 * (std::int64_t(1) << 20) + 12345;  // several pieces and a partial one
  const std::vector<std::uint32_t> special = {
      0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u, 0x7fa00000u,  // NaNs, quiet and signalling
      0x7f800000u, 0xff800000u, 0x00000000u, 0x80000000u,                // infinities and zeros
      0x00000001u, 0x807fffffu, 0x00400000u, 0x00008000u, 0x00018000u,  // subnormals (and ties among them)
      0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f80ffffu, 0xbf80c000u,  // ties to even, values rounding up
      0x7f7fffffu, 0xff7f8000u, 0x7f7f7fffu,                             // near the largest float: overflow to inf
  };
  Tensor f = Tensor::empty(DType::F32, {n});
  std::uint64_t state = 0x9e3779b97f4a7c15ull;
  for (std::int64_t i = 0; i < n; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;  // every bit pattern is possible
    f.at<float>(i) = float_of(std::uint32_t(state >> 32));
  }
  const std::int64_t piece = std::int64_t(1) << 20, k = std::int64_t(special.size());
  for (std::int64_t start : {std::int64_t(0), piece - k, piece, 2 * piece - k, 2 * piece, n - k}) {  // pieces' edges
    for (std::int64_t s = 0; s < k; ++s) f.at<float>(start + s) = float_of(special[std::size_t(s)]);
  }

  const Tensor b = f.to(DType::BF16);
  const Tensor h = f.to(DType::F16);  // the general path, through double
  std::int64_t bf16_wrong = 0, f16_wrong = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = f.at<float>(i);
    if (b.at<bf16_bits>(i).bits != float_to_bf16(x) && bf16_wrong++ == 0)
      ADD_FAILURE() << "bf16 of " << std::hex << bits_of(x) << " at " << std::dec << i;
    if (h.at<f16_bits>(i).bits != float_to_f16(x) && f16_wrong++ == 0)
      ADD_FAILURE() << "f16 of " << std::hex << bits_of(x) << " at " << std::dec << i;
  }
  EXPECT_EQ(bf16_wrong, 0);
  EXPECT_EQ(f16_wrong, 0);

  // Back: every bf16 pattern, as the conversion through double gives it (a signalling NaN
  // comes out quiet).
  Tensor all = Tensor::empty(DType::BF16, {n});
  for (std::int64_t i = 0; i < n; ++i) all.at<bf16_bits>(i).bits = std::uint16_t(i * 40503);  // odd: all 2^16 in turn
  const Tensor back = all.to(DType::F32);
  std::int64_t f32_wrong = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint16_t bits = all.at<bf16_bits>(i).bits;
    volatile double through_double = bf16_to_float(bits);
    const float expected = float(through_double);
    if (bits_of(back.at<float>(i)) != bits_of(expected) && f32_wrong++ == 0)
      ADD_FAILURE() << "float of bf16 " << std::hex << bits << ": " << bits_of(back.at<float>(i)) << ", expected "
                    << bits_of(expected);
  }
  EXPECT_EQ(f32_wrong, 0);
  Tensor signalling = Tensor::empty(DType::BF16, {1});
  signalling.at<bf16_bits>(0).bits = 0xff81;
  EXPECT_EQ(bits_of(signalling.to(DType::F32).at<float>(0)), 0xffc10000u);

  // And the raw form that callers converting into their own buffers use.
  std::vector<std::uint16_t> raw(static_cast<std::size_t>(n));
  floats_to_bf16(f.data_as<float>(), raw.data(), raw.size());
  EXPECT_EQ(std::memcmp(raw.data(), b.data(), b.nbytes()), 0);
}

// A zeroed tensor's pages are resident only once written: the CPU runner's KV cache is one per
// layer, sized by --max-cache-mib for every sequence at once, and a server holding all of it
// from the start took 9 GB for a 135M model. (Linux: VmRSS from /proc; skipped elsewhere and
// under AddressSanitizer, whose allocator keeps its own accounting.)
TEST(Tensor, ZeroedTensorsTakeMemoryOnlyWhereWritten) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer";
#endif
  const auto resident_mib = []() -> long {
    std::FILE* f = std::fopen("/proc/self/status", "r");
    if (f == nullptr) return -1;
    char line[256];
    long kib = -1;
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
    std::fclose(f);
    return kib < 0 ? -1 : kib / 1024;
  };
  const long before = resident_mib();
  if (before < 0) GTEST_SKIP() << "no /proc/self/status";
  Tensor big = Tensor::empty(DType::F32, {256, 1024, 1024});  // 1 GiB of zeros
  EXPECT_EQ(big.at<float>(123456789), 0.0f);
  float* data = big.data_as<float>();
  for (std::int64_t i = 0; i < 64 * 1024 * 1024; i += 1024) data[i] = 1.0f;  // the first 256 MiB
  const long after = resident_mib();
  EXPECT_LT(after - before, 512) << "MiB resident after writing 256 of 1024";
  EXPECT_GE(after - before, 200) << "MiB resident after writing 256 of 1024";
  EXPECT_EQ(data[64 * 1024 * 1024], 0.0f);
}

}  // namespace
}  // namespace asynct
