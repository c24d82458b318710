// UClipNorm/RMSNorm against their formulas, the fused forms against their unfused
// compositions, and neox RoPE against hand cases and its invariants.
#include <cmath>

#include <gtest/gtest.h>

#include "reference/norms.h"
#include "reference/rope.h"
#include "support/compare.h"
#include "support/expect_error.h"
#include "support/random.h"

namespace asynct {
namespace {

using testing::close_to;
using testing::expect_error;
using testing::Random;

TEST(Norm, UClipMatchesHandComputedRow) {
  // x = [3, -4, 0, 1]: mean(x^2) = 26/4 = 6.5, rsqrt(6.5 + 0) = 0.392232...
  // x * r = [1.1767, -1.5689, 0, 0.3922]; clip 1.2 -> [1.1767, -1.2, 0, 0.3922];
  // w = [1, 2, 3, -1] -> [1.1767, -2.4, 0, -0.3922]
  Tensor x = Tensor::from_vector<float>({3, -4, 0, 1}, {1, 4});
  Tensor w = Tensor::from_vector<float>({1, 2, 3, -1}, {4});
  Tensor y = norm(x, w, NormConfig::uclip(0.0f, 1.2f));
  const double r = 1.0 / std::sqrt(6.5);
  EXPECT_NEAR(y.at<float>(0), 3 * r, 1e-6);
  EXPECT_NEAR(y.at<float>(1), -2.4, 1e-6);
  EXPECT_NEAR(y.at<float>(2), 0.0, 1e-7);
  EXPECT_NEAR(y.at<float>(3), -r, 1e-6);
  // Without the clip it is RMSNorm.
  Tensor z = norm(x, w, NormConfig::rms(0.0f));
  EXPECT_NEAR(z.at<float>(1), -4 * r * 2, 1e-6);
}

TEST(Norm, EpsilonEntersUnderTheRoot) {
  Tensor x = Tensor::from_vector<float>({1, 1}, {1, 2});
  Tensor w = Tensor::from_vector<float>({1, 1}, {2});
  EXPECT_NEAR(norm(x, w, NormConfig::rms(3.0f)).at<float>(0), 0.5, 1e-7);  // 1/sqrt(1 + 3)
}

TEST(Norm, UClipEqualsFormulaOnRandomRows) {
  Random rng(1);
  for (int hidden : {1, 7, 128, 2048}) {
    Tensor x = rng.normal({5, hidden}, 3.0f);
    Tensor w = rng.normal({hidden});
    const float eps = 1e-5f, clip = 1.5f;
    Tensor y = norm(x, w, NormConfig::uclip(eps, clip));
    std::vector<float> expected;
    for (int r = 0; r < 5; ++r) {
      double ss = 0;
      for (int i = 0; i < hidden; ++i) ss += std::pow(x.at<float>(r * hidden + i), 2);
      double inv = 1.0 / std::sqrt(ss / hidden + eps);
      for (int i = 0; i < hidden; ++i)
        expected.push_back(float(w.at<float>(i) *
                                 std::fmin(std::fmax(x.at<float>(r * hidden + i) * inv, -clip), clip)));
    }
    EXPECT_TRUE(close_to(y.to_float_vector(), expected, 1e-6)) << "hidden " << hidden;
  }
}

TEST(Norm, FusedAddEqualsAddThenNorm) {
  Random rng(2);
  Tensor x = rng.normal({9, 64}), residual = rng.normal({9, 64}), w = rng.normal({64});
  NormConfig cfg = NormConfig::uclip(1e-6f, 2.0f);
  NormAndResidual fused = fused_add_norm(x, residual, w, cfg);
  Tensor sum = Tensor::empty(DType::F32, {9, 64});
  for (int i = 0; i < 9 * 64; ++i) sum.at<float>(i) = x.at<float>(i) + residual.at<float>(i);
  EXPECT_TRUE(close_to(fused.residual, sum, 0.0));
  EXPECT_TRUE(close_to(fused.out, norm(sum, w, cfg), 0.0));
}

TEST(Norm, PostAttnPreMlpEqualsItsComposition) {
  Random rng(3);
  Tensor attn = rng.normal({9, 64}, 4.0f), residual = rng.normal({9, 64});
  Tensor w_out = rng.normal({64}), w_mlp = rng.normal({64});
  NormConfig cfg = NormConfig::uclip(1e-6f, 1.0f);
  NormAndResidual fused = post_attn_pre_mlp(attn, residual, w_out, w_mlp, cfg);
  Tensor normed = norm(attn, w_out, cfg);
  Tensor h = Tensor::empty(DType::F32, {9, 64});
  for (int i = 0; i < 9 * 64; ++i) h.at<float>(i) = residual.at<float>(i) + normed.at<float>(i);
  EXPECT_TRUE(close_to(fused.residual, h, 0.0));
  EXPECT_TRUE(close_to(fused.out, norm(h, w_mlp, cfg), 0.0));
}

TEST(Norm, BadInputsGiveClearErrors) {
  Tensor x = Tensor::empty(DType::F32, {2, 8});
  expect_error([&] { norm(x, Tensor::empty(DType::F32, {7}), NormConfig{}); },
               "norm: weight: expected shape [8], got [7]");
  expect_error([&] { norm(x.to(DType::BF16), Tensor::empty(DType::F32, {8}), NormConfig{}); },
               "expected float32, got bfloat16[2, 8]");
  expect_error([&] { norm(x, Tensor::empty(DType::F32, {8}), NormConfig::uclip(1e-6f, 0.0f)); },
               "clip must be > 0");
}

TEST(Rope, HandComputedRotation) {
  // head_dim 4, theta 100: f_0 = 1, f_1 = 100^(-1/2) = 0.1. Position 2: angles 2 and 0.2.
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 4}, {1, 1, 4});
  Tensor y = rope_neox(x, {2}, 100.0);
  EXPECT_NEAR(y.at<float>(0), 1 * std::cos(2.0) - 3 * std::sin(2.0), 1e-6);
  EXPECT_NEAR(y.at<float>(1), 2 * std::cos(0.2) - 4 * std::sin(0.2), 1e-6);
  EXPECT_NEAR(y.at<float>(2), 3 * std::cos(2.0) + 1 * std::sin(2.0), 1e-6);
  EXPECT_NEAR(y.at<float>(3), 4 * std::cos(0.2) + 2 * std::sin(0.2), 1e-6);
}

