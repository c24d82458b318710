// Hand-computed cases of the async gate. One sequence, head_dim 8, q = e0 for every row,
// k_j = s_j * e0 and v_j = e_j with scale 1: the score of key j is s_j for every query, and
// output row i is [P_0, ..., P_i, 0, ...], so each entry of O is one gate value.
#include <gtest/gtest.h>

#include "reference/attention.h"

namespace asynct {
namespace {

const std::vector<float> kScores = {0.6f, -0.3f, 0.9f, 0.45f, 1.5f};

// O for 5 queries at positions 0..4 against the 5 keys above.
std::vector<std::vector<double>> gate_rows(const Gate& gate) {
  const int n = int(kScores.size()), dim = 8;
  Tensor q = Tensor::empty(DType::F32, {n, 1, dim});
  Tensor k = Tensor::empty(DType::F32, {n, 1, dim});
  Tensor v = Tensor::empty(DType::F32, {n, 1, dim});
  for (int i = 0; i < n; ++i) {
    q.data_as<float>()[i * dim] = 1.0f;
    k.data_as<float>()[i * dim] = kScores[std::size_t(i)];
    v.data_as<float>()[i * dim + i] = 1.0f;
  }
  KvCache kv = KvCache::contiguous(k, v, {0, n});
  AttentionBatch batch{q, {0, n}, {n}, &kv, 1.0f};
  Tensor o = attention(batch, gate);
  std::vector<std::vector<double>> rows(static_cast<std::size_t>(n), std::vector<double>(static_cast<std::size_t>(n)));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) rows[std::size_t(i)][std::size_t(j)] = o.data_as<float>()[i * dim + j];
  return rows;
}

// Every row i must hold P_0..P_i and zeros after (causality).
void expect_rows(const std::vector<std::vector<double>>& rows, const std::vector<double>& p) {
  for (std::size_t i = 0; i < rows.size(); ++i)
    for (std::size_t j = 0; j < rows.size(); ++j)
      EXPECT_NEAR(rows[i][j], j <= i ? p[j] : 0.0, 1e-6) << "row " << i << " key " << j;
}

TEST(AsyncGate, WindowThreeUnitParameters) {
  // R = [0.6, 0, 0.9, 0.45, 1.5]; A_j averages R_j, R_{j-1}, R_{j-2} with zeros left of key 0.
  // j=0: A = 0.6/3 = 0.2,              S - A = 0.4        -> 0.4
  // j=1: A = (0 + 0.6)/3 = 0.2,        S - A = -0.5       -> 0
  // j=2: A = (0.9 + 0 + 0.6)/3 = 0.5,  S - A = 0.4        -> 0.4
  // j=3: A = (0.45 + 0.9 + 0)/3 = 0.45, S - A = 0         -> 0
  // j=4: A = (1.5 + 0.45 + 0.9)/3 = 0.95, S - A = 0.55    -> 0.55
  expect_rows(gate_rows(Gate::make_async(1, 3)), {0.4, 0.0, 0.4, 0.0, 0.55});
}

TEST(AsyncGate, WindowThreeScaledParameters) {
  // alpha 2, sigma 0.5, gamma 0.8: P = 0.8 * clamp(2 * (S - 0.5 A), 0, 1)
  // j=0: 2 * (0.6 - 0.1) = 1.0 -> 0.8;  j=1: negative -> 0;  j=2: 2 * (0.9 - 0.25) = 1.3 -> 0.8
  // j=3: 2 * (0.45 - 0.225) = 0.45 -> 0.36;  j=4: 2 * (1.5 - 0.475) = 2.05 -> 0.8
  expect_rows(gate_rows(Gate::make_async(1, 3, 2.0f, 0.5f, 0.8f)), {0.8, 0.0, 0.8, 0.36, 0.8});
}

TEST(AsyncGate, WindowTwo) {
  // Unit parameters. j=0: A = 0.6/2 = 0.3 -> 0.3;  j=2: A = (0.9 + 0)/2 -> 0.45;
  // j=3: A = (0.45 + 0.9)/2 = 0.675 -> 0;  j=4: A = (1.5 + 0.45)/2 = 0.975 -> 0.525
  expect_rows(gate_rows(Gate::make_async(1, 2)), {0.3, 0.0, 0.45, 0.0, 0.525});
  // alpha 2, sigma 0.5, gamma 0.8. j=0: 2 * (0.6 - 0.15) = 0.9 -> 0.72;
  // j=2: 2 * (0.9 - 0.225) = 1.35 -> 0.8;  j=3: 2 * (0.45 - 0.3375) = 0.225 -> 0.18;  j=4 -> 0.8
  expect_rows(gate_rows(Gate::make_async(1, 2, 2.0f, 0.5f, 0.8f)), {0.72, 0.0, 0.8, 0.18, 0.8});
}

TEST(AsyncGate, WindowOne) {
  // A = R: with sigma 1 every positive score cancels, so P = 0 everywhere.
  expect_rows(gate_rows(Gate::make_async(1, 1)), {0.0, 0.0, 0.0, 0.0, 0.0});
  // sigma 0.5: P = 0.8 * clamp(2 * 0.5 * S, 0, 1) = 0.8 * clamp(S, 0, 1) for S > 0.
  expect_rows(gate_rows(Gate::make_async(1, 1, 2.0f, 0.5f, 0.8f)), {0.48, 0.0, 0.72, 0.36, 0.8});
}

TEST(AsyncGate, SigmaZeroIsClampedScore) {
  // sigma 0 removes the pool: P = gamma * clamp(alpha * S, 0, 1).
  expect_rows(gate_rows(Gate::make_async(1, 3, 1.0f, 0.0f, 1.0f)), {0.6, 0.0, 0.9, 0.45, 1.0});
}

TEST(AsyncGate, GateValueFormula) {
  EXPECT_DOUBLE_EQ(async_gate_value(0.5, 0.2, 1.0, 1.0, 1.0), 0.3);
  EXPECT_DOUBLE_EQ(async_gate_value(0.5, 0.2, 4.0, 1.0, 0.5), 0.5);   // clamped at 1, times gamma
  EXPECT_DOUBLE_EQ(async_gate_value(-0.5, 0.0, 1.0, 1.0, 1.0), 0.0);  // clamped at 0
  EXPECT_DOUBLE_EQ(async_gate_value(0.5, 0.4, 1.0, 0.5, 2.0), 0.6);
}

TEST(AsyncGate, HeadsUseTheirOwnParameters) {
  // Two query heads sharing one KV head, same scores; head 1 has gamma 0.5.
  const int n = 3, dim = 4;
  Tensor q = Tensor::empty(DType::F32, {n, 2, dim});
  Tensor k = Tensor::empty(DType::F32, {n, 1, dim});
  Tensor v = Tensor::empty(DType::F32, {n, 1, dim});
  for (int i = 0; i < n; ++i) {
    q.data_as<float>()[(i * 2 + 0) * dim] = 1.0f;
    q.data_as<float>()[(i * 2 + 1) * dim] = 1.0f;
    k.data_as<float>()[i * dim] = kScores[std::size_t(i)];
    v.data_as<float>()[i * dim + i] = 1.0f;
  }
  KvCache kv = KvCache::contiguous(k, v, {0, n});
  AttentionBatch batch{q, {0, n}, {n}, &kv, 1.0f};
  Gate gate = Gate::make_async(2, 3);
  gate.async.gamma[1] = 0.5f;
  Tensor o = attention(batch, gate);
  // Last row, key 0: head 0 sees 0.4, head 1 sees 0.2; key 2: 0.4 and 0.2.
  EXPECT_NEAR(o.data_as<float>()[(2 * 2 + 0) * dim + 0], 0.4, 1e-6);
  EXPECT_NEAR(o.data_as<float>()[(2 * 2 + 1) * dim + 0], 0.2, 1e-6);
  EXPECT_NEAR(o.data_as<float>()[(2 * 2 + 0) * dim + 2], 0.4, 1e-6);
  EXPECT_NEAR(o.data_as<float>()[(2 * 2 + 1) * dim + 2], 0.2, 1e-6);
}

}  // namespace
}  // namespace asynct
