// The two attention gates, per score, in the plainest form. The CPU reference uses these
// directly; the GPU kernels implement the same formulas and are tested against them.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace asynct {

enum class GateKind { Async, Softmax };

// AsyncT's gate (SPEC §1). Per query head h:
//   R[j] = max(S[j], 0);   A[j] = (1/W) * sum_{t<W} R[j-t]   (R = 0 left of key 0)
//   P[j] = gamma_h * clamp(alpha_h * (S[j] - sigma_h * A[j]), 0, 1)
struct AsyncGateParams {
  int pool_window = 3;       // W >= 1
  std::vector<float> alpha;  // one per query head
  std::vector<float> sigma;
  std::vector<float> gamma;
};

// Softmax attention with an optional logit softcap S = c * tanh(S / c) (c = 0: none).
struct SoftmaxGateParams {
  float softcap = 0.0f;
};

struct Gate {
  GateKind kind = GateKind::Softmax;
  AsyncGateParams async;
  SoftmaxGateParams softmax;

  static Gate make_async(int num_q_heads, int pool_window = 3, float alpha = 1.0f,
                         float sigma = 1.0f, float gamma = 1.0f) {
    Gate g;
    g.kind = GateKind::Async;
    g.async.pool_window = pool_window;
    g.async.alpha.assign(std::size_t(num_q_heads), alpha);
    g.async.sigma.assign(std::size_t(num_q_heads), sigma);
    g.async.gamma.assign(std::size_t(num_q_heads), gamma);
    return g;
  }
  static Gate make_softmax(float softcap = 0.0f) {
    Gate g;
    g.kind = GateKind::Softmax;
    g.softmax.softcap = softcap;
    return g;
  }
};

// P from a score S and its pooled ReLU A.
inline double async_gate_value(double score, double pooled, double alpha, double sigma,
                               double gamma) {
  return gamma * std::clamp(alpha * (score - sigma * pooled), 0.0, 1.0);
}

// A[j] for j = first + index, from the scores of keys (j - W + 1) .. j. `scores[k]` is the score
// of key `first_scored + k`; keys left of 0 count as R = 0.
inline double async_pooled_relu(const std::vector<double>& scores, int first_scored, int key,
                                int pool_window) {
  double sum = 0.0;
  for (int t = 0; t < pool_window; ++t) {
    int j = key - t;
    if (j < 0) break;
    sum += std::max(scores[std::size_t(j - first_scored)], 0.0);
  }
  return sum / pool_window;
}

inline double softcapped(double score, double softcap) {
  return softcap > 0 ? softcap * std::tanh(score / softcap) : score;
}

}  // namespace asynct