TEST(Rope, PositionZeroIsIdentityAndNormsArePreserved) {
  Random rng(4);
  Tensor x = rng.normal({3, 2, 64});
  EXPECT_TRUE(close_to(rope_neox(x, {0, 0, 0}, 1e6), x, 0.0));
  Tensor y = rope_neox(x, {5, 1000, 70000}, 1e6);
  for (int row = 0; row < 6; ++row) {
    double a = 0, b = 0;
    for (int d = 0; d < 64; ++d) {
      a += std::pow(x.at<float>(row * 64 + d), 2);
      b += std::pow(y.at<float>(row * 64 + d), 2);
    }
    EXPECT_NEAR(a, b, 1e-4 * a);
  }
}

TEST(Rope, RelativePositionOnlyMattersForDotProducts) {
  // <rope(q, m), rope(k, n)> depends on m - n only: the property attention relies on.
  Random rng(5);
  Tensor q = rng.normal({1, 1, 32}), k = rng.normal({1, 1, 32});
  auto dot_at = [&](int m, int n) {
    Tensor a = rope_neox(q, {m}, 1e4), b = rope_neox(k, {n}, 1e4);
    double d = 0;
    for (int i = 0; i < 32; ++i) d += double(a.at<float>(i)) * b.at<float>(i);
    return d;
  };
  EXPECT_NEAR(dot_at(10, 3), dot_at(107, 100), 1e-4);
}

TEST(QkNormRope, EqualsNormThenRopeThenCacheWrite) {
  Random rng(6);
  const int tokens = 5, hq = 4, hkv = 2, dim = 16, block_size = 16;
  Tensor q = rng.normal({tokens, hq, dim}), k = rng.normal({tokens, hkv, dim});
  Tensor v = rng.normal({tokens, hkv, dim});
  Tensor wq = rng.normal({dim}), wk = rng.normal({dim});
  Tensor key_cache = rng.normal({3, block_size, hkv, dim});
  Tensor value_cache = rng.normal({3, block_size, hkv, dim});
  std::vector<std::int64_t> positions = {0, 15, 16, 40, 41};
  std::vector<std::int64_t> slots = {2 * 16 + 0, 2 * 16 + 15, 0 * 16 + 0, 1 * 16 + 8, -1};
  NormConfig cfg = NormConfig::uclip(1e-6f, 1.5f);
  Tensor untouched = value_cache.to(DType::F32);

  QkNormRopeOutput out = qk_norm_rope_cache_write(q, k, v, wq, wk, cfg, positions, 1e6, key_cache,
                                                  value_cache, slots);
  EXPECT_TRUE(close_to(out.q, rope_neox(norm(q, wq, cfg), positions, 1e6), 0.0));
  Tensor expected_k = rope_neox(norm(k, wk, cfg), positions, 1e6);
  EXPECT_TRUE(close_to(out.k, expected_k, 0.0));
  for (std::size_t t = 0; t < slots.size(); ++t) {
    for (int i = 0; i < hkv * dim; ++i) {
      if (slots[t] < 0) continue;
      EXPECT_EQ(key_cache.at<float>(slots[t] * hkv * dim + i), expected_k.at<float>(std::int64_t(t) * hkv * dim + i));
      EXPECT_EQ(value_cache.at<float>(slots[t] * hkv * dim + i), v.at<float>(std::int64_t(t) * hkv * dim + i));
    }
  }
  // The skipped token (slot -1) left the rest of the cache alone: count changed value rows.
  int changed = 0;
  for (int s = 0; s < 3 * block_size; ++s)
    if (value_cache.at<float>(std::int64_t(s) * hkv * dim) != untouched.at<float>(std::int64_t(s) * hkv * dim)) ++changed;
  EXPECT_EQ(changed, 4);
  expect_error([&] { write_kv_cache(key_cache, value_cache, k, v, {0, 1, 2, 3, 48}); },
               "slot 48 of token 4 is past the cache");
}

}  // namespace
}  // namespace asynct
